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

// Thread 0's v, for every thread of the block: LayerNorm's shift, which thread 0 holds as the
// first element of the vector it has loaded, without a global round trip of its own. `slot` is a
// __shared__ float of the caller's; a barrier.
__device__ __forceinline__ float from_thread0(float v, float* slot) {
  if (threadIdx.x == 0) *slot = v;
  __syncthreads();
  return *slot;
}

// x of the row's first element: LayerNorm's shift (its sums run over x - shift so that a large
// common offset of the residual stream does not eat the fp32 sum's precision).
template <typename T>
__device__ __forceinline__ float first_x(const NormParams<T>& p, int64_t row_off) {
  float x = to_float(p.input[row_off]);
  if (p.input_bias != nullptr) x += to_float(p.input_bias[0]);
  if (p.residual != nullptr) x += to_float(p.residual[row_off]);
  return x;
}

// mean = shift + sum(x - shift) / n
__device__ __forceinline__ float mean(float shift, float total, float inv_n) {
  return __fmaf_rn(total, inv_n, shift);
}

// One term of the variance sum: sq + (x - mean)^2.
__device__ __forceinline__ float add_square(float sq, float x, float mean) {
  const float d = __fsub_rn(x, mean);
  return __fmaf_rn(d, d, sq);
}

// 1 / sqrt(sum((x - mean)^2) / n + eps)
__device__ __forceinline__ float rstd(float total_sq, float inv_n, float eps) {
  return rsqrtf(__fmaf_rn(total_sq, inv_n, eps));
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
