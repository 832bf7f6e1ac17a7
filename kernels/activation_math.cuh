// The activation functions as device code, shared by the bias/activation kernels and the GEMV
// epilogue so both paths compute exactly the same function. Included only from .cu files.
#pragma once

#include <cuda_runtime.h>

#include "kernels/activations.h"

namespace warpformer {
namespace kernels {

template <Activation ACT>
__device__ __forceinline__ float activate(float x) {
  if constexpr (ACT == Activation::kGeluErf) {
    return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
  } else if constexpr (ACT == Activation::kGeluTanh) {
    // 0.5 x (1 + tanh(u)) == x * sigmoid(2u): one fast exp instead of tanhf, which made the
    // fp16 kernel instruction-bound (benchmarks/HISTORY.md, "Figures moved from code comments
    // (issue 50)").
    const float u2 = 1.5957691216057308f * (x + 0.044715f * x * x * x);
    return __fdividef(x, 1.f + __expf(-u2));
  } else if constexpr (ACT == Activation::kRelu) {
    return fmaxf(x, 0.f);
  } else if constexpr (ACT == Activation::kSilu) {
    return x / (1.f + __expf(-x));
  } else {
    return x;
  }
}

// Runtime activation to a compile-time constant named ACT inside the body.
#define WF_ACTIVATION_SWITCH(RUNTIME, ACT, ...)                            \
  [&] {                                                                    \
    switch (RUNTIME) {                                                     \
      case ::warpformer::kernels::Activation::kGeluErf: {                  \
        constexpr auto ACT = ::warpformer::kernels::Activation::kGeluErf;  \
        return __VA_ARGS__();                                              \
      }                                                                    \
      case ::warpformer::kernels::Activation::kGeluTanh: {                 \
        constexpr auto ACT = ::warpformer::kernels::Activation::kGeluTanh; \
        return __VA_ARGS__();                                              \
      }                                                                    \
      case ::warpformer::kernels::Activation::kRelu: {                     \
        constexpr auto ACT = ::warpformer::kernels::Activation::kRelu;     \
        return __VA_ARGS__();                                              \
      }                                                                    \
      case ::warpformer::kernels::Activation::kSilu: {                     \
        constexpr auto ACT = ::warpformer::kernels::Activation::kSilu;     \
        return __VA_ARGS__();                                              \
      }                                                                    \
      default: {                                                           \
        constexpr auto ACT = ::warpformer::kernels::Activation::kIdentity; \
        return __VA_ARGS__();                                              \
      }                                                                    \
    }                                                                      \
  }()

}  // namespace kernels
}  // namespace warpformer
