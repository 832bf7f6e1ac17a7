// Token + position embedding gather (see embedding.h). One block row per token: grid.x covers the
// hidden vectors, grid.y the tokens. Ids and positions are bounds-checked on the device; a bad one
// is recorded (smallest token index wins) and its row zeroed, never read out of bounds.
#include <climits>

#include "kernels/common.cuh"
#include "kernels/embedding.h"

namespace warpformer {
namespace kernels {
namespace {

constexpr int kTokensPerThread = 4;  // loads of several tokens in flight per thread

template <typename T, int VEC>
__device__ __forceinline__ void record_error(const EmbeddingParams<T>& p, int64_t t, bool id_ok,
                                             bool pos_ok) {
  if (p.errors == nullptr) return;
  const int32_t ti = t < INT_MAX ? static_cast<int32_t>(t) : INT_MAX - 1;
  if (!id_ok) atomicMin(&p.errors->bad_token, ti);
  if (!pos_ok) atomicMin(&p.errors->bad_position, ti);
}

template <typename T, int VEC>
__global__ void embedding_kernel(const EmbeddingParams<T> p) {
  const int col = (blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  if (col >= p.hidden) return;
  const int64_t step = static_cast<int64_t>(gridDim.y) * kTokensPerThread;
  for (int64_t t0 = static_cast<int64_t>(blockIdx.y) * kTokensPerThread; t0 < p.tokens;
       t0 += step) {
    float x[kTokensPerThread][VEC];
    float w[kTokensPerThread][VEC];
    bool ok[kTokensPerThread];
#pragma unroll
    for (int k = 0; k < kTokensPerThread; ++k) {
      const int64_t t = t0 + k;
      ok[k] = false;
      if (t >= p.tokens) continue;
      const int32_t id = p.ids[t];
      const bool id_ok = id >= 0 && id < p.vocab;
      int32_t pos = 0;
      bool pos_ok = true;
      if (p.wpe != nullptr) {
        pos = p.positions != nullptr ? p.positions[t] : static_cast<int32_t>(t % p.seq_len);
        pos_ok = pos >= 0 && pos < p.max_positions;
      }
      ok[k] = id_ok && pos_ok;
      if (ok[k]) {
        load_vec<T, VEC>(p.wte + static_cast<int64_t>(id) * p.hidden + col, x[k]);
        if (p.wpe != nullptr) {
          load_vec<T, VEC>(p.wpe + static_cast<int64_t>(pos) * p.hidden + col, w[k]);
        }
      } else if (col == 0) {
        record_error<T, VEC>(p, t, id_ok, pos_ok);
      }
    }
#pragma unroll
    for (int k = 0; k < kTokensPerThread; ++k) {
      const int64_t t = t0 + k;
      if (t >= p.tokens) continue;
      float y[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        y[j] = ok[k] ? x[k][j] * p.scale + (p.wpe != nullptr ? w[k][j] : 0.f) : 0.f;
      }
      store_vec<T, VEC>(p.out + t * p.hidden + col, y);
    }
  }
}

template <typename T, int VEC>
cudaError_t launch_vec(const EmbeddingParams<T>& p, cudaStream_t stream) {
  const int nvec = p.hidden / VEC;
  const int threads = nvec >= 256 ? 256 : ceil_div(nvec, 32) * 32;
  const int64_t groups = (p.tokens + kTokensPerThread - 1) / kTokensPerThread;
  const dim3 grid(ceil_div(nvec, threads), static_cast<unsigned>(groups < 65535 ? groups : 65535));
  embedding_kernel<T, VEC><<<grid, threads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

template <typename T>
cudaError_t launch_embedding(const EmbeddingParams<T>& p, cudaStream_t stream) {
  if (p.tokens < 0 || p.hidden <= 0 || p.vocab <= 0 || p.out == nullptr || p.ids == nullptr ||
      p.wte == nullptr || (p.wpe != nullptr && p.max_positions <= 0) ||
      (p.wpe != nullptr && p.positions == nullptr && p.seq_len <= 0)) {
    return cudaErrorInvalidValue;
  }
  if (p.tokens == 0) return cudaSuccess;
  constexpr int kVec = 16 / sizeof(T);
  const bool vec_ok = p.hidden % kVec == 0 && aligned_to(p.out, 16) && aligned_to(p.wte, 16) &&
                      aligned_to(p.wpe, 16);
  return vec_ok ? launch_vec<T, kVec>(p, stream) : launch_vec<T, 1>(p, stream);
}

template cudaError_t launch_embedding<float>(const EmbeddingParams<float>&, cudaStream_t);
template cudaError_t launch_embedding<__half>(const EmbeddingParams<__half>&, cudaStream_t);
template cudaError_t launch_embedding<__nv_bfloat16>(const EmbeddingParams<__nv_bfloat16>&,
                                                     cudaStream_t);

}  // namespace kernels
}  // namespace warpformer
