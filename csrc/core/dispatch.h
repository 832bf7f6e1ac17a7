// The one place that maps a runtime element type to the C++ type kernels are instantiated for.
//
//   WF_DISPATCH_FLOATING(dtype, "layer_norm", [&] { launch<scalar_t>(...); });
//
// runs the lambda with `scalar_t` bound to float, __half or __nv_bfloat16. Unsupported types
// throw, naming the caller. Core and layers use DType; only csrc/torch converts from
// c10::ScalarType (see csrc/torch/tensor_utils.h).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <c10/util/Exception.h>

#include <cstddef>
#include <string>

namespace warpformer {

enum class DType { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
  }
  return "unknown";
}

inline size_t dtype_size(DType t) { return t == DType::kFloat32 ? 4 : 2; }

// Parse "fp32"/"float32", "fp16"/"float16"/"half", "bf16"/"bfloat16" (config files, JSON).
inline DType parse_dtype(const std::string& s, const char* what) {
  if (s == "fp32" || s == "float32" || s == "float") return DType::kFloat32;
  if (s == "fp16" || s == "float16" || s == "half") return DType::kFloat16;
  if (s == "bf16" || s == "bfloat16") return DType::kBFloat16;
  TORCH_CHECK(false, what, " must be one of fp32, fp16, bf16; got '", s, "'");
}

}  // namespace warpformer

#define WF_DISPATCH_FLOATING(DTYPE, NAME, ...)                                 \
  [&] {                                                                        \
    switch (DTYPE) {                                                           \
      case ::warpformer::DType::kFloat32: {                                    \
        using scalar_t = float;                                                \
        return __VA_ARGS__();                                                  \
      }                                                                        \
      case ::warpformer::DType::kFloat16: {                                    \
        using scalar_t = __half;                                               \
        return __VA_ARGS__();                                                  \
      }                                                                        \
      case ::warpformer::DType::kBFloat16: {                                   \
        using scalar_t = __nv_bfloat16;                                        \
        return __VA_ARGS__();                                                  \
      }                                                                        \
    }                                                                          \
    TORCH_CHECK(false, NAME, ": unsupported dtype ", static_cast<int>(DTYPE)); \
  }()
