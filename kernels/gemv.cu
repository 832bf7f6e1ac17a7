// Weight-streaming GEMV for decode-sized batches — see gemv.h.
//
// [k, n] weights: a block owns a tile of 8 column vectors (8 x 16 B = 128 contiguous bytes of
// every weight row) and a range of k. Its 256 threads are 32 k-slices x 8 column vectors; a thread
// streams V rows x 16 B per step (V = elements per 16 B) and multiplies them by the V matching
// input elements of each of the M rows, so the input is read as 16-byte vectors too. Partial sums
// are reduced across a warp's 4 slices with shuffles, across the block's 8 warps in shared memory,
// and — when the tiles alone cannot fill the GPU (n small, k large: the attention output and the
// second MLP matrix) — across up to 8 blocks of a thread-block cluster (sm_90): the other ranks
// store their sums into rank 0's shared memory (st.async), completing a transaction barrier
// there, and rank 0 adds them in rank order. One kernel, no workspace, no atomics, and no
// cluster-wide barrier after the products (its release fence waits on the GPU's memory).
//
// A sum of two products (launch_gemv_sum) continues the k range over the second input and
// weight; with second_ready each k-split block takes a share of both, streams the second's
// first and waits for the kernel ahead only between the two shares. A pair of normalised
// products (launch_gemv_normed_pair) appends the second product's column tiles to the first's:
// each block picks its weight, output, epilogue and norm weights by its tile.
//
// [k, n] weights of 3-8 rows of 16-bit values run on tensor cores instead where the shape allows
// (gemv_kn_mma.cuh), [n, k] weights (the lm_head) on kernels of their own (gemv_nk.cuh).
#include <algorithm>
#include <atomic>
#include <cstdint>

#include "kernels/cluster.cuh"
#include "kernels/common.cuh"
#include "kernels/gemv.h"
#include "kernels/gemv_common.cuh"
#include "kernels/gemv_kn_mma.cuh"
#include "kernels/gemv_nk.cuh"

namespace warpformer {
namespace kernels {

using namespace gemv_impl;  // NOLINT(build/namespaces): this file's own implementation headers

namespace {

constexpr int kColVecs = 8;                   // column vectors per [k, n] tile
constexpr int kSlices = kThreads / kColVecs;  // k-slices per block
constexpr int kMaxSplit = 8;                  // portable cluster size
static_assert(kEarlyStartRows == kGemvPreferredRowsKN,
              "the kernels ahead of a GEMV start it early exactly when it runs");

// NORM: the input is normalised by the block itself (normalize_input above; `g` describes the
// norm and p.in is unused). The plain instantiation ignores `g`, a separate argument so that the
// main parameters are addressed alike in both (see decode_attention.cu).
//
// `d` continues the depth for launch_gemv_sum: a second input and weight whose rows follow p's in
// one virtual k (row r of d is k = p.k + r; both depths are multiples of V), which the k-split
// blocks of a tile divide into contiguous chunks. With d.ready each block instead takes a share
// of both depths in whole steps, the shares of d's depth in reverse block order so that the
// blocks' step counts even out (GPT-J's 16 + 64 steps over 5 blocks: 16 each), and streams its
// share of d's first: it waits for the kernel ahead only between the two shares, so every
// block's d share overlaps that kernel.
template <typename T>
struct GemvDepth {
  const T* in = nullptr;      // [m, k]
  const T* weight = nullptr;  // [k, n]
  int k = 0;                  // 0: no second depth
  bool ready = false;         // launch_gemv_sum's second_ready
};

// The column tiles of p's product come first in the grid, then s2's (s2.n == 0: none).
// At 1-2 rows four blocks fit an SM (at most 64 registers a thread): a launch of up to 4 x SMs
// blocks (GPT-J's QKV + MLP-in pair is 448 tiles on 132 SMs) then runs in one wave. Without the
// bound the normalising kernel took 66 registers, three blocks per SM, and the pair's last 52
// blocks ran as a second wave, which lengthened the pair's launch (benchmarks/HISTORY.md, "Figures
// moved from ARCHITECTURE.md (issue 50)"). The plain kernel needs the bound too: its two unrolled
// share loops (second_ready) took it to 126 registers at one row and 151 at two (two blocks per
// SM). Held to 64, neither kernel spills at one row; at two rows the plain one spills 16-24 bytes
// and the normalising one 80-84 (sm_90, fp16 and bf16, nvcc 13, ptxas -v).
template <typename T, int M, bool NORM>
__global__ void __launch_bounds__(kThreads, M <= 2 ? 4 : 1)
    gemv_kn_kernel(const GemvParams<T> p, int ksplit, int kchunk, const GemvNorm<T> g,
                   const GemvDepth<T> d, const GemvSecond<T> s2) {
  constexpr int V = 16 / sizeof(T);
  constexpr int kTileCols = kColVecs * V;
  constexpr int kOut = M * kTileCols;  // a block's outputs, [M][kTileCols]
  __shared__ float red[kWarps][kOut];
  __shared__ __align__(8) uint64_t gather_bar;  // rank 0 of a k-split: the other ranks' sums
  // Dynamic: NORM's normalised input xs [M][kchunk] of T, then on rank 0 of a k-split the other
  // ranks' sums [ksplit - 1][kOut] (kn_dynamic_smem).
  extern __shared__ __align__(16) unsigned char xs_bytes[];
  T* xs = reinterpret_cast<T*>(xs_bytes);
  float* gathered = reinterpret_cast<float*>(xs_bytes + (NORM ? M * kchunk * sizeof(T) : 0));
  kn_split_begin<kOut>(ksplit, &gather_bar);

  // The block's product: p's, or the second one's for the tiles after p's.
  const int tiles1 = (p.n + kTileCols - 1) / kTileCols;
  const bool second = static_cast<int>(blockIdx.x) >= tiles1;
  const int n = second ? s2.n : p.n;
  const T* const wbase = second ? s2.weight : p.weight;
  T* const out = second ? s2.out : p.out;
  const T* const bias = second ? s2.bias : p.bias;
  const Activation act = second ? s2.act : p.act;
  const float beta = second ? 0.f : p.beta;
  const T* const gamma = second && s2.gamma != nullptr ? s2.gamma : g.norm.gamma;
  const T* const nbeta = second && s2.gamma != nullptr ? s2.beta : g.norm.beta;

  const int depth = p.k + d.k;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int c = threadIdx.x % kColVecs, s = threadIdx.x / kColVecs;
  const int col0 = (static_cast<int>(blockIdx.x) - (second ? tiles1 : 0)) * kTileCols;
  const int col = col0 + c * V;
  constexpr int kStep = kSlices * V;  // weight rows a block streams per step
  // [kbeg, kend): the block's rows of the virtual depth, or with d.ready its share of p's depth,
  // streamed after the wait; [kbeg2, kend2): with d.ready its share of d's, streamed before.
  int kbeg = blockIdx.y * kchunk, kend = min(depth, kbeg + kchunk), kbeg2 = 0, kend2 = 0;
  if (d.ready) {
    const int steps = (p.k + kStep - 1) / kStep, steps2 = (d.k + kStep - 1) / kStep;
    const int y = blockIdx.y, y2 = ksplit - 1 - y;
    kbeg = y * steps / ksplit * kStep;
    kend = min(p.k, (y + 1) * steps / ksplit * kStep);
    kbeg2 = p.k + y2 * steps2 / ksplit * kStep;
    kend2 = min(depth, p.k + (y2 + 1) * steps2 / ksplit * kStep);
  }
  const int abeg = d.ready ? kbeg2 : kbeg, aend = d.ready ? kend2 : kend;  // streamed first

  float acc[M][V];
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int e = 0; e < V; ++e) acc[m][e] = 0.f;
  }
  // Row kk of the weight at this thread's columns ([p.weight; d.weight] for a sum).
  auto weight_row = [&](int kk) {
    return kk < p.k ? wbase + col + static_cast<int64_t>(kk) * n
                    : d.weight + col + static_cast<int64_t>(kk - p.k) * n;
  };
  auto load_step = [&](int k0, int4(&wv)[V]) {
    const T* w = weight_row(k0);
#pragma unroll
    for (int i = 0; i < V; ++i) wv[i] = load_stream(w + static_cast<int64_t>(i) * n);
  };
  auto fma_step = [&](int k0, const int4(&wv)[V]) {
    // Input columns k0.. of row 0 and the row stride ([p.in | d.in] for a sum).
    const bool first_in = NORM || k0 < p.k;
    const T* x0 = first_in ? p.in + k0 : d.in + (k0 - p.k);
    const int x_stride = first_in ? p.k : d.k;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float x[V];
      if constexpr (NORM) {
        load_vec<T, V>(xs + m * kchunk + (k0 - kbeg), x);
      } else {
        load_vec<T, V>(x0 + static_cast<int64_t>(m) * x_stride, x);
      }
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const T* wr = reinterpret_cast<const T*>(&wv[i]);
#pragma unroll
        for (int e = 0; e < V; ++e) acc[m][e] = fmaf(x[i], to_float(wr[e]), acc[m][e]);
      }
    }
  };
  auto stream_share = [&](int k1, int end) {
#pragma unroll(M <= 4 ? 2 : 1)
    for (; k1 < end; k1 += kStep) {
      int4 wv[V];
      load_step(k1, wv);
      fma_step(k1, wv);
    }
  };
  // The share bounds and the depths are multiples of V, so a step never crosses one. When the
  // weight is static, the first step's weights are loaded before waiting for the previous
  // kernel, so they stream while it finishes; a block with at most two steps also asks L2 for
  // its second one.
  int k0 = abeg + s * V;
  const bool early = p.prefetch_weight && col < n && k0 < aend;
  int4 first[V];
  if (early) {
    load_step(k0, first);
    if (aend - abeg <= 2 * kStep && k0 + kStep < aend) {
      const T* w = weight_row(k0 + kStep);
#pragma unroll
      for (int i = 0; i < V; ++i) prefetch_l2(w + static_cast<int64_t>(i) * n);
    }
  }
  if constexpr (NORM) {
    // gamma and beta are weights too: ask L1 for this thread's share of them now, so that the
    // normalising pass after the two reductions does not wait on L2.
    if (p.prefetch_weight) {
      for (int kk = kbeg + static_cast<int>(threadIdx.x) * V; kk < kend; kk += kThreads * V) {
        prefetch_l1(gamma + kk);
        if (nbeta != nullptr) prefetch_l1(nbeta + kk);
      }
    }
  }
  if (!p.beside && !d.ready) wait_for_prior_kernels();
  if (!d.ready) start_next_kernel();
  if constexpr (NORM) normalize_input<T, M>(g, gamma, nbeta, p.k, kbeg, kend, kchunk, xs);
  if (col < n) {
    if (early) {
      fma_step(k0, first);
      k0 += kStep;
    }
    stream_share(k0, aend);
  }
  if (d.ready) {  // a sum whose second input is ready: p's share after the wait
    wait_for_prior_kernels();
    start_next_kernel();
    if (col < n) stream_share(kbeg + s * V, kend);
  }

  kn_fold_warps<kColVecs>(acc, red, lane, warp);
  kn_store_sums(red, ksplit, &gather_bar, gathered, [&](int i, float v) {
    const int m = i / kTileCols, cc = col0 + i % kTileCols;
    if (m < p.m && cc < n) {
      const int64_t idx = static_cast<int64_t>(m) * n + cc;
      out[idx] = from_float<T>(finish(v, bias, act, beta, out, idx, cc));
    }
  });
  if (p.beside) wait_for_prior_kernels();  // complete only after the kernel it ran beside
}

struct DeviceInfo {
  int device = 0;  // the ordinal asked about
  int sms = 0;
  bool clusters = false;  // sm_90 hardware and sm_90 code loaded for the kernels
  bool mma = false;       // sm_80+ hardware and code: the [n, k] tensor-core kernel may run
};

DeviceInfo device_info(int device) {
  // The architecture the loaded kernel code was compiled for, asked once (common.cuh).
  static const int arch = code_arch(reinterpret_cast<const void*>(gemv_kn_kernel<float, 1, false>));
  const DeviceCaps caps = device_caps(device);
  return DeviceInfo{device, caps.sms, arch >= 90 && caps.major >= 9, arch >= 80 && caps.major >= 8};
}

// How a [k, n] product is split: column tiles x k-splits of kchunk (a multiple of V) each.
struct KnSplit {
  int tiles, ksplit, kchunk;
};

// Column tiles (p's, then a second product's of n2 columns) and k-splits for depth p.k + d.k.
template <typename T>
KnSplit kn_split(const GemvParams<T>& p, const GemvDepth<T>& dp, const DeviceInfo& d, int n2 = 0) {
  constexpr int V = 16 / sizeof(T);
  const int tiles = ceil_div(p.n, kColVecs * V) + ceil_div(n2, kColVecs * V);
  const int k = p.k + dp.k;
  int ksplit = 1;
  if (d.clusters) {
    // Enough blocks for two per SM, but at least 8 vectors of k per split.
    ksplit = std::min({kMaxSplit, ceil_div(2 * d.sms, tiles), std::max(1, k / (8 * V))});
    ksplit = std::max(ksplit, 1);
  }
  const int kchunk = ceil_div(k / V, ksplit) * V;
  return KnSplit{tiles, ceil_div(k, kchunk), kchunk};  // no empty splits
}

// The [k, n] kernel's dynamic shared memory for m rows: a normalising product's normalised input
// ([m][kchunk] of T), then with a k-split rank 0's room for the other ranks' sums.
template <typename T>
size_t kn_dynamic_smem(const GemvParams<T>& p, const KnSplit& s, bool norm) {
  constexpr int V = 16 / sizeof(T);
  const size_t xs = norm ? static_cast<size_t>(p.m) * s.kchunk * sizeof(T) : 0;
  const size_t outs = static_cast<size_t>(p.m) * kColVecs * V;  // a block's outputs
  return xs + static_cast<size_t>(s.ksplit - 1) * outs * sizeof(float);
}

// The [k, n] kernel's static shared memory for m rows: red, normalize_input's arrays and the
// k-split's barrier.
template <typename T>
size_t kn_static_smem(int m) {
  constexpr int V = 16 / sizeof(T);
  return static_cast<size_t>(kWarps) * m * kColVecs * V * sizeof(float) + norm_prologue_smem(m) +
         sizeof(uint64_t);
}

// Whether a product runs on the [k, n] tensor-core kernel (gemv_kn_mma.cuh): 3-8 rows of a
// 16-bit type, a static split within the portable cluster size, 64-column tiles and k chunks of
// at least 256 rows that divide the shape, a weight of at most kKnMmaMaxWeightBytes, sm_90 code
// and hardware, and not beside the kernel ahead.
template <typename T>
bool kn_mma_eligible(const GemvParams<T>& p, const DeviceInfo& d) {
  if constexpr (sizeof(T) != 2) {
    return false;
  } else {
    if (p.transposed || p.beside || p.m < kMmaMinRows || p.m > kGemvMaxRows || !d.clusters ||
        !d.mma || p.n <= 0 || p.k <= 0 || p.n % kKnMmaCols != 0 || p.k % kKnMmaMinChunk != 0 ||
        static_cast<size_t>(p.k) * p.n * sizeof(T) > kKnMmaMaxWeightBytes) {
      return false;
    }
    return kn_mma_split(p.n, p.k).ksplit <= kKnMmaMaxSplit && aligned_to(p.in, 16) &&
           aligned_to(p.weight, 16);
  }
}

// The most dynamic shared memory a tensor-core launch asks for (1,024-row chunks, a split of 8).
constexpr size_t kKnMmaMaxSmem = kn_mma_smem(KnMmaSplit{0, kKnMmaMaxSplit, kKnMmaMaxChunk});

template <typename T, int M, bool NORM>
cudaError_t launch_kn_mma(const GemvParams<T>& p, const GemvNorm<T>& g, const DeviceInfo& d,
                          cudaStream_t stream) {
  // Opt in to more than 48 KiB of shared memory once per device (a bit per device ordinal).
  static std::atomic<uint64_t> opted{0};
  const uint64_t bit = d.device >= 0 && d.device < 64 ? uint64_t(1) << d.device : 0;
  if (bit == 0 || (opted.load(std::memory_order_acquire) & bit) == 0) {
    const cudaError_t err = cudaFuncSetAttribute(gemv_kn_mma_kernel<T, M, NORM>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 static_cast<int>(kKnMmaMaxSmem));
    if (err != cudaSuccess) return err;
    opted.fetch_or(bit, std::memory_order_acq_rel);
  }
  const KnMmaSplit s = kn_mma_split(p.n, p.k);
  LaunchShape shape;
  shape.block = dim3(kThreads);
  shape.grid = dim3(static_cast<unsigned>(s.tiles), static_cast<unsigned>(s.ksplit), 1);
  shape.cluster_y = static_cast<unsigned>(s.ksplit);
  shape.smem = kn_mma_smem(s);
  return launch_kernel(shape, stream, gemv_kn_mma_kernel<T, M, NORM>, p, s.ksplit, s.kchunk, g);
}

template <typename T, int M, bool NORM>
cudaError_t launch_rows(const GemvParams<T>& p, const GemvNorm<T>& g, const GemvDepth<T>& dp,
                        const GemvSecond<T>& s2, const DeviceInfo& d, cudaStream_t stream) {
  LaunchShape shape;
  shape.block = dim3(kThreads);
  if (p.transposed) {
    if constexpr (sizeof(T) == 2 && M >= kMmaMinRows) {
      if (d.mma) {
        shape.block = dim3(kNkMmaThreads);
        shape.grid =
            dim3(static_cast<unsigned>(ceil_div(p.n, kNkMmaThreads / 32 * kNkMmaTiles * 16)));
        return launch_kernel(shape, stream, gemv_nk_mma_kernel<T, M>, p);
      }
    }
    shape.grid = dim3(static_cast<unsigned>(ceil_div(p.n, kWarps * kRowsPerWarp)));
    return launch_kernel(shape, stream, gemv_nk_kernel<T, M>, p);
  }
  if constexpr (sizeof(T) == 2 && (M >= kMmaMinRows || !NORM)) {
    if (dp.k == 0 && s2.n == 0 && kn_mma_eligible(p, d)) {
      return launch_kn_mma<T, NORM ? M : kGemvMaxRows, NORM>(p, g, d, stream);
    }
  }
  const KnSplit s = kn_split(p, dp, d, s2.n);
  shape.grid = dim3(static_cast<unsigned>(s.tiles), static_cast<unsigned>(s.ksplit), 1);
  shape.cluster_y = static_cast<unsigned>(s.ksplit);
  shape.smem = kn_dynamic_smem(p, s, NORM);
  return launch_kernel(shape, stream, gemv_kn_kernel<T, M, NORM>, p, s.ksplit, s.kchunk, g, dp, s2);
}

template <typename T, bool NORM>
cudaError_t launch_any_rows(const GemvParams<T>& p, const GemvNorm<T>& g, const GemvDepth<T>& dp,
                            int device, cudaStream_t stream,
                            const GemvSecond<T>& s2 = GemvSecond<T>{}) {
  const DeviceInfo d = device_info(device);
  switch (p.m) {
    case 1: return launch_rows<T, 1, NORM>(p, g, dp, s2, d, stream);
    case 2: return launch_rows<T, 2, NORM>(p, g, dp, s2, d, stream);
    case 3: return launch_rows<T, 3, NORM>(p, g, dp, s2, d, stream);
    case 4: return launch_rows<T, 4, NORM>(p, g, dp, s2, d, stream);
    case 5: return launch_rows<T, 5, NORM>(p, g, dp, s2, d, stream);
    case 6: return launch_rows<T, 6, NORM>(p, g, dp, s2, d, stream);
    case 7: return launch_rows<T, 7, NORM>(p, g, dp, s2, d, stream);
    default: return launch_rows<T, 8, NORM>(p, g, dp, s2, d, stream);
  }
}

// Static plus dynamic shared memory of a block, without opting in to more (a little is left for
// the compiler's alignment of the static arrays).
constexpr size_t kMaxBlockSmem = 48 * 1024 - 128;

struct Range {
  const void* ptr;
  size_t bytes;
};

bool overlap(const Range& a, const Range& b) {
  if (a.ptr == nullptr || b.ptr == nullptr) return false;
  const auto a0 = reinterpret_cast<std::uintptr_t>(a.ptr);
  const auto b0 = reinterpret_cast<std::uintptr_t>(b.ptr);
  return a0 < b0 + b.bytes && b0 < a0 + a.bytes;
}

}  // namespace

template <typename T>
bool gemv_supported(const GemvParams<T>& p) {
  constexpr int V = 16 / sizeof(T);
  return p.m >= 1 && p.m <= kGemvMaxRows && p.n > 0 && p.k > 0 && p.k % V == 0 &&
         (p.transposed || p.n % V == 0) && aligned_to(p.in, 16) && aligned_to(p.weight, 16) &&
         p.out != nullptr && !(p.transposed && p.beside);
}

template <typename T>
bool gemv_kn_tensor_cores(const GemvParams<T>& p, int device) {
  return gemv_supported(p) && kn_mma_eligible(p, device_info(device));
}

template <typename T>
cudaError_t launch_gemv(const GemvParams<T>& p, int device, cudaStream_t stream) {
  if (!gemv_supported(p)) return cudaErrorInvalidValue;
  return launch_any_rows<T, false>(p, GemvNorm<T>{}, GemvDepth<T>{}, device, stream);
}

namespace {

// gemv_normed_supported, and with `second` gemv_normed_pair_supported.
template <typename T>
bool normed_supported(const GemvParams<T>& p, const NormParams<T>& norm,
                      const GemvSecond<T>* second, int device) {
  constexpr int V = 16 / sizeof(T);
  GemvParams<T> q = p;
  q.in = norm.input;  // the pointer checks of the plain product apply to the norm's input
  if (norm.input == nullptr || !gemv_supported(q) || p.transposed) return false;
  if ((norm.kind != NormKind::kLayerNorm && norm.kind != NormKind::kRmsNorm) || norm.rows != p.m ||
      norm.hidden != p.k || norm.gamma == nullptr) {
    return false;
  }
  const NormShape ns = norm_shape(norm.hidden, V);
  if (ns.items == 0 || ns.threads > kThreads) return false;  // sums the block cannot reproduce
  const GemvSecond<T> s2 = second != nullptr ? *second : GemvSecond<T>{};
  if (second != nullptr &&
      (p.beta != 0.f || s2.n <= 0 || s2.n % V != 0 || s2.out == nullptr ||
       !aligned_to(s2.weight, 16) || s2.weight == nullptr || !aligned_to(s2.gamma, 16) ||
       !aligned_to(s2.beta, 16) || (s2.beta != nullptr && s2.gamma == nullptr))) {
    return false;
  }
  const bool aligned = aligned_to(norm.residual, 16) && aligned_to(norm.input_bias, 16) &&
                       aligned_to(norm.gamma, 16) && aligned_to(norm.beta, 16) &&
                       aligned_to(norm.residual_out, 16) && aligned_to(norm.out, 16);
  // Some blocks write (the first column tile: residual_out, out; every tile: its product)
  // while others still read the rows for their statistics: no written range may overlap
  // another range (beta != 0 reads the product's range too, which it may share with nothing).
  const size_t row_bytes = static_cast<size_t>(p.m) * p.k * sizeof(T);
  const size_t vec_bytes = static_cast<size_t>(p.k) * sizeof(T);
  const Range written[] = {{norm.residual_out, row_bytes},
                           {norm.out, row_bytes},
                           {p.out, static_cast<size_t>(p.m) * p.n * sizeof(T)},
                           {s2.out, static_cast<size_t>(p.m) * s2.n * sizeof(T)}};
  const Range all[] = {written[0],
                       written[1],
                       written[2],
                       written[3],
                       {norm.input, row_bytes},
                       {norm.residual, row_bytes},
                       {norm.input_bias, vec_bytes},
                       {norm.gamma, vec_bytes},
                       {norm.beta, vec_bytes},
                       {p.weight, static_cast<size_t>(p.k) * p.n * sizeof(T)},
                       {p.bias, static_cast<size_t>(p.n) * sizeof(T)},
                       {s2.weight, static_cast<size_t>(p.k) * s2.n * sizeof(T)},
                       {s2.bias, static_cast<size_t>(s2.n) * sizeof(T)},
                       {s2.gamma, vec_bytes},
                       {s2.beta, vec_bytes}};
  constexpr size_t kWritten = sizeof(written) / sizeof(written[0]);
  bool no_alias = true;
  for (size_t w = 0; w < kWritten; ++w) {
    for (size_t r = 0; r < sizeof(all) / sizeof(all[0]); ++r) {
      if (r != w && overlap(written[w], all[r])) no_alias = false;
    }
  }
  const DeviceInfo info = device_info(device);
  if (second == nullptr && kn_mma_eligible(p, info)) return aligned && no_alias;
  const KnSplit split = kn_split(p, GemvDepth<T>{}, info, s2.n);
  const size_t smem = kn_dynamic_smem(p, split, true) + kn_static_smem<T>(p.m);
  return aligned && no_alias && smem <= kMaxBlockSmem;
}

template <typename T>
GemvNorm<T> gemv_norm(const NormParams<T>& norm) {
  constexpr int V = 16 / sizeof(T);
  return GemvNorm<T>{norm, norm_shape(norm.hidden, V).threads};
}

}  // namespace

template <typename T>
bool gemv_normed_supported(const GemvParams<T>& p, const NormParams<T>& norm, int device) {
  return normed_supported<T>(p, norm, nullptr, device);
}

template <typename T>
cudaError_t launch_gemv_normed(const GemvParams<T>& p, const NormParams<T>& norm, int device,
                               cudaStream_t stream) {
  if (!gemv_normed_supported(p, norm, device)) return cudaErrorInvalidValue;
  return launch_any_rows<T, true>(p, gemv_norm(norm), GemvDepth<T>{}, device, stream);
}

template <typename T>
bool gemv_normed_pair_supported(const GemvParams<T>& p, const NormParams<T>& norm,
                                const GemvSecond<T>& second, int device) {
  return normed_supported(p, norm, &second, device);
}

template <typename T>
cudaError_t launch_gemv_normed_pair(const GemvParams<T>& p, const NormParams<T>& norm,
                                    const GemvSecond<T>& second, int device, cudaStream_t stream) {
  if (!gemv_normed_pair_supported(p, norm, second, device)) return cudaErrorInvalidValue;
  return launch_any_rows<T, true>(p, gemv_norm(norm), GemvDepth<T>{}, device, stream, second);
}

template <typename T>
bool gemv_sum_supported(const GemvParams<T>& p, const T* in2, const T* weight2, int k2) {
  constexpr int V = 16 / sizeof(T);
  // (The depth leaves a step of room below INT32_MAX: second_ready's shares end on whole steps.)
  if (!gemv_supported(p) || p.transposed || p.beside || k2 <= 0 || k2 % V != 0 ||
      !aligned_to(in2, 16) || !aligned_to(weight2, 16) ||
      static_cast<int64_t>(p.k) + k2 > INT32_MAX - kSlices * V) {
    return false;
  }
  // Each block writes only its own outputs (and reads them for beta), but all blocks read both
  // inputs: the output must not overlap either.
  const Range out{p.out, static_cast<size_t>(p.m) * p.n * sizeof(T)};
  return !overlap(out, {p.in, static_cast<size_t>(p.m) * p.k * sizeof(T)}) &&
         !overlap(out, {in2, static_cast<size_t>(p.m) * k2 * sizeof(T)});
}

template <typename T>
cudaError_t launch_gemv_sum(const GemvParams<T>& p, const T* in2, const T* weight2, int k2,
                            int device, cudaStream_t stream, bool second_ready) {
  if (!gemv_sum_supported(p, in2, weight2, k2)) return cudaErrorInvalidValue;
  return launch_any_rows<T, false>(p, GemvNorm<T>{}, GemvDepth<T>{in2, weight2, k2, second_ready},
                                   device, stream);
}

#define WF_GEMV_INSTANTIATE(T)                                                                \
  template bool gemv_supported<T>(const GemvParams<T>&);                                      \
  template bool gemv_kn_tensor_cores<T>(const GemvParams<T>&, int);                           \
  template cudaError_t launch_gemv<T>(const GemvParams<T>&, int, cudaStream_t);               \
  template bool gemv_normed_supported<T>(const GemvParams<T>&, const NormParams<T>&, int);    \
  template cudaError_t launch_gemv_normed<T>(const GemvParams<T>&, const NormParams<T>&, int, \
                                             cudaStream_t);                                   \
  template bool gemv_normed_pair_supported<T>(const GemvParams<T>&, const NormParams<T>&,     \
                                              const GemvSecond<T>&, int);                     \
  template cudaError_t launch_gemv_normed_pair<T>(const GemvParams<T>&, const NormParams<T>&, \
                                                  const GemvSecond<T>&, int, cudaStream_t);   \
  template bool gemv_sum_supported<T>(const GemvParams<T>&, const T*, const T*, int);         \
  template cudaError_t launch_gemv_sum<T>(const GemvParams<T>&, const T*, const T*, int, int, \
                                          cudaStream_t, bool);
WF_GEMV_INSTANTIATE(float)
WF_GEMV_INSTANTIATE(__half)
WF_GEMV_INSTANTIATE(__nv_bfloat16)
#undef WF_GEMV_INSTANTIATE

}  // namespace kernels
}  // namespace warpformer
