// Activation names as they appear in op arguments and config.ini (activation_type), mapped to
// the kernels' enum. Matching is case-insensitive; FT's "Gelu" is the tanh approximation.
#pragma once

#include <string>

#include "kernels/activations.h"

namespace warpformer {

// Accepted names: identity; gelu (exact, erf) = gelu_erf; gelu_tanh = gelu_new =
// gelu_pytorch_tanh = fastgelu = FT's "Gelu" spelled "gelu_ft"; relu; silu = swish.
// `what` names the argument in the error message.
kernels::Activation parse_activation(const std::string& name, const char* what);
const char* activation_name(kernels::Activation act);

}  // namespace warpformer
