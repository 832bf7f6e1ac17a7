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
  // The file's element type: empty for the model's, "int8" / "uint8" for quantized kernels' data
  // and int4 zero points.
  std::string dtype;

  // This rank's shape for tensor_para_size `tp`.
  std::vector<int64_t> shard_shape(int64_t tp) const;
};

// Suffixes of a quantized kernel's companion tensors: <name>_scale, <name>_zero.
constexpr const char* kScaleSuffix = "_scale";
constexpr const char* kZeroSuffix = "_zero";

// In the format's order: embeddings, each layer's tensors, the final norm and the head. For a
// quantized config (c.weight_quant) the stored tensors: each quantized kernel K [in, *out] (every
// layer's linear kernel; the head [V, e], input axis last, with quant_lm_head) becomes K (int8
// [in, *out], or uint8 [in / 2, *out] packing int4 along the input axis), K_scale ([*out] for
// int8, [in / group, *out] for int4, the model's dtype) and, for asymmetric int4, K_zero (uint8,
// as the scales). Data and int4 scales split as the kernel; the int8 scales of a row-parallel
// kernel are replicated (whole columns). Throws naming the tensor when an int4 group does not
// divide a rank's input rows.
std::vector<WeightEntry> weight_table(const GptConfig& c);

// The table as a JSON array of {"name", "shape", "split" (0, -1 or null), "layer" (or null),
// "stage", "optional", "dtype" (null: the model's)} objects.
std::string weight_table_json(const std::vector<WeightEntry>& table);

}  // namespace gpt
}  // namespace warpformer
