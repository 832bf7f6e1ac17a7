// The weight table of a GPT-family model: every tensor a config implies, by its on-disk name
// (docs/FORMAT.md), with its full shape, the axis tensor parallelism splits and where pipeline
// stages need it. The one source of that contract: the engine checks the weights it is given
// against it, and warpformer.weights.weight_specs (the converters, the loader, the reference
// backend) asks for it through the gpt_weight_table op.
#pragma once

#include <string>
#include <vector>

#include "csrc/models/gpt/gpt_config.h"
#include "csrc/models/weight_table.h"

namespace warpformer {
namespace gpt {

// The family-neutral entry and its JSON (csrc/models/weight_table.h); GPT entries leave stack and
// role empty.
using models::weight_table_json;
using models::WeightEntry;

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

}  // namespace gpt
}  // namespace warpformer
