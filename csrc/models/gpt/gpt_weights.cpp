#include "csrc/models/gpt/gpt_weights.h"

#include <sstream>

namespace warpformer {
namespace gpt {

std::vector<int64_t> WeightEntry::shard_shape(int64_t tp) const {
  std::vector<int64_t> s = shape;
  if (split_axis != kReplicated) {
    const size_t axis = split_axis < 0 ? s.size() - 1 : static_cast<size_t>(split_axis);
    s[axis] /= tp;
  }
  return s;
}

std::vector<WeightEntry> weight_table(const GptConfig& c) {
  const int64_t h = c.hidden(), i = c.inter_size, v = c.vocab_size, e = c.embed_dim();
  constexpr int kRep = WeightEntry::kReplicated;
  std::vector<WeightEntry> t;
  auto model = [&](const char* name, std::vector<int64_t> shape, const char* stage,
                   bool optional = false) {
    t.push_back({name, std::move(shape), kRep, -1, stage, optional});
  };
  model("wte", {v, e}, "first");
  if (c.has_positional_encoding) model("wpe", {c.max_pos_seq_len, h}, "first");
  if (c.word_embed_proj_dim > 0) {
    model("project_in.weight", {e, h}, "first");
    model("project_out.weight", {h, e}, "last");
  }
  if (c.has_pre_decoder_layernorm) {
    model("pre_decoder_layernorm.weight", {h}, "first");
    model("pre_decoder_layernorm.bias", {h}, "first");
  }
  for (int64_t n = 0; n < c.num_layer; ++n) {
    const std::string p = "layers." + std::to_string(n) + ".";
    auto layer = [&](const char* name, std::vector<int64_t> shape,
                     int split = WeightEntry::kReplicated) {
      t.push_back({p + name, std::move(shape), split, n, "", false});
    };
    layer("input_layernorm.weight", {h});
    layer("input_layernorm.bias", {h});
    layer("attention.query_key_value.weight", {h, 3, h}, -1);
    layer("attention.dense.weight", {h, h}, 0);
    layer("mlp.dense_h_to_4h.weight", {h, i}, -1);
    layer("mlp.dense_h_to_4h.bias", {i}, -1);
    layer("mlp.dense_4h_to_h.weight", {i, h}, 0);
    layer("mlp.dense_4h_to_h.bias", {h});
    if (c.has_attention_bias) {
      layer("attention.query_key_value.bias", {3, h}, -1);
      layer("attention.dense.bias", {h});
    }
    if (!c.parallel_shared_layernorm) {
      layer("post_attention_layernorm.weight", {h});
      layer("post_attention_layernorm.bias", {h});
    }
  }
  if (c.has_post_decoder_layernorm) {
    model("final_layernorm.weight", {h}, "last");
    model("final_layernorm.bias", {h}, "last");
  }
  model("lm_head.weight", {v, e}, "last", /*optional=*/true);
  if (c.has_lm_head_bias) model("lm_head.bias", {v}, "last");
  return t;
}

std::string weight_table_json(const std::vector<WeightEntry>& table) {
  std::ostringstream os;
  os << "[";
  for (size_t k = 0; k < table.size(); ++k) {
    const WeightEntry& w = table[k];
    os << (k ? ", " : "") << "{\"name\": \"" << w.name << "\", \"shape\": [";
    for (size_t d = 0; d < w.shape.size(); ++d) os << (d ? ", " : "") << w.shape[d];
    os << "], \"split\": ";
    if (w.split_axis == WeightEntry::kReplicated) {
      os << "null";
    } else {
      os << w.split_axis;
    }
    os << ", \"layer\": ";
    if (w.layer < 0) {
      os << "null";
    } else {
      os << w.layer;
    }
    os << ", \"stage\": \"" << w.stage << "\", \"optional\": " << (w.optional ? "true" : "false")
       << "}";
  }
  os << "]";
  return os.str();
}

}  // namespace gpt
}  // namespace warpformer
