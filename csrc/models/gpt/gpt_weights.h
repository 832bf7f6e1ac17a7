// The weight table of a GPT-family model: every tensor a config implies, by its on-disk name
// (docs/FORMAT.md), with its full shape, the axis tensor parallelism splits and where pipeline
// stages need it. The one source of that contract: the engine checks the weights it is given
// against it, and warpformer.weights.weight_specs (the converters, the loader, the reference
// backend) asks for it through the gpt_weight_table op.
#pragma once

#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "csrc/models/gpt/gpt_config.h"

namespace warpformer {
namespace gpt {

struct WeightEntry {
  static constexpr int kReplicated = INT_MIN;  // split_axis of a tensor every rank holds whole

  std::string name;              // e.g. "layers.0.attention.query_key_value.weight"
  std::vector<int64_t> shape;    // full, unsplit
  int split_axis = kReplicated;  // 0 or -1 (the last axis): divided by tensor_para_size
  int64_t layer = -1;            // global layer index; -1 for model-level tensors
  std::string stage;  // model-level: the pipeline stages needing it, "first", "last", "first+last"
  bool optional = false;  // may be absent (lm_head.weight: absent means tied to wte)

  // This rank's shape for tensor_para_size `tp`.
  std::vector<int64_t> shard_shape(int64_t tp) const;
};

// In the format's order: embeddings, each layer's tensors, the final norm and the head.
std::vector<WeightEntry> weight_table(const GptConfig& c);

// The table as a JSON array of {"name", "shape", "split" (0, -1 or null), "layer" (or null),
// "stage", "optional"} objects.
std::string weight_table_json(const std::vector<WeightEntry>& table);

}  // namespace gpt
}  // namespace warpformer
