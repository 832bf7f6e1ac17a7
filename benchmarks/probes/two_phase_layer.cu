// Probe: how long would a batch-1 decode layer take as two thread-block-cluster kernels instead
// of the engine's five? A go/no-go measurement for a design, not engine code.
//
// The engine's batch-1 layer is a chain of five dependent kernels (normalising QKV GEMV, decode
// attention, output GEMV, normalising MLP-in GEMV, MLP-out GEMV), ~4.6 us each on an H200 for
// gpt2-medium's 1,024-wide layer (benchmarks/README.md, "Where the missed targets' time goes").
// The fewest grid-wide hand-offs a layer can have is two: a head's attention stays inside one
// cluster, and the cross-block sums travel as partials that the next kernel adds:
//
//   A (16 clusters of 8 blocks, a cluster per head): residual = M + the 16 partials of B;
//     LayerNorm; the head's 192 QKV outputs (24 per block); gather them over DSMEM; attention
//     over the block's eighth of the KV cache; combine the 8 (max, sum, o) over DSMEM; the
//     head's slice of the output product (128 columns per block) -> a partial of 1,024 per head.
//   B (16 clusters of BC blocks): M = residual + the 16 partials of A; LayerNorm; the block's
//     MLP-in columns + GELU; its rows of MLP-out -> 1,024 partial sums, reduced over the cluster
//     through DSMEM -> a partial of 1,024 per cluster. BC = 16 (256 blocks of 16 columns, two
//     per SM) or 8 (128 blocks of 32 columns, whose 137 KiB of shared memory allow only 15
//     resident clusters: a second wave).
//
// Each kernel copies its weight share (A: 64 KiB, B/16: 64 KiB, laid out contiguously per block,
// as a converter could store them) and A its KV-cache share into shared memory before its
// programmatic-launch wait, so the weight stream runs under the kernel ahead. The arithmetic is
// real (fp16 data, fp32 math) but unchecked, and leaves out what the engine's layers add (norm
// weights, biases, position handling): the probe times the dependent chain. It replays `layers`
// layers (24: gpt2-medium / bloom-560m) from a CUDA graph, with weights distinct per layer
// (604 MB, far beyond L2). Variants, in one process:
//   pdl            programmatic dependent launch (the design)
//   no-pdl         the same kernels serialised
//   chain          pdl, no weight or KV copies: the dependent chain alone
//   direct         every block reads all 16 partials itself (64 KiB from L2) instead of a
//                  (1024 / cluster size)-column slice, a cluster barrier and a DSMEM gather
//   B/8            B as 16 clusters of 8 (two waves)
//   A + A, B + B   one kernel kind only, twice per layer; both kernels of a layer read that
//                  layer's weights, so the second finds them in L2 (a chain figure, not a
//                  traffic one)
//   idle           kernels that only trigger and wait: the hand-off alone
// plus the floor (26 MB of weights and KV a layer at the measured device-to-device copy
// bandwidth) and block 0's clock64 at marks along each kernel (median over the layers of one
// replay, taken on a re-run of the design and of direct).
//
//   nvcc -arch=sm_90 -O3 -std=c++17 two_phase_layer.cu -o two_phase && ./two_phase [ctx] [layers]
//
// Results and the decision they led to: benchmarks/HISTORY.md, "Measured and dropped: a batch-1
// layer as two cluster kernels".
#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

// The engine's device helpers (CUDA headers only): warp reductions, the programmatic-launch
// wait and trigger, shared-state-space addresses.
#include "../../kernels/common.cuh"

namespace cg = cooperative_groups;
using warpformer::kernels::shared_addr;
using warpformer::kernels::start_next_kernel;
using warpformer::kernels::wait_for_prior_kernels;
using warpformer::kernels::warp_max;
using warpformer::kernels::warp_sum;

#define CHECK(x)                                                                     \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

constexpr int kHidden = 1024, kHeads = 16, kHeadDim = 64, kInter = 4096;
constexpr int kCluster = 8, kBlocks = kHeads * kCluster, kThreads = 256;
constexpr int kQkvPerBlock = 3 * kHeadDim / kCluster;                   // 24
constexpr int kColsPerBlock = kHidden / kCluster;                       // 128
constexpr int kWa = kQkvPerBlock * kHidden + kHeadDim * kColsPerBlock;  // halves per A block
static_assert(kQkvPerBlock == 24, "shapes assumed below");

enum Mode { kFull = 0, kChain = 1, kIdle = 2 };

struct Args {
  const half* wa;    // [layers][kBlocks][kWa]: QKV slice [24][1024], output slice [64][128]
  const half* wb;    // [layers][B's blocks][2][inter per block][1024]: MLP-in, MLP-out slices
  const half* kv;    // [layers][heads][kCluster][2][pos][64]
  half* knew;        // [layers][heads][2][64]: the new position's key and value
  float* pa;         // [heads][1024] A's partials
  float* pb;         // [kHeads clusters][1024] B's partials
  half* r;           // [1024] residual after the MLP (A writes)
  half* m;           // [1024] residual after the attention (B writes)
  int pos;           // KV positions per block
  long long* trace;  // null, or [layers][2 kernels][kMarks]: block 0's clock64 at each mark
  bool direct;       // every block reads all 16 partials itself (no cluster barrier + gather)
};

constexpr int kMarks = 11;

// Block 0's SM cycles since its start at mark i (thread 0; after a block barrier where there is
// one: mark 0 and the direct path's marks 1-2 have none).
__device__ __forceinline__ void mark(const Args& a, int layer, int kernel, int i, long long t0) {
  if (a.trace != nullptr && blockIdx.x == 0 && threadIdx.x == 0) {
    a.trace[(layer * 2 + kernel) * kMarks + i] = clock64() - t0;
  }
}

__device__ __forceinline__ void cp16(void* s, const void* g) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(shared_addr(s)), "l"(g)
               : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
// Split cluster barrier. A release arrive waits for the thread's earlier memory operations
// (global stores included) to be performed, so global stores go after an arrive, never just
// before one.
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_sync() {
  cluster_arrive();
  cluster_wait();
}

// (sum of x, sum of y) over the block (256 threads) in one exchange; red: 16 floats. Not
// common.cuh's block_sum2, whose 32 float2 of scratch would take 192 more bytes a block: at
// context 192 one A block fits beside two B/16 blocks with 392 bytes to spare.
__device__ __forceinline__ float2 block_sum_pair(float x, float y, float* red) {
  x = warp_sum(x);
  y = warp_sum(y);
  if ((threadIdx.x & 31) == 0) {
    red[2 * (threadIdx.x >> 5)] = x;
    red[2 * (threadIdx.x >> 5) + 1] = y;
  }
  __syncthreads();
  float2 t = make_float2(0.f, 0.f);
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) {
    t.x += red[2 * w];
    t.y += red[2 * w + 1];
  }
  return t;
}

// The residual row: base + the 16 partials, formed a (1024 / CS)-column slice per cluster rank
// (256 / kCols threads per column, 16 * kCols / 256 partials each) and gathered over DSMEM into
// row[1024]; LayerNorm (unit gain, zero shift, one-pass statistics) in place. The caller stores
// the slice as the new residual later, after an arrive (see cluster_arrive). Marks 1-3.
template <int CS>
__device__ void residual_norm(const half* base, const float* parts, float* slice, float* row,
                              float* red, const Args& a, int layer, int kernel, long long t0) {
  constexpr int kCols = kHidden / CS;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  if (a.direct) {
    // Columns [4t, 4t + 4) of base + all 16 partials: one round trip, 64 KiB a block from L2.
    const int c = 4 * threadIdx.x;
    const uint2 b = *reinterpret_cast<const uint2*>(base + c);
    const float2 b0 = __half22float2(reinterpret_cast<const half2*>(&b)[0]);
    const float2 b1 = __half22float2(reinterpret_cast<const half2*>(&b)[1]);
    float4 v = make_float4(b0.x, b0.y, b1.x, b1.y);
    float4 p[kHeads];
#pragma unroll
    for (int g = 0; g < kHeads; ++g)
      p[g] = *reinterpret_cast<const float4*>(parts + g * kHidden + c);
#pragma unroll
    for (int g = 0; g < kHeads; ++g) {
      v.x += p[g].x;
      v.y += p[g].y;
      v.z += p[g].z;
      v.w += p[g].w;
    }
    if (c / kCols == rank) *reinterpret_cast<float4*>(slice + c % kCols) = v;
    mark(a, layer, kernel, 1, t0);
    mark(a, layer, kernel, 2, t0);
    const float2 t =
        block_sum_pair(v.x + v.y + v.z + v.w, v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w, red);
    const float mean = t.x * (1.f / kHidden);
    const float rstd = rsqrtf(fmaxf(t.y * (1.f / kHidden) - mean * mean, 0.f) + 1e-5f);
    *reinterpret_cast<float4*>(row + c) = make_float4((v.x - mean) * rstd, (v.y - mean) * rstd,
                                                      (v.z - mean) * rstd, (v.w - mean) * rstd);
    __syncthreads();
    mark(a, layer, kernel, 3, t0);
    return;
  }
  __shared__ float halfsum[kThreads];
  const int col = threadIdx.x % kCols, part = threadIdx.x / kCols;  // part < 256 / kCols
  constexpr int kParts = kThreads / kCols, kPer = kHeads / kParts;
  {
    const int c = rank * kCols + col;
    float s = part == 0 ? __half2float(base[c]) : 0.f;
#pragma unroll
    for (int g = 0; g < kPer; ++g) s += parts[(part * kPer + g) * kHidden + c];
    if (part > 0) halfsum[(part - 1) * kCols + col] = s;
    __syncthreads();
    if (part == 0) {
#pragma unroll
      for (int q = 1; q < kParts; ++q) s += halfsum[(q - 1) * kCols + col];
      slice[col] = s;
    }
  }
  __syncthreads();
  mark(a, layer, kernel, 1, t0);
  cluster_sync();
  mark(a, layer, kernel, 2, t0);
  float sum = 0.f, sq = 0.f;
  for (int i = threadIdx.x; i < kHidden; i += kThreads) {
    const float* peer = cluster.map_shared_rank(slice, i / kCols);
    const float v = peer[i % kCols];
    row[i] = v;
    sum += v;
    sq += v * v;
  }
  const float2 t = block_sum_pair(sum, sq, red);
  const float mean = t.x * (1.f / kHidden);
  const float rstd = rsqrtf(fmaxf(t.y * (1.f / kHidden) - mean * mean, 0.f) + 1e-5f);
  for (int i = threadIdx.x; i < kHidden; i += kThreads) row[i] = (row[i] - mean) * rstd;
  __syncthreads();
  mark(a, layer, kernel, 3, t0);
}

// out[j] = row . w[j][:] for `count` outputs of 1,024-long rows of w in shared memory. Each
// lane keeps its 32 row values (4 chunks of 8) in registers; a warp takes R outputs at a time
// (count / 8 warps: R = 3 for A, 2 for B/16, 4 for B/8) so their shuffles overlap; lane 0
// writes out[j].
template <int R>
__device__ __forceinline__ void dot_rows(const half* w, const float* row, float* out, bool gelu) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float x[32];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float4 r0 = *reinterpret_cast<const float4*>(row + i * 256 + lane * 8);
    const float4 r1 = *reinterpret_cast<const float4*>(row + i * 256 + lane * 8 + 4);
    x[8 * i + 0] = r0.x;
    x[8 * i + 1] = r0.y;
    x[8 * i + 2] = r0.z;
    x[8 * i + 3] = r0.w;
    x[8 * i + 4] = r1.x;
    x[8 * i + 5] = r1.y;
    x[8 * i + 6] = r1.z;
    x[8 * i + 7] = r1.w;
  }
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int j = warp * R + r;
    acc[r] = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint4 v = *reinterpret_cast<const uint4*>(w + j * kHidden + i * 256 + lane * 8);
      const half2* h = reinterpret_cast<const half2*>(&v);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 f = __half22float2(h[e]);
        acc[r] += f.x * x[8 * i + 2 * e] + f.y * x[8 * i + 2 * e + 1];
      }
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
  }
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float v = acc[r];
      out[warp * R + r] =
          gelu ? 0.5f * v * (1.f + tanhf(0.79788456f * (v + 0.044715f * v * v * v))) : v;
    }
  }
}

// At most 80 registers a thread (three blocks per SM): one A block beside two B/16 blocks, so
// the next kernel's blocks can become resident and start their copies. Their shared memory fits
// too at context 192 (392 bytes to spare), not at 512, where A's KV share is larger.
template <int MODE>
__global__ void __launch_bounds__(kThreads, 3) phase_a(Args a, int layer) {
  extern __shared__ __align__(16) unsigned char smem[];
  half* w = reinterpret_cast<half*>(smem);                            // [kWa]
  half* kvs = w + kWa;                                                // [2][pos][64]
  float* row = reinterpret_cast<float*>(kvs + 2 * a.pos * kHeadDim);  // [1024]
  float* slice = row + kHidden;                                       // [128]
  float* qkv = slice + kColsPerBlock;                                 // [24]
  float* qkv_all = qkv + 32;                                          // [192]
  float* part = qkv_all + 3 * kHeadDim;                               // [2 + 64]: max, sum, o
  float* ofin = part + 2 + kHeadDim;                                  // [64]
  float* scores = ofin + kHeadDim;                                    // [pos + 1]
  float* red = scores + a.pos + 1 + 3;                                // [16]

  const long long t0 = clock64();
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int head = blockIdx.x / kCluster;
  if (MODE == kFull) {
    const half* src = a.wa + (static_cast<int64_t>(layer) * kBlocks + blockIdx.x) * kWa;
    for (int i = threadIdx.x; i < kWa / 8; i += kThreads) cp16(w + i * 8, src + i * 8);
    const int kvn = 2 * a.pos * kHeadDim;
    const half* ksrc =
        a.kv + ((static_cast<int64_t>(layer) * kHeads + head) * kCluster + rank) * kvn;
    for (int i = threadIdx.x; i < kvn / 8; i += kThreads) cp16(kvs + i * 8, ksrc + i * 8);
    cp_commit();
  }
  start_next_kernel();
  wait_for_prior_kernels();
  if (MODE == kIdle) {
    if (threadIdx.x == 0) a.pa[blockIdx.x] = 1.f;
    return;
  }
  mark(a, layer, 0, 0, t0);
  residual_norm<kCluster>(a.m, a.pb, slice, row, red, a, layer, 0, t0);
  if (MODE == kFull) cp_wait_all();
  __syncthreads();
  mark(a, layer, 0, 4, t0);
  // The head's QKV outputs: rank r holds q, k, v dims [8r, 8r + 8).
  dot_rows<kQkvPerBlock / 8>(w, row, qkv, false);
  __syncthreads();
  mark(a, layer, 0, 5, t0);
  cluster_sync();
  mark(a, layer, 0, 6, t0);
  if (threadIdx.x < 3 * kHeadDim) {
    const int which = threadIdx.x / kHeadDim, d = threadIdx.x % kHeadDim;
    const float* peer = cluster.map_shared_rank(qkv, d / 8);
    qkv_all[threadIdx.x] = peer[which * 8 + d % 8];
  }
  __syncthreads();
  const float* q = qkv_all;
  // Scores of the block's cached positions, and of the new one on the last rank.
  const int npos = a.pos + (rank == kCluster - 1 ? 1 : 0);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int p = warp; p < npos; p += kThreads / 32) {
    float s;
    if (p < a.pos) {
      const half2 k2 = reinterpret_cast<const half2*>(kvs + p * kHeadDim)[lane];
      const float2 kf = __half22float2(k2);
      s = kf.x * q[2 * lane] + kf.y * q[2 * lane + 1];
    } else {
      s = qkv_all[kHeadDim + 2 * lane] * q[2 * lane] +
          qkv_all[kHeadDim + 2 * lane + 1] * q[2 * lane + 1];
    }
    s = warp_sum(s) * 0.125f;
    if (lane == 0) scores[p] = s;
  }
  __syncthreads();
  if (warp == 0) {
    float mx = -INFINITY;
    for (int p = lane; p < npos; p += 32) mx = fmaxf(mx, scores[p]);
    mx = warp_max(mx);
    float sum = 0.f;
    for (int p = lane; p < npos; p += 32) {
      const float e = __expf(scores[p] - mx);
      scores[p] = e;
      sum += e;
    }
    sum = warp_sum(sum);
    if (lane == 0) {
      part[0] = mx;
      part[1] = sum;
    }
  }
  __syncthreads();
  // o over the block's positions: 4 threads per dimension, each a quarter of the positions.
  {
    const int d = threadIdx.x % kHeadDim, qtr = threadIdx.x / kHeadDim;
    const half* v = kvs + a.pos * kHeadDim;
    float o = 0.f;
    for (int p = qtr; p < a.pos; p += 4) o += scores[p] * __half2float(v[p * kHeadDim + d]);
    if (qtr == 0 && npos > a.pos) o += scores[a.pos] * qkv_all[2 * kHeadDim + d];
    if (qtr > 0) red[16 + (qtr - 1) * kHeadDim + d] = o;
    __syncthreads();
    if (qtr == 0)
      part[2 + d] = o + red[16 + d] + red[16 + kHeadDim + d] + red[16 + 2 * kHeadDim + d];
  }
  __syncthreads();
  mark(a, layer, 0, 7, t0);
  cluster_sync();
  if (threadIdx.x < kHeadDim) {
    float mx = -INFINITY;
#pragma unroll
    for (int r = 0; r < kCluster; ++r) mx = fmaxf(mx, cluster.map_shared_rank(part, r)[0]);
    float sum = 0.f, o = 0.f;
#pragma unroll
    for (int r = 0; r < kCluster; ++r) {
      const float* pr = cluster.map_shared_rank(part, r);
      const float f = __expf(pr[0] - mx);
      sum += pr[1] * f;
      o += pr[2 + threadIdx.x] * f;
    }
    ofin[threadIdx.x] = o / sum;
  }
  cluster_arrive();  // every DSMEM read of this kernel is done: peers may exit after the wait
  __syncthreads();
  mark(a, layer, 0, 8, t0);
  if (threadIdx.x < kColsPerBlock) {
    const half* wo = w + kQkvPerBlock * kHidden;
    float acc = 0.f;
#pragma unroll 8
    for (int d = 0; d < kHeadDim; ++d)
      acc += ofin[d] * __half2float(wo[d * kColsPerBlock + threadIdx.x]);
    a.pa[head * kHidden + rank * kColsPerBlock + threadIdx.x] = acc;
    if (head == 0) a.r[rank * kColsPerBlock + threadIdx.x] = __float2half(slice[threadIdx.x]);
  }
  if (rank == kCluster - 1 && threadIdx.x < 2 * kHeadDim) {
    a.knew[(static_cast<int64_t>(layer) * kHeads + head) * 2 * kHeadDim + threadIdx.x] =
        __float2half(qkv_all[kHeadDim + threadIdx.x]);
  }
  __syncthreads();
  mark(a, layer, 0, 9, t0);
  cluster_wait();
  mark(a, layer, 0, 10, t0);
}

// BC: B's cluster size. 8: 128 blocks of 32 MLP columns (128 KiB of weights, one block per SM);
// 16 (non-portable): 256 blocks of 16 columns (64 KiB, two per SM). Either way 16 clusters.
template <int BC>
struct BShape {
  static constexpr int kBlocksB = kHeads * BC;
  static constexpr int kInterB = kInter / kBlocksB;
  static constexpr int kWbB = 2 * kInterB * kHidden;
  static constexpr int kCols = kHidden / BC;
};

template <int MODE, int BC>
__global__ void __launch_bounds__(kThreads, 3) phase_b(Args a, int layer) {
  using S = BShape<BC>;
  extern __shared__ __align__(16) unsigned char smem[];
  half* w = reinterpret_cast<half*>(smem);             // [kWbB]: w1 [inter][1024], w2 [inter][1024]
  float* row = reinterpret_cast<float*>(w + S::kWbB);  // [1024]
  float* slice = row + kHidden;                        // [kCols]
  float* h = slice + S::kCols;                         // [inter]
  float* part = h + S::kInterB;                        // [1024]
  float* red = part + kHidden;                         // [16]

  const long long t0 = clock64();
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int cid = blockIdx.x / BC;
  if (MODE == kFull) {
    const half* src = a.wb + (static_cast<int64_t>(layer) * S::kBlocksB + blockIdx.x) * S::kWbB;
    for (int i = threadIdx.x; i < S::kWbB / 8; i += kThreads) cp16(w + i * 8, src + i * 8);
    cp_commit();
  }
  start_next_kernel();
  wait_for_prior_kernels();
  if (MODE == kIdle) {
    if (threadIdx.x == 0) a.pb[blockIdx.x] = 1.f;
    return;
  }
  mark(a, layer, 1, 0, t0);
  residual_norm<BC>(a.r, a.pa, slice, row, red, a, layer, 1, t0);
  if (MODE == kFull) cp_wait_all();
  __syncthreads();
  mark(a, layer, 1, 4, t0);
  dot_rows<S::kInterB / 8>(w, row, h, true);
  __syncthreads();
  mark(a, layer, 1, 5, t0);
  // The block's rows of MLP-out: thread t owns columns [4t, 4t + 4).
  const half* w2 = w + S::kInterB * kHidden;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 8
  for (int k = 0; k < S::kInterB; ++k) {
    const uint2 v = *reinterpret_cast<const uint2*>(w2 + k * kHidden + 4 * threadIdx.x);
    const half2* hv = reinterpret_cast<const half2*>(&v);
    const float2 f0 = __half22float2(hv[0]), f1 = __half22float2(hv[1]);
    acc[0] += h[k] * f0.x;
    acc[1] += h[k] * f0.y;
    acc[2] += h[k] * f1.x;
    acc[3] += h[k] * f1.y;
  }
  *reinterpret_cast<float4*>(part + 4 * threadIdx.x) = make_float4(acc[0], acc[1], acc[2], acc[3]);
  __syncthreads();
  mark(a, layer, 1, 6, t0);
  cluster_sync();
  mark(a, layer, 1, 7, t0);
  float sum = 0.f;
  if (threadIdx.x < S::kCols) {
    const int c = rank * S::kCols + threadIdx.x;
#pragma unroll
    for (int r = 0; r < BC; ++r) sum += cluster.map_shared_rank(part, r)[c];
  }
  cluster_arrive();  // every DSMEM read of this kernel is done
  __syncthreads();
  mark(a, layer, 1, 8, t0);
  if (threadIdx.x < S::kCols) {
    const int c = rank * S::kCols + threadIdx.x;
    a.pb[cid * kHidden + c] = sum;
    if (cid == 0) a.m[c] = __float2half(slice[threadIdx.x]);
  }
  __syncthreads();
  mark(a, layer, 1, 9, t0);
  cluster_wait();
  mark(a, layer, 1, 10, t0);
}

size_t smem_a(int pos) {
  return kWa * 2 + 2 * pos * kHeadDim * 2 +
         (kHidden + kColsPerBlock + 32 + 3 * kHeadDim + 2 + 2 * kHeadDim + pos + 1 + 3 + 16 +
          3 * kHeadDim) *
             4 +
         64;
}
template <int BC>
size_t smem_b() {
  using S = BShape<BC>;
  return S::kWbB * 2 + (kHidden + S::kCols + S::kInterB + kHidden + 16) * 4;
}

// A launch of `blocks` blocks in clusters of `cluster` (the cluster attribute), to which
// programmatic() adds programmatic stream serialisation. cfg points into attr: not copyable.
struct ClusterLaunch {
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[2];
  ClusterLaunch(int blocks, int cluster, size_t smem, cudaStream_t s = nullptr) {
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cluster;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
  void programmatic(bool on) {
    attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[1].val.programmaticStreamSerializationAllowed = on ? 1 : 0;
    cfg.numAttrs = 2;
  }
};

template <typename K>
void launch(K kernel, int blocks, int cluster, size_t smem, bool pdl, cudaStream_t s, const Args& a,
            int layer) {
  ClusterLaunch l(blocks, cluster, smem, s);
  l.programmatic(pdl);
  CHECK(cudaLaunchKernelEx(&l.cfg, kernel, a, layer));
}

template <int MODE, int BC>
void prepare(int pos) {
  CHECK(cudaFuncSetAttribute(phase_a<MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             int(smem_a(pos))));
  CHECK(cudaFuncSetAttribute(phase_b<MODE, BC>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             int(smem_b<BC>())));
  if (BC > 8) {
    CHECK(
        cudaFuncSetAttribute(phase_b<MODE, BC>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  }
}

// Median ms of one graph replay of `layers` layers: A then B per layer (which 0), or two A (1)
// or two B (2) kernels per layer.
template <int MODE, int BC>
float time_layers(const Args& a, int layers, bool pdl, cudaStream_t s, int reps, int which) {
  prepare<MODE, BC>(a.pos);
  const size_t sa = smem_a(a.pos), sb = smem_b<BC>();
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int l = 0; l < layers; ++l) {
    for (int half_ = 0; half_ < 2; ++half_) {
      const bool is_a = which == 1 || (which == 0 && half_ == 0);
      if (is_a) {
        launch(phase_a<MODE>, kBlocks, kCluster, sa, pdl, s, a, l);
      } else {
        launch(phase_b<MODE, BC>, BShape<BC>::kBlocksB, BC, sb, pdl, s, a, l);
      }
    }
  }
  CHECK(cudaStreamEndCapture(s, &g));
  CHECK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  std::vector<float> t;
  for (int i = 0; i < reps + 10; ++i) {
    CHECK(cudaEventRecord(e0, s));
    CHECK(cudaGraphLaunch(ge, s));
    CHECK(cudaEventRecord(e1, s));
    CHECK(cudaEventSynchronize(e1));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (i >= 10) t.push_back(ms);
  }
  CHECK(cudaGetLastError());
  std::sort(t.begin(), t.end());
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  CHECK(cudaGraphExecDestroy(ge));
  CHECK(cudaGraphDestroy(g));
  return t[t.size() / 2];
}

template <typename K>
int max_clusters(K kernel, int blocks, int cluster, size_t smem) {
  ClusterLaunch l(blocks, cluster, smem);
  int n = 0;
  CHECK(cudaOccupancyMaxActiveClusters(&n, kernel, &l.cfg));
  return n;
}

int main(int argc, char** argv) {
  const int ctx = argc > 1 ? std::atoi(argv[1]) : 192;  // mean context of a 128 in / 128 out run
  const int layers = argc > 2 ? std::atoi(argv[2]) : 24;
  const int reps = 200;
  const int pos = (ctx + kCluster - 1) / kCluster;
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  const size_t wa_n = size_t(layers) * kBlocks * kWa, wb_n = size_t(layers) * 2 * kInter * kHidden;
  const size_t kv_n = size_t(layers) * kHeads * kCluster * 2 * pos * kHeadDim;
  half *wa, *wb, *kv, *knew, *r, *m;
  float *pa, *pb;
  CHECK(cudaMalloc(&wa, wa_n * 2));
  CHECK(cudaMalloc(&wb, wb_n * 2));
  CHECK(cudaMalloc(&kv, kv_n * 2));
  CHECK(cudaMalloc(&knew, size_t(layers) * kHeads * 2 * kHeadDim * 2));
  CHECK(cudaMalloc(&r, kHidden * 2));
  CHECK(cudaMalloc(&m, kHidden * 2));
  // Room for the idle kernels' one store per block (up to 256 blocks).
  CHECK(cudaMalloc(&pa, kHeads * kHidden * 4));
  CHECK(cudaMalloc(&pb, kHeads * kHidden * 4));
  // Small values (0x1010 as fp16 is ~5e-4) keep every sum finite.
  CHECK(cudaMemset(wa, 0x10, wa_n * 2));
  CHECK(cudaMemset(wb, 0x10, wb_n * 2));
  CHECK(cudaMemset(kv, 0x10, kv_n * 2));
  CHECK(cudaMemset(r, 0, kHidden * 2));
  CHECK(cudaMemset(m, 0x10, kHidden * 2));
  CHECK(cudaMemset(pa, 0, kHeads * kHidden * 4));
  CHECK(cudaMemset(pb, 0, kHeads * kHidden * 4));
  long long* trace;
  CHECK(cudaMalloc(&trace, size_t(layers) * 2 * kMarks * sizeof(long long)));
  Args a{wa, wb, kv, knew, pa, pb, r, m, pos, nullptr, false};

  // Device-to-device copy bandwidth (bytes read + written), as benchmarks/bench_kernels.py.
  const size_t cb = size_t(1) << 30;
  void *c0, *c1;
  CHECK(cudaMalloc(&c0, cb));
  CHECK(cudaMalloc(&c1, cb));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  std::vector<float> ct;
  for (int i = 0; i < 12; ++i) {
    CHECK(cudaEventRecord(e0, s));
    CHECK(cudaMemcpyAsync(c1, c0, cb, cudaMemcpyDeviceToDevice, s));
    CHECK(cudaEventRecord(e1, s));
    CHECK(cudaEventSynchronize(e1));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (i >= 2) ct.push_back(ms);
  }
  std::sort(ct.begin(), ct.end());
  const double copy_gbs = 2.0 * cb / (ct[ct.size() / 2] * 1e-3) / 1e9;
  CHECK(cudaFree(c0));
  CHECK(cudaFree(c1));

  prepare<kFull, 8>(pos);
  prepare<kFull, 16>(pos);
  std::printf(
      "# clusters resident at most (16 needed): A %d (%zu B smem), B/8 %d (%zu B), "
      "B/16 %d (%zu B)\n",
      max_clusters(phase_a<kFull>, kBlocks, kCluster, smem_a(pos)), smem_a(pos),
      max_clusters(phase_b<kFull, 8>, BShape<8>::kBlocksB, 8, smem_b<8>()), smem_b<8>(),
      max_clusters(phase_b<kFull, 16>, BShape<16>::kBlocksB, 16, smem_b<16>()), smem_b<16>());

  struct Row {
    const char* name;
    float ms;
  };
  std::vector<Row> rows;
  rows.push_back(
      {"A + B/16, pdl (the design)", time_layers<kFull, 16>(a, layers, true, s, reps, 0)});
  rows.push_back({"A + B/16, no-pdl", time_layers<kFull, 16>(a, layers, false, s, reps, 0)});
  rows.push_back({"A + B/16, chain (no weight/KV copies)",
                  time_layers<kChain, 16>(a, layers, true, s, reps, 0)});
  rows.push_back(
      {"A + B/8, pdl (B in two waves)", time_layers<kFull, 8>(a, layers, true, s, reps, 0)});
  rows.push_back({"A + A, pdl", time_layers<kFull, 16>(a, layers, true, s, reps, 1)});
  rows.push_back({"A + A, chain", time_layers<kChain, 16>(a, layers, true, s, reps, 1)});
  rows.push_back({"B/16 + B/16, pdl", time_layers<kFull, 16>(a, layers, true, s, reps, 2)});
  rows.push_back({"B/16 + B/16, chain", time_layers<kChain, 16>(a, layers, true, s, reps, 2)});
  Args direct = a;
  direct.direct = true;
  rows.push_back({"A + B/16, pdl, direct partial reads",
                  time_layers<kFull, 16>(direct, layers, true, s, reps, 0)});
  rows.push_back({"A + B/16, chain, direct partial reads",
                  time_layers<kChain, 16>(direct, layers, true, s, reps, 0)});
  rows.push_back({"A + B/16, idle (wait + trigger only)",
                  time_layers<kIdle, 16>(a, layers, true, s, reps, 0)});
  Args traced = a;
  traced.trace = trace;
  CHECK(cudaMemset(trace, 0, size_t(layers) * 2 * kMarks * sizeof(long long)));
  rows.push_back(
      {"A + B/16, pdl, again (traced)", time_layers<kFull, 16>(traced, layers, true, s, reps, 0)});
  std::vector<long long> tr(size_t(layers) * 2 * kMarks), trd(tr.size());
  CHECK(cudaMemcpy(tr.data(), trace, tr.size() * sizeof(long long), cudaMemcpyDeviceToHost));
  traced.direct = true;
  rows.push_back({"A + B/16, pdl, direct, again (traced)",
                  time_layers<kFull, 16>(traced, layers, true, s, reps, 0)});
  CHECK(cudaMemcpy(trd.data(), trace, trd.size() * sizeof(long long), cudaMemcpyDeviceToHost));
  const double bytes = double(kBlocks) * kWa * 2 + 2.0 * kInter * kHidden * 2 +
                       double(kHeads) * kCluster * 2 * pos * kHeadDim * 2;
  const double floor_us = bytes / (copy_gbs * 1e9) * 1e6;

  std::printf(
      "\n## Two-phase batch-1 layer probe: %s, %d layers of gpt2-medium's width, "
      "context %d (%d positions per block)\n\n",
      prop.name, layers, ctx, pos);
  std::printf("copy bandwidth %.0f GB/s; a layer moves %.1f MB (weights + KV), floor %.2f us\n\n",
              copy_gbs, bytes / 1e6, floor_us);
  std::printf(
      "| variant | ms for %d layers | us per layer | us per kernel |\n|---|---:|---:|---:|\n",
      layers);
  for (const Row& row : rows) {
    std::printf("| %s | %.4f | %.2f | %.2f |\n", row.name, row.ms, row.ms * 1e3 / layers,
                row.ms * 1e3 / layers / 2);
  }
  std::printf("| floor (weights + KV / copy bandwidth) | %.4f | %.2f | |\n",
              floor_us * layers / 1e3, floor_us);

  // Block 0's marks, median over the layers of the last traced replay, in us at the SM clock.
  int khz = 0;
  CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  const double us_per_cycle = 1e3 / khz;
  const char* names[2][kMarks] = {
      {"wait returned", "16 partials loaded, slice summed", "cluster barrier",
       "DSMEM gather + norm", "weights/KV landed", "QKV dots", "cluster barrier",
       "q/k/v gather + attention", "combine (cluster barrier + DSMEM)", "output product + stores",
       "exit barrier"},
      {"wait returned", "16 partials loaded, slice summed", "cluster barrier",
       "DSMEM gather + norm", "weights landed", "MLP-in dots + GELU", "MLP-out partials",
       "cluster barrier", "DSMEM reduce", "stores", "exit barrier"}};
  std::printf(
      "\nBlock 0's marks (us since its start at %d MHz, median over layers; the SM clock "
      "may boost above the attribute): cluster gather | direct partial reads\n\n"
      "| kernel | mark | us | step us | us (direct) | step us (direct) |\n"
      "|---|---|---:|---:|---:|---:|\n",
      khz / 1000);
  for (int k = 0; k < 2; ++k) {
    double prev = 0.0, prevd = 0.0;
    for (int i = 0; i < kMarks; ++i) {
      std::vector<long long> v, vd;
      for (int l = 0; l < layers; ++l) {
        v.push_back(tr[(l * 2 + k) * kMarks + i]);
        vd.push_back(trd[(l * 2 + k) * kMarks + i]);
      }
      std::sort(v.begin(), v.end());
      std::sort(vd.begin(), vd.end());
      const double us = v[v.size() / 2] * us_per_cycle, usd = vd[vd.size() / 2] * us_per_cycle;
      std::printf("| %c | %s | %.2f | %.2f | %.2f | %.2f |\n", k == 0 ? 'A' : 'B', names[k][i], us,
                  us - prev, usd, usd - prevd);
      prev = us;
      prevd = usd;
    }
  }
  return 0;
}
