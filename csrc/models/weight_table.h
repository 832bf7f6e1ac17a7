// A model family's weight table, family-neutral: every tensor a config implies, by its on-disk
// name (docs/FORMAT.md), with its full shape, the axis tensor parallelism splits, where it sits
// (layer, pipeline stage) and what it is (stack, role). Each family builds its table from its
// config (gpt::weight_table, t5::weight_table); the engine checks and finds the weights it is
// given through it, and Python reads the same table through the <family>_weight_table ops
// (weight_table_json), so the format exists once.
#pragma once

#include <climits>
#include <cstdint>
#include <string>
#include <vector>

namespace warpformer {
namespace models {

struct WeightEntry {
  static constexpr int kReplicated = INT_MIN;  // split_axis of a tensor every rank holds whole

  std::string name;              // e.g. "layers.0.attention.query_key_value.weight"
  std::vector<int64_t> shape;    // full, unsplit
  int split_axis = kReplicated;  // an axis (negative: from the end) divided by tensor_para_size
  int64_t layer = -1;            // global layer index; -1 for model-level tensors
  std::string stage;  // model-level: the pipeline stages needing it, "first", "last", "first+last"
  bool optional = false;  // may be absent (lm_head.weight: absent means tied to wte)
  // The file's element type: empty for the model's, "int8" / "uint8" for quantized kernels' data
  // and int4 zero points.
  std::string dtype;
  // A replicated tensor written whole once per rank, with the rank suffix (FT's BART layout
  // names its row-parallel biases so).
  bool per_rank = false;
  // "encoder" / "decoder" for a layer tensor of that stack; "" for a model-level tensor (and for
  // every GPT-family tensor: one stack).
  std::string stack;
  // What the tensor is, the name the model finds it by (empty for GPT-family tensors). Layer
  // tensors: self_norm, self_q, self_k, self_v, self_qkv, self_o, cross_norm, cross_q, cross_k,
  // cross_v, cross_o, ffn_norm, ffn_in, ffn_gate, ffn_out. Model-level: lm_head, logits_bias,
  // embedding (one table both stacks read), <stack>_embedding, <stack>_positions,
  // <stack>_embedding_norm, <stack>_final_norm. The bias beside a weight of role R is R + "_bias"
  // (logits_bias is a tensor of its own, not a bias of a "logits" weight).
  std::string role;

  // This rank's shape for tensor_para_size `tp`.
  std::vector<int64_t> shard_shape(int64_t tp) const;
  // Whether files carry a rank suffix (split, or per_rank).
  bool ranked() const { return split_axis != kReplicated || per_rank; }
};

// The table as a JSON array of {"name", "shape", "split" (an axis or null), "layer" (or null),
// "stage", "optional", "dtype" (null: the model's), "per_rank", "stack", "role"} objects.
std::string weight_table_json(const std::vector<WeightEntry>& table);

// Finding a tensor by role, for the models and the torch classes:
// - a layer tensor: stack "encoder"/"decoder", its global layer, a layer role ("self_qkv");
// - a model-level tensor: layer -1 and either stack "" with the full role ("lm_head",
//   "encoder_positions") or a stack with the stack-less role (("encoder", -1, "positions") is
//   "encoder_positions"); a stack's "embedding" is its own table when the family has one
//   (BART's <stack>_embedding), else the model's shared one (T5's "embedding"). Model-level
//   tensors match whatever their layer (FT keeps T5's relative bias tables in block 0's files).
// Biases are found by their own role ("self_o_bias").
// find_weight: nullptr when the table has no such tensor (e.g. ffn_gate of a plain FFN).
const WeightEntry* find_weight(const std::vector<WeightEntry>& table, const std::string& stack,
                               int64_t layer, const std::string& role);
// weight_name: the tensor's name; throws (c10::Error) naming stack, layer and role when absent.
std::string weight_name(const std::vector<WeightEntry>& table, const std::string& stack,
                        int64_t layer, const std::string& role);

}  // namespace models
}  // namespace warpformer
