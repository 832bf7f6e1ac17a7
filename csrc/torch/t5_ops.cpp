// The encoder-decoder family's stateless ops (schemas in registration.cpp).
#include <string>

#include "csrc/models/t5/t5_config.h"
#include "csrc/models/t5/t5_weights.h"
#include "csrc/torch/ops.h"

namespace warpformer {
namespace ops {

std::string t5_weight_table(const std::string& config) {
  // The format's table: no engine-only rule (a model the kernels cannot run still converts and
  // runs on the reference backend).
  const t5::T5Config c = t5::T5Config::from_json(config, 0, 1, 0, /*engine=*/false);
  return models::weight_table_json(t5::weight_table(c));
}

}  // namespace ops
}  // namespace warpformer
