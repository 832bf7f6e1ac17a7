// What the GEMV's two kernel families share (gemv.cu: [k, n] weights; gemv_nk.cuh: [n, k]
// weights): the CUDA-core kernels' block size, the weights' streaming load and the outputs'
// epilogue. Included by gemv.cu only.
#pragma once

#include <cstdint>

#include "kernels/activation_math.cuh"
#include "kernels/common.cuh"
#include "kernels/gemv.h"

namespace warpformer {
namespace kernels {
namespace gemv_impl {

constexpr int kThreads = 256;  // a block of the CUDA-core kernels
constexpr int kWarps = kThreads / 32;

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

}  // namespace gemv_impl
}  // namespace kernels
}  // namespace warpformer
