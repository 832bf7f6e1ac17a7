#include "csrc/core/activation.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>

namespace warpformer {

kernels::Activation parse_activation(const std::string& name, const char* what) {
  std::string s = name;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  using A = kernels::Activation;
  if (s == "identity" || s == "none" || s == "linear") return A::kIdentity;
  if (s == "gelu" || s == "gelu_erf") return A::kGeluErf;
  if (s == "gelu_tanh" || s == "gelu_new" || s == "gelu_pytorch_tanh" || s == "gelu_fast" ||
      s == "fastgelu" || s == "gelu_ft") {
    return A::kGeluTanh;
  }
  if (s == "relu") return A::kRelu;
  if (s == "silu" || s == "swish") return A::kSilu;
  TORCH_CHECK(false, what, " must be one of identity, gelu, gelu_tanh, relu, silu (got '", name,
              "')");
}

const char* activation_name(kernels::Activation act) {
  switch (act) {
    case kernels::Activation::kIdentity: return "identity";
    case kernels::Activation::kGeluErf: return "gelu";
    case kernels::Activation::kGeluTanh: return "gelu_tanh";
    case kernels::Activation::kRelu: return "relu";
    case kernels::Activation::kSilu: return "silu";
  }
  return "unknown";
}

}  // namespace warpformer
