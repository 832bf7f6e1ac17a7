// The kernel parameter blocks of a Gemm product, shared by Gemm and the fused products of
// csrc/layers/linear.cpp that launch the GEMV family themselves.
#pragma once

#include <cstdint>

#include "csrc/core/gemm.h"
#include "kernels/gemv.h"
#include "kernels/norms.h"

namespace warpformer {

template <typename T>
kernels::NormParams<T> norm_params(const GemmNormedInput& in, int64_t rows, int64_t hidden) {
  kernels::NormParams<T> p{};
  p.out = static_cast<T*>(in.out);
  p.residual_out = static_cast<T*>(in.residual_out);
  p.input = static_cast<const T*>(in.input);
  p.residual = static_cast<const T*>(in.residual);
  p.input_bias = static_cast<const T*>(in.input_bias);
  p.gamma = static_cast<const T*>(in.gamma);
  p.beta = static_cast<const T*>(in.beta);
  p.rows = rows;
  p.hidden = static_cast<int>(hidden);
  p.eps = in.eps;
  p.kind = in.kind;
  return p;
}

// The GEMV parameters of out[m, n] = in[m, k] @ weight[k, n] (+ bias): what try_gemv and
// try_gemv_sum have in common. The caller range-checks m, n and k (int) and sets the rest.
template <typename T>
kernels::GemvParams<T> gemv_params(const void* in, const void* weight, const void* bias, void* out,
                                   int64_t m, int64_t n, int64_t k, bool prefetch_weight) {
  kernels::GemvParams<T> p{};
  p.out = static_cast<T*>(out);
  p.in = static_cast<const T*>(in);
  p.weight = static_cast<const T*>(weight);
  p.bias = static_cast<const T*>(bias);
  p.m = static_cast<int>(m);
  p.n = static_cast<int>(n);
  p.k = static_cast<int>(k);
  p.prefetch_weight = prefetch_weight;
  return p;
}

}  // namespace warpformer
