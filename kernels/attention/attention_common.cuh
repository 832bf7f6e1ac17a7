// Device helpers shared by the attention kernels: the head-size switch, rotary frequencies and
// the safe exponent used by the online softmax. Included only from kernels/attention/*.cu.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

#include "kernels/attention/attention.h"
#include "kernels/common.cuh"

namespace warpformer {
namespace kernels {
namespace attn {

// inv_freq_i = 1 / base^(2i / rotary_dim), rounded like HF's fp32 computation:
// exponent = float(2i) / float(rotary_dim), power rounded once to fp32, then an IEEE fp32 division.
__device__ __forceinline__ float rotary_inv_freq(int i, int rotary_dim, float base) {
  const float expo = static_cast<float>(2 * i) / static_cast<float>(rotary_dim);
  const float power = static_cast<float>(pow(static_cast<double>(base), static_cast<double>(expo)));
  return __fdiv_rn(1.0f, power);
}

// exp(x - m) that is 0 (not NaN) when both are -inf.
__device__ __forceinline__ float exp_shifted(float x, float m) {
  return m == -INFINITY ? 0.f : __expf(x - m);
}

}  // namespace attn
}  // namespace kernels
}  // namespace warpformer

// Run the body with HEAD_DIM bound to the runtime head size; unsupported sizes return
// cudaErrorInvalidValue from the enclosing lambda.
#define WF_HEAD_DIM_SWITCH(DIM, HEAD_DIM, ...)                      \
  [&]() -> cudaError_t {                                            \
    switch (DIM) {                                                  \
      case 64: {                                                    \
        constexpr int HEAD_DIM = 64;                                \
        return __VA_ARGS__();                                       \
      }                                                             \
      case 80: {                                                    \
        constexpr int HEAD_DIM = 80;                                \
        return __VA_ARGS__();                                       \
      }                                                             \
      case 96: {                                                    \
        constexpr int HEAD_DIM = 96;                                \
        return __VA_ARGS__();                                       \
      }                                                             \
      case 128: {                                                   \
        constexpr int HEAD_DIM = 128;                               \
        return __VA_ARGS__();                                       \
      }                                                             \
      case 256: {                                                   \
        constexpr int HEAD_DIM = 256;                               \
        return __VA_ARGS__();                                       \
      }                                                             \
      default: return cudaErrorInvalidValue;                        \
    }                                                               \
  }()
