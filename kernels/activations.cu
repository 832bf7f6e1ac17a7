// Bias add + activation (plain and gated) — see activations.h.
//
// Grid: x covers the column vectors of a row, y the rows (striding when rows exceed the grid's
// y limit). Each thread moves one 16-byte vector per row when cols and the pointers allow it.
// (Four rows per thread was tried and lowered gated_act's bandwidth: benchmarks/HISTORY.md,
// "Figures moved from code comments (issue 50)".)
#include <algorithm>

#include "kernels/activation_math.cuh"
#include "kernels/activations.h"
#include "kernels/common.cuh"

namespace warpformer {
namespace kernels {
namespace {

template <typename T, int VEC, Activation ACT, bool GATED>
__global__ void act_kernel(T* out,                      // [rows, cols]
                           const T* in,                 // [rows, cols] or [rows, 2 * cols]
                           const T* __restrict__ bias,  // [cols] or [2 * cols] or null
                           int64_t rows, int cols) {
  wait_for_prior_kernels();
  const int col = (blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  if (col >= cols) return;
  const int64_t in_cols = GATED ? 2 * static_cast<int64_t>(cols) : cols;
  float b[VEC], bu[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) b[j] = bu[j] = 0.f;
  if (bias != nullptr) {
    load_vec<T, VEC>(bias + col, b);
    if (GATED) load_vec<T, VEC>(bias + cols + col, bu);
  }
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    float x[VEC];
    load_vec<T, VEC>(in + r * in_cols + col, x);
    if constexpr (GATED) {
      float u[VEC];
      load_vec<T, VEC>(in + r * in_cols + cols + col, u);
#pragma unroll
      for (int j = 0; j < VEC; ++j) x[j] = activate<ACT>(x[j] + b[j]) * (u[j] + bu[j]);
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) x[j] = activate<ACT>(x[j] + b[j]);
    }
    store_vec<T, VEC>(out + r * cols + col, x);
  }
}

template <typename T, int VEC, bool GATED>
cudaError_t launch_vec(T* out, const T* in, const T* bias, int64_t rows, int cols, Activation act,
                       cudaStream_t stream) {
  const int nvec = cols / VEC;
  const int threads = nvec >= 256 ? 256 : ceil_div(nvec, 32) * 32;
  LaunchShape shape;
  shape.grid = dim3(ceil_div(nvec, threads), static_cast<unsigned>(rows < 65535 ? rows : 65535));
  shape.block = dim3(threads);
  switch (act) {
#define WF_ACT_CASE(A) \
  case A:              \
    return launch_kernel(shape, stream, act_kernel<T, VEC, A, GATED>, out, in, bias, rows, cols);
    WF_ACT_CASE(Activation::kIdentity)
    WF_ACT_CASE(Activation::kGeluErf)
    WF_ACT_CASE(Activation::kGeluTanh)
    WF_ACT_CASE(Activation::kRelu)
    WF_ACT_CASE(Activation::kSilu)
#undef WF_ACT_CASE
    default: return cudaErrorInvalidValue;
  }
}

template <typename T, bool GATED>
cudaError_t launch(T* out, const T* in, const T* bias, int64_t rows, int cols, Activation act,
                   cudaStream_t stream) {
  if (rows < 0 || cols <= 0 || out == nullptr || in == nullptr) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  constexpr int kVec = 16 / sizeof(T);
  const bool vec_ok =
      cols % kVec == 0 && aligned_to(out, 16) && aligned_to(in, 16) && aligned_to(bias, 16);
  return vec_ok ? launch_vec<T, kVec, GATED>(out, in, bias, rows, cols, act, stream)
                : launch_vec<T, 1, GATED>(out, in, bias, rows, cols, act, stream);
}

template <typename T, int VEC>
__global__ void mul_kernel(T* out, const T* a, const T* b, int64_t vectors) {
  wait_for_prior_kernels();
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < vectors;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float x[VEC], y[VEC];
    load_vec<T, VEC>(a + v * VEC, x);
    load_vec<T, VEC>(b + v * VEC, y);
#pragma unroll
    for (int j = 0; j < VEC; ++j) x[j] *= y[j];
    store_vec<T, VEC>(out + v * VEC, x);
  }
}

}  // namespace

template <typename T>
cudaError_t launch_mul(T* out, const T* a, const T* b, int64_t elements, cudaStream_t stream) {
  if (elements < 0 || out == nullptr || a == nullptr || b == nullptr) return cudaErrorInvalidValue;
  if (elements == 0) return cudaSuccess;
  constexpr int kVec = 16 / sizeof(T);
  const bool vec_ok =
      elements % kVec == 0 && aligned_to(out, 16) && aligned_to(a, 16) && aligned_to(b, 16);
  const int vec = vec_ok ? kVec : 1;
  const int64_t vectors = elements / vec;
  LaunchShape shape;
  shape.block = dim3(256);
  shape.grid = dim3(static_cast<unsigned>(std::min<int64_t>((vectors + 255) / 256, 4096)));
  return vec_ok ? launch_kernel(shape, stream, mul_kernel<T, kVec>, out, a, b, vectors)
                : launch_kernel(shape, stream, mul_kernel<T, 1>, out, a, b, vectors);
}

template <typename T>
cudaError_t launch_bias_act(T* out, const T* in, const T* bias, int64_t rows, int cols,
                            Activation act, cudaStream_t stream) {
  return launch<T, false>(out, in, bias, rows, cols, act, stream);
}

template <typename T>
cudaError_t launch_gated_act(T* out, const T* in, const T* bias, int64_t rows, int cols,
                             Activation act, cudaStream_t stream) {
  return launch<T, true>(out, in, bias, rows, cols, act, stream);
}

#define WF_INSTANTIATE(T)                                                                    \
  template cudaError_t launch_bias_act<T>(T*, const T*, const T*, int64_t, int, Activation,  \
                                          cudaStream_t);                                     \
  template cudaError_t launch_gated_act<T>(T*, const T*, const T*, int64_t, int, Activation, \
                                           cudaStream_t);                                    \
  template cudaError_t launch_mul<T>(T*, const T*, const T*, int64_t, cudaStream_t);
WF_INSTANTIATE(float)
WF_INSTANTIATE(__half)
WF_INSTANTIATE(__nv_bfloat16)
#undef WF_INSTANTIATE

}  // namespace kernels
}  // namespace warpformer
