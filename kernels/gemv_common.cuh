// What the GEMV's kernel families share (gemv.cu: [k, n] weights on CUDA cores; gemv_kn_mma.cuh:
// [k, n] weights of 3-8 rows on tensor cores; gemv_nk.cuh: [n, k] weights): the CUDA-core
// kernels' block size, the weights' streaming load, the outputs' epilogue and the normalising
// prologue of launch_gemv_normed. Included by gemv.cu only.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/activation_math.cuh"
#include "kernels/cluster.cuh"
#include "kernels/common.cuh"
#include "kernels/gemv.h"
#include "kernels/norm_math.cuh"
#include "kernels/norms.h"

namespace warpformer {
namespace kernels {
namespace gemv_impl {

constexpr int kThreads = 256;  // a block of the CUDA-core kernels
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

__device__ __forceinline__ void prefetch_l1(const void* p) {
  asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
}

// Weights are read exactly once per call: stream them past L1 (evict-first) so they do not push
// the activations and the KV cache out.
__device__ __forceinline__ int4 load_stream(const void* p) {
  return __ldcs(reinterpret_cast<const int4*>(p));
}

// act(v + bias[col]) (+ beta * out[idx]): an output element's epilogue.
template <typename T>
__device__ __forceinline__ float finish(float v, const T* bias, Activation act, float beta,
                                        const T* out, int64_t idx, int col) {
  if (bias != nullptr) v += to_float(bias[col]);
  switch (act) {
    case Activation::kGeluErf: v = activate<Activation::kGeluErf>(v); break;
    case Activation::kGeluTanh: v = activate<Activation::kGeluTanh>(v); break;
    case Activation::kRelu: v = activate<Activation::kRelu>(v); break;
    case Activation::kSilu: v = activate<Activation::kSilu>(v); break;
    default: break;
  }
  if (beta != 0.f) v += beta * to_float(out[idx]);
  return v;
}

template <typename T>
__device__ __forceinline__ float finish(float v, const GemvParams<T>& p, int64_t idx, int col) {
  return finish(v, p.bias, p.act, p.beta, p.out, idx, col);
}

// ---- the [k, n] kernels' tile sums (gemv.cu, gemv_quant.cu) ---------------------------------
// A block of a [k, n] kernel owns kOut = rows x tile columns outputs; its threads are kColVecs
// column vectors of E columns x row slices. In a k-split (ksplit > 1) the launcher makes each
// column tile a (1, ksplit, 1) cluster, blockIdx.y its rank: the other ranks push their block
// sums into rank 0's shared memory, counted by rank 0's transaction barrier, and rank 0 adds them
// in rank order, so the sums are deterministic run to run.

// At the kernel's start: rank 0 of a k-split initialises the barrier for the other ranks' sums,
// and every block arrives at the cluster barrier (kn_store_sums waits on it).
template <int kOut>
__device__ __forceinline__ void kn_split_begin(int ksplit, uint64_t* gather_bar) {
  if (ksplit > 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (blockIdx.y == 0 && threadIdx.x == 0) {
      init_tx_barrier(gather_bar, static_cast<uint32_t>((ksplit - 1) * kOut * sizeof(float)));
    }
    cluster_arrive_relaxed();
#else
    __trap();  // the launchers never split k without sm_90 code
#endif
  }
}

// Lanes l, l + kColVecs, ... of a warp share a column vector: their sums acc[m][e] are folded into
// lane l (< kColVecs), which writes them to its warp's row of red ([warp][m * tile + l * E + e]).
// Followed by a barrier, so that red is complete. lane and warp are the thread's (threadIdx.x
// modulo 32 and divided by 32).
template <int kColVecs, int M, int E, int kOut>
__device__ __forceinline__ void kn_fold_warps(float (&acc)[M][E], float (&red)[kWarps][kOut],
                                              int lane, int warp) {
  constexpr int kTileCols = kColVecs * E;
#pragma unroll
  for (int off = 16; off >= kColVecs; off >>= 1) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
#pragma unroll
      for (int e = 0; e < E; ++e) acc[m][e] += __shfl_xor_sync(0xffffffffu, acc[m][e], off);
    }
  }
  if (lane < kColVecs) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
#pragma unroll
      for (int e = 0; e < E; ++e) red[warp][m * kTileCols + lane * E + e] = acc[m][e];
    }
  }
  __syncthreads();
}

// Each output's total (over the block's warps, and in a k-split over the ranks, added on rank 0)
// handed to store(i, v), i < kOut. `gathered`: rank 0's [ksplit - 1][kOut] floats of dynamic
// shared memory.
template <int kOut, typename Store>
__device__ __forceinline__ void kn_store_sums(const float (&red)[kWarps][kOut], int ksplit,
                                              uint64_t* gather_bar, float* gathered,
                                              Store&& store) {
  // This block's sum of output i over its warps.
  auto block_part = [&](int i) {
    float v = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v += red[w][i];
    return v;
  };
  if (ksplit > 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const unsigned rank = blockIdx.y;
    cluster_wait();  // rank 0's barrier is initialised (and every block has started)
    if (rank != 0) {
      const uint32_t bar = cluster_rank_addr(shared_addr(gather_bar), 0);
      const uint32_t dst = cluster_rank_addr(shared_addr(gathered + (rank - 1) * kOut), 0);
      for (int i = threadIdx.x; i < kOut; i += kThreads) {
        store_to_rank(dst + i * static_cast<uint32_t>(sizeof(float)), block_part(i), bar);
      }
    } else {
      constexpr int kPer = (kOut + kThreads - 1) / kThreads;
      float own[kPer];
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const int i = threadIdx.x + j * kThreads;
        own[j] = i < kOut ? block_part(i) : 0.f;
      }
      wait_tx_barrier(gather_bar);
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const int i = threadIdx.x + j * kThreads;
        if (i < kOut) {
          float v = 0.f;
          v += own[j];  // from 0 as before the push: a -0 sum still stores +0
          for (int r = 1; r < ksplit; ++r) v += gathered[(r - 1) * kOut + i];
          store(i, v);
        }
      }
    }
#endif
  } else {
    for (int i = threadIdx.x; i < kOut; i += kThreads) store(i, block_part(i));
  }
}

// The normalising prologue's arguments (launch_gemv_normed): the norm as launch_norm would run
// it, and that launch's threads per row (norm_shape), whose partial sums the block reproduces.
template <typename T>
struct GemvNorm {
  NormParams<T> norm;
  int norm_threads;
};

// normalize_input's shared memory: one row, block_sum2's scratch and the shift; more, per-row
// warp sums, shifts, statistics and second-pass flags.
// Each array is counted with 16 bytes of alignment padding (ptxas places them on aligned
// boundaries; kn_static_smem must not come out under what the kernel declares).
constexpr size_t norm_prologue_smem(int m) {
  return m == 1 ? 32 * sizeof(float2) + sizeof(float) + 2 * 16
                : static_cast<size_t>(m) *
                          (kWarps * sizeof(float2) + sizeof(float) + sizeof(float2) + sizeof(int)) +
                      4 * 16;
}

// The block's share of the normalised input: rows m < M (2 or more), columns [kbeg, kend) of
// norm(input (+ input_bias) (+ residual)), rounded to T into xs [M][kchunk] (shared memory) exactly
// as launch_norm would write them.
//
// The statistics are the norms kernel's bit for bit, for all M rows at once. The block splits
// into row groups of norm_threads threads (as many as fit, up to M); thread t of a group forms,
// for each of its rows, the sums launch_norm's thread t forms over the same vectors, and each
// warp sums its threads by the same xor tree. Warp m then adds row m's warp sums as block_sum2's
// second level does (lanes past the group's warps add zeros, as the norms kernel's lanes past its
// warps do). So the block pays two barriers for all rows, where reducing row after row cost M
// pairs, and one load round trip for each row's first norm_threads vectors (rows longer than
// that read the rest row after row, as the norms kernel's threads read theirs). The rows whose
// statistics ask for the second pass (row_stats' refine) take it together the same way, about their
// first-pass means.
//
// Blocks of the first column tile also write the k-range's x to residual_out and its normalised
// values to out when those are given; they must not alias the inputs, which the other blocks are
// still reading. gamma / beta: the norm weights of the block's product (g.norm's, or a second
// product's).
template <typename T, int M>
__device__ __forceinline__ void normalize_rows(const GemvNorm<T>& g, const T* gamma, const T* beta,
                                               int k, int kbeg, int kend, int kchunk, T* xs) {
  static_assert(M >= 2, "one row: normalize_each_row");
  static_assert(M <= kWarps, "warp m finishes row m");
  constexpr int V = 16 / sizeof(T);
  __shared__ float2 part[M * kWarps];  // [row][warp of its group]
  __shared__ float shift_s[M];
  __shared__ float2 stats_s[M];  // (mean, rstd)
  __shared__ int refine_s[M];
  const NormParams<T>& nm = g.norm;
  const int nvec = k / V;
  const bool layer_norm = nm.kind == NormKind::kLayerNorm;
  const float inv_n = 1.f / static_cast<float>(k);
  const int nt = g.norm_threads;  // a multiple of 32, at most kThreads (normed_supported)
  const int group_warps = nt / 32;
  const int tid = static_cast<int>(threadIdx.x);
  const int groups = kThreads / nt < M ? kThreads / nt : M;
  const int group = tid / nt, t = tid % nt;
  const int warp = tid / 32, lane = tid % 32;
  const bool in_group = group < groups;
  const bool loads = in_group && t < nvec;
  auto row_of = [&](int i) { return group + i * groups; };  // the group's i-th row

  // 1. Each thread's first vector of each of its rows, all loads in flight together; LayerNorm's
  // shift of a row is the mean of its first vector, which the group's thread 0 holds.
  float x[M][V];
#pragma unroll
  for (int i = 0; i < M; ++i) {
    if (loads && row_of(i) < M) {
      norm::load_x<T, V>(nm, static_cast<int64_t>(row_of(i)) * k, t * V, x[i]);
    }
  }
  if (layer_norm) {
    if (in_group && t == 0) {
#pragma unroll
      for (int i = 0; i < M; ++i) {
        if (row_of(i) < M) shift_s[row_of(i)] = norm::vector_mean<V>(x[i]);
      }
    }
    __syncthreads();
  }

  // 2. A pass over every row at once: each thread's sums of x - shift(m) over its vectors of
  // each of its rows (the first from registers when from_regs, else read again), each warp's
  // sums by warp_sum2, then warp m adds row m's warp sums as block_sum2's second level does and
  // hands the totals to finish(m, totals). Rows for which take(m) is false are skipped.
  constexpr bool kHeld = M >= 3;  // the first vectors stay in registers to the end (step 5)
  auto pass = [&](auto from_regs, auto shift_of, auto take, auto finish) {
#pragma unroll
    for (int i = 0; i < M; ++i) {
      const int m = row_of(i);
      // Uniform over the warp (groups are whole warps), as warp_sum2 needs.
      if (!in_group || m >= M || !take(m)) continue;
      const float shift = shift_of(m);
      const int64_t row_off = static_cast<int64_t>(m) * k;
      float sum = 0.f, sq = 0.f;
      if (loads) {
        float y[V];
        if constexpr (decltype(from_regs)::value) {
#pragma unroll
          for (int j = 0; j < V; ++j) y[j] = x[i][j];
        } else {
          norm::load_x<T, V>(nm, row_off, t * V, y);
        }
#pragma unroll
        for (int j = 0; j < V; ++j) norm::accumulate(sum, sq, y[j], shift);
        for (int v = t + nt; v < nvec; v += nt) {
          norm::load_x<T, V>(nm, row_off, v * V, y);
#pragma unroll
          for (int j = 0; j < V; ++j) norm::accumulate(sum, sq, y[j], shift);
        }
      }
      const float2 w = warp_sum2(make_float2(sum, sq));
      if (lane == 0) part[m * kWarps + (t / 32)] = w;
    }
    __syncthreads();
    if (warp < M && take(warp)) {
      const float2 tot =
          warp_sum2(lane < group_warps ? part[warp * kWarps + lane] : make_float2(0.f, 0.f));
      if (lane == 0) finish(warp, tot);
    }
    __syncthreads();
  };

  // 3. The statistics of every row (row_stats' arithmetic on the totals).
  pass(
      std::true_type{}, [&](int m) { return layer_norm ? shift_s[m] : 0.f; },
      [](int) { return true; },
      [&](int m, float2 tot) {
        const float shift = layer_norm ? shift_s[m] : 0.f;
        const norm::RowStats st = norm::stats_of_totals(layer_norm, shift, tot, inv_n, nm.eps);
        stats_s[m] = make_float2(st.mean, st.rstd);
        refine_s[m] = st.refine ? 1 : 0;
      });

  // 4. The rare second pass (refine_stats) of the rows that ask for it, all at once, about their
  // first-pass means.
  bool any_refine = false;
#pragma unroll
  for (int m = 0; m < M; ++m) any_refine |= refine_s[m] != 0;
  if (__builtin_expect(any_refine, 0)) {
    pass(
        std::bool_constant<kHeld>{}, [&](int m) { return stats_s[m].x; },
        [&](int m) { return refine_s[m] != 0; },
        [&](int m, float2 tot) {
          norm::RowStats st{stats_s[m].x, stats_s[m].y, true};
          norm::refine_of_totals(st, tot, inv_n, nm.eps);
          stats_s[m] = make_float2(st.mean, st.rstd);
        });
  }

  // 5. The block's columns of every row, normalised. From 3 rows (the tensor-core kernel, and
  // the CUDA-core kernel's fp32 and large-weight launches, which have the registers) each
  // row's first norm_threads vectors are still in the registers of the threads that summed them
  // (step 1), so only the vectors past them (rows longer than norm_threads vectors) are read
  // again, spread over the block. At 2 rows (the CUDA-core kernel, whose registers hold its
  // first weight loads here) holding them costs spills that outweigh the read: every vector of
  // the block's columns is read again (benchmarks/HISTORY.md, "The normalising prologue forms
  // every row's statistics at once").
  const bool writer = blockIdx.x == 0;
  auto emit = [&](int m, int c, const float (&xv)[V]) {
    const int64_t row_off = static_cast<int64_t>(m) * k;
    const float2 st = stats_s[m];
    float y[V];
    norm::normalize<T, V>(nm.kind, gamma, beta, c, xv, st.x, st.y, y);
    store_vec<T, V>(xs + m * kchunk + (c - kbeg), y);
    if (writer && nm.residual_out != nullptr) store_vec<T, V>(nm.residual_out + row_off + c, xv);
    if (writer && nm.out != nullptr) store_vec<T, V>(nm.out + row_off + c, y);
  };
  if (kHeld && loads && t * V >= kbeg && t * V < kend) {
#pragma unroll
    for (int i = 0; i < M; ++i) {
      if (row_of(i) < M) emit(row_of(i), t * V, x[i]);
    }
  }
  const int held = kHeld ? nt : 0;                     // vectors per row held in registers
  const int vbeg = kbeg / V > held ? kbeg / V : held;  // the first vector not held
  const int cvec = kend / V - vbeg;
  for (int e = tid; e < M * cvec; e += kThreads) {
    const int m = e / cvec, c = (vbeg + e - m * cvec) * V;
    float xv[V];
    norm::load_x<T, V>(nm, static_cast<int64_t>(m) * k, c, xv);
    emit(m, c, xv);
  }
  __syncthreads();
}

// normalize_rows' contract, one row after another: each row's statistics are the norms kernel's
// own structure, one block reduction (block_sum2; the threads past norm_threads add zeros, which
// change no bits) and a second pass when they ask for it. normalize_input runs it for one row
// (the CUDA-core kernel's batch-1 decode), where there are no row groups to form. In this form
// (the row loop kept rolled) the CUDA-core kernel compiles without spills at its 64 registers; a
// flat one-row version spilled 32 bytes of the first weight loads, whose stores then waited on
// those loads ahead of the programmatic-launch wait and slowed batch-1 decode steps
// (benchmarks/HISTORY.md, "The normalising prologue forms every row's statistics at once").
template <typename T, int M>
__device__ __forceinline__ void normalize_each_row(const GemvNorm<T>& g, const T* gamma,
                                                   const T* beta, int k, int kbeg, int kend,
                                                   int kchunk, T* xs) {
  constexpr int V = 16 / sizeof(T);
  __shared__ float2 scratch[32];
  const NormParams<T>& nm = g.norm;
  const int nvec = k / V;
  const bool layer_norm = nm.kind == NormKind::kLayerNorm;
  const float inv_n = 1.f / static_cast<float>(k);
  const bool writer = blockIdx.x == 0;
#pragma unroll 1
  for (int m = 0; m < M; ++m) {
    const int64_t row_off = static_cast<int64_t>(m) * k;
    // The shift is the mean of the row's first vector (norms.cu): thread 0's, shared through
    // shared memory (no round trip of its own).
    __shared__ float shift_s;
    const bool loads = threadIdx.x < g.norm_threads && static_cast<int>(threadIdx.x) < nvec;
    float x[V];
    if (loads) norm::load_x<T, V>(nm, row_off, threadIdx.x * V, x);
    const float shift =
        layer_norm ? norm::from_thread0([&] { return norm::vector_mean<V>(x); }, &shift_s) : 0.f;
    float sum = 0.f, sq = 0.f;
    if (loads) {
#pragma unroll
      for (int j = 0; j < V; ++j) norm::accumulate(sum, sq, x[j], shift);
      for (int v = threadIdx.x + g.norm_threads; v < nvec; v += g.norm_threads) {
        norm::load_x<T, V>(nm, row_off, v * V, x);
#pragma unroll
        for (int j = 0; j < V; ++j) norm::accumulate(sum, sq, x[j], shift);
      }
    }
    norm::RowStats st = norm::row_stats(layer_norm, shift, sum, sq, inv_n, nm.eps, scratch);
    if (__builtin_expect(st.refine, 0)) {
      float sum2 = 0.f, sq2 = 0.f;
      if (threadIdx.x < g.norm_threads) {
        for (int v = threadIdx.x; v < nvec; v += g.norm_threads) {
          norm::load_x<T, V>(nm, row_off, v * V, x);
#pragma unroll
          for (int j = 0; j < V; ++j) norm::accumulate(sum2, sq2, x[j], st.mean);
        }
      }
      norm::refine_stats(st, sum2, sq2, inv_n, nm.eps, scratch);
    }
    const float mean = st.mean, rstd = st.rstd;
    for (int c = kbeg + threadIdx.x * V; c < kend; c += kThreads * V) {
      float x[V], y[V];
      norm::load_x<T, V>(nm, row_off, c, x);
      norm::normalize<T, V>(nm.kind, gamma, beta, c, x, mean, rstd, y);
      store_vec<T, V>(xs + m * kchunk + (c - kbeg), y);
      if (writer && nm.residual_out != nullptr) store_vec<T, V>(nm.residual_out + row_off + c, x);
      if (writer && nm.out != nullptr) store_vec<T, V>(nm.out + row_off + c, y);
    }
  }
  __syncthreads();
}

// The block's share of the normalised input (normalize_rows; one row: normalize_each_row).
template <typename T, int M>
__device__ __forceinline__ void normalize_input(const GemvNorm<T>& g, const T* gamma, const T* beta,
                                                int k, int kbeg, int kend, int kchunk, T* xs) {
  if constexpr (M == 1) {
    normalize_each_row<T, 1>(g, gamma, beta, k, kbeg, kend, kchunk, xs);
  } else {
    normalize_rows<T, M>(g, gamma, beta, k, kbeg, kend, kchunk, xs);
  }
}

}  // namespace gemv_impl
}  // namespace kernels
}  // namespace warpformer
