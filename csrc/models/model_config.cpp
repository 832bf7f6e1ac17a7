#include "csrc/models/model_config.h"

#include <c10/util/Exception.h>

#include <cctype>

namespace warpformer {
namespace models {

kernels::Activation config_activation(const std::string& name, const char* what, const char* key) {
  // config.ini names (docs/FORMAT.md); FT's bare "Gelu" is the tanh form.
  std::string s;
  for (char c : name) s += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s == "gelu_tanh" || s == "gelu" || s == "gelu_new") return kernels::Activation::kGeluTanh;
  if (s == "gelu_erf") return kernels::Activation::kGeluErf;
  if (s == "relu") return kernels::Activation::kRelu;
  if (s == "silu" || s == "swish") return kernels::Activation::kSilu;
  TORCH_CHECK(false, what, ": ", key, " must be one of gelu_tanh, gelu_erf, relu, silu; got '",
              name, "'");
}

}  // namespace models
}  // namespace warpformer
