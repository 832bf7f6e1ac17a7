// What the GEMV's kernel families share (gemv.cu: [k, n] weights on CUDA cores; gemv_kn_mma.cuh:
// [k, n] weights of 3-8 rows on tensor cores; gemv_nk.cuh: [n, k] weights): the CUDA-core
// kernels' block size, the weights' streaming load, the outputs' epilogue and the normalising
// prologue of launch_gemv_normed. Included by gemv.cu only.
#pragma once

#include <cstdint>

#include "kernels/activation_math.cuh"
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

// The normalising prologue's arguments (launch_gemv_normed): the norm as launch_norm would run
// it, and that launch's threads per row (norm_shape), whose partial sums the block reproduces.
template <typename T>
struct GemvNorm {
  NormParams<T> norm;
  int norm_threads;
};

// The block's share of the normalised input: rows m < M, columns [kbeg, kend) of
// norm(input (+ input_bias) (+ residual)), rounded to T into xs [M][kchunk] (shared memory) exactly
// as launch_norm would write them. The statistics of each row are the norms kernel's: threads
// t < norm_threads form the same per-thread sums over the same vectors, the others add zeros,
// and block_sum2 adds the warp sums alike (the extra warps' zeros change no bits). Blocks of the
// first column tile also write the k-range's x to residual_out and its normalised values to out
// when those are given; they must not alias the inputs, which the other blocks are still reading.
// gamma / beta: the norm weights of the block's product (g.norm's, or a second product's).
template <typename T, int M>
__device__ __forceinline__ void normalize_input(const GemvNorm<T>& g, const T* gamma,
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

}  // namespace gemv_impl
}  // namespace kernels
}  // namespace warpformer
