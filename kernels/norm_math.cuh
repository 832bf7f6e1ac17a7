// The arithmetic of LayerNorm / RMSNorm (kernels/norms.h) shared by the norms kernel and the
// GEMV's normalising prologue (launch_gemv_normed), so that a product of a normalised input gives
// the same bits whether the norm ran as its own kernel or inside the GEMV. Every rounding that
// could differ between two kernels is explicit (no FMA contraction is left to the compiler).
// Included only from .cu files.
#pragma once

#include "kernels/common.cuh"
#include "kernels/norms.h"

namespace warpformer {
namespace kernels {
namespace norm {

// x = input (+ input_bias) (+ residual) for VEC elements of a row, in that order of adds.
template <typename T, int VEC>
__device__ __forceinline__ void load_x(const NormParams<T>& p, int64_t row_off, int col,
                                       float (&x)[VEC]) {
  load_vec<T, VEC>(p.input + row_off + col, x);
  if (p.input_bias != nullptr) {
    float b[VEC];
    load_vec<T, VEC>(p.input_bias + col, b);
#pragma unroll
    for (int j = 0; j < VEC; ++j) x[j] += b[j];
  }
  if (p.residual != nullptr) {
    float r[VEC];
    load_vec<T, VEC>(p.residual + row_off + col, r);
#pragma unroll
    for (int j = 0; j < VEC; ++j) x[j] += r[j];
  }
}

// Thread 0's f(), for every thread of the block: LayerNorm's shift, which thread 0 computes from
// the first vector it has loaded, without a global round trip of its own. Only thread 0 calls f
// (the other threads' vectors may be unloaded). `slot` is a __shared__ float of the caller's; a
// barrier.
template <typename F>
__device__ __forceinline__ float from_thread0(F f, float* slot) {
  if (threadIdx.x == 0) *slot = f();
  __syncthreads();
  return *slot;
}

// LayerNorm's shift: the mean of the row's first vector (VEC elements, a power of two). The
// sums run over x - shift so that a large common offset of the residual stream does not eat the
// fp32 sums' precision. A mean of VEC elements lies closer to the row's mean than x[0] alone,
// so fewer ordinary rows need row_stats' second pass (an outlier among the first columns still
// does).
template <int VEC>
__device__ __forceinline__ float vector_mean(const float (&x)[VEC]) {
  static_assert((VEC & (VEC - 1)) == 0, "VEC is a power of two");
  float t[VEC];  // pairwise: log2(VEC) dependent adds on the path to the barrier, not VEC - 1
#pragma unroll
  for (int j = 0; j < VEC; ++j) t[j] = x[j];
#pragma unroll
  for (int w = VEC / 2; w >= 1; w /= 2) {
#pragma unroll
    for (int j = 0; j < w; ++j) t[j] = __fadd_rn(t[j], t[j + w]);
  }
  return __fmul_rn(t[0], 1.f / VEC);
}

// The shift read by each thread itself (the norms kernel's path for rows too long for registers).
template <typename T, int VEC>
__device__ __forceinline__ float first_vector_mean(const NormParams<T>& p, int64_t row_off) {
  float x[VEC];
  load_x<T, VEC>(p, row_off, 0, x);
  return vector_mean<VEC>(x);
}

// One element of a row's sums: sum += x - shift and sq += (x - shift)^2 (shift 0 for RMSNorm).
__device__ __forceinline__ void accumulate(float& sum, float& sq, float x, float shift) {
  const float d = __fsub_rn(x, shift);
  sum = __fadd_rn(sum, d);
  sq = __fmaf_rn(d, d, sq);
}

struct RowStats {
  float mean;   // 0 for RMSNorm
  float rstd;   // 1 / sqrt(variance + eps), or for RMSNorm 1 / sqrt(mean square + eps)
  bool refine;  // LayerNorm only: a second pass is needed (the same for the whole block)
};

// Block totals t = (S, Q) of x - shift and its square: d = S / n, q = Q / n and the variance
// q - d^2 (before clamping), the shared arithmetic of both passes.
struct Moments {
  float d, q, var;
};

__device__ __forceinline__ Moments moments(float2 t, float inv_n) {
  const float d = __fmul_rn(t.x, inv_n);
  const float q = __fmul_rn(t.y, inv_n);
  return {d, q, __fmaf_rn(-d, d, q)};
}

// 1 / sqrt(variance + eps), the variance clamped at 0.
__device__ __forceinline__ float rstd_of(float var, float eps) {
  return rsqrtf(__fadd_rn(fmaxf(var, 0.f), eps));
}

// The row's statistics from every thread's sums S = sum(x - shift) and Q = sum((x - shift)^2),
// in one block reduction: mean = shift + S / n and variance = Q / n - (S / n)^2. The subtraction
// loses the fraction (S / n)^2 / variance of Q's precision (and S's rounding, which grows with
// |x - shift|, reaches the mean), so the result stands only where Q / n <= 2 variance: the
// shift within a standard deviation of the mean. A row whose shift lies further out (an outlier
// among its first columns) is marked `refine` and takes a second pass about this mean
// (refine_stats). With the shift of vector_mean, Gaussian rows take it when the first vector's
// mean lies over a standard deviation out, |z| > sqrt(VEC): 1 row in 200 for 16-bit types
// (VEC 8), 1 in 22 for fp32 (VEC 4) and 1 in 3 on the unaligned element-wise path (VEC 1).
// RMSNorm: Q with shift 0, mean 0, never refined. stats_of_totals is that arithmetic on the
// block's totals t = (S, Q) (the GEMV's normalising prologue reduces several rows at once and
// calls it on each row's totals); row_stats reduces the block first.
__device__ __forceinline__ RowStats stats_of_totals(bool layer_norm, float shift, float2 t,
                                                    float inv_n, float eps) {
  if (!layer_norm) return {0.f, rsqrtf(__fmaf_rn(t.y, inv_n, eps)), false};
  const Moments mo = moments(t, inv_n);
  const bool refine = mo.q > __fmul_rn(2.f, mo.var);
  return {__fmaf_rn(t.x, inv_n, shift), rstd_of(mo.var, eps), refine};
}

__device__ __forceinline__ RowStats row_stats(bool layer_norm, float shift, float sum, float sq,
                                              float inv_n, float eps, float2* scratch) {
  return stats_of_totals(layer_norm, shift, block_sum2(make_float2(sum, sq), scratch), inv_n, eps);
}

// The second pass of a row marked `refine`: every thread's sums (accumulate) with the first
// pass's mean as the shift, which now lies close to the true mean, so that mean and variance
// come out as accurate as an exact two-pass computation (the corrected two-pass formula).
// refine_of_totals on the block's totals; refine_stats reduces the block first.
__device__ __forceinline__ void refine_of_totals(RowStats& st, float2 t, float inv_n, float eps) {
  const Moments mo = moments(t, inv_n);
  st.mean = __fadd_rn(st.mean, mo.d);
  st.rstd = rstd_of(mo.var, eps);
}

__device__ __forceinline__ void refine_stats(RowStats& st, float sum, float sq, float inv_n,
                                             float eps, float2* scratch) {
  refine_of_totals(st, block_sum2(make_float2(sum, sq), scratch), inv_n, eps);
}

// VEC normalised elements (x - mean) * rstd * gamma (+ beta for LayerNorm) of columns col...
template <typename T, int VEC>
__device__ __forceinline__ void normalize(NormKind kind, const T* gamma, const T* beta, int col,
                                          const float (&x)[VEC], float mean, float rstd,
                                          float (&y)[VEC]) {
  float g[VEC];
  load_vec<T, VEC>(gamma + col, g);
#pragma unroll
  for (int j = 0; j < VEC; ++j) y[j] = __fmul_rn(__fmul_rn(__fsub_rn(x[j], mean), rstd), g[j]);
  if (kind == NormKind::kLayerNorm && beta != nullptr) {
    float b[VEC];
    load_vec<T, VEC>(beta + col, b);
#pragma unroll
    for (int j = 0; j < VEC; ++j) y[j] = __fadd_rn(y[j], b[j]);
  }
}

template <typename T, int VEC>
__device__ __forceinline__ void normalize(const NormParams<T>& p, int col, const float (&x)[VEC],
                                          float mean, float rstd, float (&y)[VEC]) {
  normalize<T, VEC>(p.kind, p.gamma, p.beta, col, x, mean, rstd, y);
}

}  // namespace norm
}  // namespace kernels
}  // namespace warpformer
