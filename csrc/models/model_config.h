// What the families' configs share (GptConfig, T5Config): the activation names of config.ini and
// of the JSON Python writes, mapped to the kernels' enum in one place.
#pragma once

#include <string>

#include "kernels/activations.h"

namespace warpformer {
namespace models {

// gelu_tanh (also gelu, gelu_new: FT's bare "Gelu" is the tanh form), gelu_erf, relu, silu (also
// swish), case-insensitive. Throws naming `what` (the config) and `key` otherwise.
kernels::Activation config_activation(const std::string& name, const char* what, const char* key);

}  // namespace models
}  // namespace warpformer
