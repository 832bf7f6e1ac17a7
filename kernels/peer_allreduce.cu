// The one-shot peer all-reduce kernel (see peer_allreduce.h for the protocol).
#include "kernels/peer_allreduce.h"

#include <cstdio>

#include "kernels/common.cuh"

namespace warpformer {
namespace kernels {
namespace {

constexpr int kThreads = 512;
// Messages up to this many bytes per block use one block per this many bytes; larger ones fill
// all kPeerMaxBlocks slots.
constexpr int64_t kBytesPerBlock = 16 * 1024;

struct PeerBuffers {
  char* p[kPeerMaxRanks];
};

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ void store_release_sys(uint32_t* addr, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(addr), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* addr) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(addr) : "memory");
  return v;
}

__device__ __forceinline__ uint32_t* flag_at(char* buffer, int block, int from_rank) {
  return reinterpret_cast<uint32_t*>(buffer) + block * kPeerMaxRanks + from_rank;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    peer_allreduce_kernel(T* data, int64_t count, int64_t per_block, PeerBuffers bufs,
                          uint32_t* sequence, int rank, int ranks, uint64_t timeout_ns,
                          bool start_next_early) {
  wait_for_prior_kernels();
  if (start_next_early) start_next_kernel();
  constexpr int N = 16 / sizeof(T);
  const int b = blockIdx.x;
  const int64_t begin = static_cast<int64_t>(b) * per_block;
  const int64_t len = max(int64_t{0}, min(count - begin, per_block));

  __shared__ uint32_t s_call;
  if (threadIdx.x == 0) {
    s_call = sequence[b] + 1;
    sequence[b] = s_call;
  }
  __syncthreads();
  const uint32_t call = s_call;
  const int64_t slot = kPeerDataOffset + (call & 1u) * kPeerMaxBytes + b * kPeerSlotBytes;

  // 1. This rank's slice into its own slot.
  T* mine = reinterpret_cast<T*>(bufs.p[rank] + slot);
  const T* src = data + begin;
  const int64_t nvec = len / N;
  for (int64_t i = threadIdx.x; i < nvec; i += kThreads) {
    reinterpret_cast<int4*>(mine)[i] = reinterpret_cast<const int4*>(src)[i];
  }
  for (int64_t i = nvec * N + threadIdx.x; i < len; i += kThreads) mine[i] = src[i];
  __syncthreads();

  // 2 + 3. Thread r tells rank r that this slot is ready, then waits for rank r's slot.
  if (threadIdx.x < ranks) {
    const int r = threadIdx.x;
    __threadfence_system();
    store_release_sys(flag_at(bufs.p[r], b, rank), call);
    const uint32_t* from_r = flag_at(bufs.p[rank], b, r);
    const uint64_t start = global_ns();
    // Peers are at most one call ahead; the signed difference survives counter wrap-around.
    while (static_cast<int32_t>(load_acquire_sys(from_r) - call) < 0) {
      if (global_ns() - start > timeout_ns) {
        printf(
            "warpformer peer all-reduce: rank %d (block %d, call %u) waited more than %llu s "
            "for rank %d; that rank stopped calling or died\n",
            rank, b, call, static_cast<unsigned long long>(timeout_ns / 1000000000ull), r);
        __trap();
      }
    }
  }
  __syncthreads();

  // 4. Sum slice b over the ranks in rank order (identical on every rank), in place.
  T* dst = data + begin;
  for (int64_t i = threadIdx.x; i < nvec; i += kThreads) {
    float acc[N] = {};
    for (int r = 0; r < ranks; ++r) {
      const int4 raw = __ldcg(reinterpret_cast<const int4*>(bufs.p[r] + slot) + i);
      const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int j = 0; j < N; ++j) acc[j] += to_float(v[j]);
    }
    store_vec<T, N>(dst + i * N, acc);
  }
  for (int64_t i = nvec * N + threadIdx.x; i < len; i += kThreads) {
    float acc = 0.f;
    for (int r = 0; r < ranks; ++r) {
      acc += to_float(__ldcg(reinterpret_cast<const T*>(bufs.p[r] + slot) + i));
    }
    dst[i] = from_float<T>(acc);
  }
}

// Validates the parameters and splits the message over the blocks: false when they cannot run
// (bad ranks, unaligned data, or more than the slots hold).
template <typename T>
bool plan(const PeerAllReduceParams<T>& p, int* blocks, int64_t* per_block) {
  if (p.ranks < 2 || p.ranks > kPeerMaxRanks || p.rank < 0 || p.rank >= p.ranks ||
      p.sequence == nullptr || !aligned_to(p.data, 16)) {
    return false;
  }
  constexpr int64_t vec = 16 / sizeof(T);
  const int64_t bytes = p.count * static_cast<int64_t>(sizeof(T));
  if (p.count <= 0 || bytes > kPeerMaxBytes) return false;
  const int64_t g =
      std::min<int64_t>(kPeerMaxBlocks, (bytes + kBytesPerBlock - 1) / kBytesPerBlock);
  int64_t per = (p.count + g - 1) / g;
  per = (per + vec - 1) / vec * vec;
  if (per * static_cast<int64_t>(sizeof(T)) > kPeerSlotBytes) return false;
  *blocks = static_cast<int>((p.count + per - 1) / per);
  *per_block = per;
  return true;
}

}  // namespace

template <typename T>
bool peer_allreduce_supported(const PeerAllReduceParams<T>& p) {
  int blocks = 0;
  int64_t per = 0;
  return plan(p, &blocks, &per);
}

template <typename T>
cudaError_t launch_peer_allreduce(const PeerAllReduceParams<T>& p, cudaStream_t stream) {
  int blocks = 0;
  int64_t per = 0;
  if (!plan(p, &blocks, &per)) return cudaErrorInvalidValue;
  PeerBuffers bufs{};
  for (int r = 0; r < p.ranks; ++r) {
    if (p.buffers[r] == nullptr) return cudaErrorInvalidValue;
    bufs.p[r] = p.buffers[r];
  }
  LaunchShape shape;
  shape.grid = dim3(blocks);
  shape.block = dim3(kThreads);
  return launch_kernel(shape, stream, peer_allreduce_kernel<T>, p.data, p.count, per, bufs,
                       p.sequence, p.rank, p.ranks, p.timeout_ns, p.start_next_early);
}

#define WF_PEER_INSTANTIATE(T)                                              \
  template bool peer_allreduce_supported<T>(const PeerAllReduceParams<T>&); \
  template cudaError_t launch_peer_allreduce<T>(const PeerAllReduceParams<T>&, cudaStream_t);
WF_PEER_INSTANTIATE(float)
WF_PEER_INSTANTIATE(__half)
WF_PEER_INSTANTIATE(__nv_bfloat16)
#undef WF_PEER_INSTANTIATE

}  // namespace kernels
}  // namespace warpformer
