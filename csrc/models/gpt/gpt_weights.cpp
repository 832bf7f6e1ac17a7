#include "csrc/models/gpt/gpt_weights.h"

#include <c10/util/Exception.h>

#include <string>
#include <utility>

namespace warpformer {
namespace gpt {

namespace {

// The stored form of the dense table `dense` under c's weight-only quantization (weight_table).
std::vector<WeightEntry> quantized_table(const GptConfig& c, std::vector<WeightEntry> dense) {
  const bool int4 = c.weight_quant == "int4";
  const int64_t g = c.quant_group_size, tp = c.tensor_para_size;
  std::vector<WeightEntry> out;
  for (WeightEntry& e : dense) {
    const bool layer_kernel = e.layer >= 0 && e.shape.size() >= 2 && e.name.size() > 7 &&
                              e.name.compare(e.name.size() - 7, 7, ".weight") == 0;
    const bool head = c.quant_lm_head && e.name == "lm_head.weight";
    if (!layer_kernel && !head) {
      out.push_back(std::move(e));
      continue;
    }
    const size_t axis = head ? 1 : 0;  // the input axis
    const int64_t width = e.shape[axis];
    const int nd = static_cast<int>(e.shape.size());
    const bool replicated = e.split_axis == WeightEntry::kReplicated;
    const bool splits_input =
        !replicated && ((e.split_axis % nd) + nd) % nd == static_cast<int>(axis);
    WeightEntry scale = e;
    if (int4) {
      const int64_t per_rank = splits_input ? width / tp : width;
      if (per_rank % g != 0) {
        std::string where = std::to_string(width);
        if (per_rank != width) {
          where = std::to_string(per_rank) + " per rank (" + std::to_string(width) +
                  " / tensor_para_size " + std::to_string(tp) + ")";
        }
        TORCH_CHECK(false, "int4 group size ", g, " does not divide the input width ", where,
                    " of ", e.name,
                    per_rank != width ? "; a group must not straddle a rank boundary" : "",
                    ": pick a group size that divides ", per_rank);
      }
      scale.shape[axis] = width / g;
      e.shape[axis] = width / 2;
      e.dtype = "uint8";
    } else {
      scale.shape.erase(scale.shape.begin() + static_cast<int64_t>(axis));
      if (replicated || splits_input) {
        scale.split_axis = WeightEntry::kReplicated;
      } else if (e.split_axis > static_cast<int>(axis)) {
        scale.split_axis = e.split_axis - 1;
      }
      e.dtype = "int8";
    }
    scale.name = e.name + kScaleSuffix;
    WeightEntry zero = scale;
    zero.name = e.name + kZeroSuffix;
    zero.dtype = "uint8";
    out.push_back(std::move(e));
    out.push_back(std::move(scale));
    if (int4 && c.quant_asymmetric) out.push_back(std::move(zero));
  }
  return out;
}

}  // namespace

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
    if (!c.rmsnorm) model("pre_decoder_layernorm.bias", {h}, "first");
  }
  // Grouped-query attention stores each rank's [Q heads | K heads | V heads] side by side (K/V
  // heads repeated on the ranks that share one), so the "whole" tensor is the ranks' blocks in
  // order; multi-head attention keeps FT's [h, 3, h] (all Q, then K, then V).
  const int64_t d = c.size_per_head, tp = c.tensor_para_size;
  const int64_t qkv_local = (c.local_heads() + 2 * c.local_kv_heads()) * d;
  const std::vector<int64_t> qkv_shape =
      c.grouped_query() ? std::vector<int64_t>{h, tp * qkv_local} : std::vector<int64_t>{h, 3, h};
  const std::vector<int64_t> qkv_bias_shape =
      c.grouped_query() ? std::vector<int64_t>{tp * qkv_local} : std::vector<int64_t>{3, h};
  for (int64_t n = 0; n < c.num_layer; ++n) {
    const std::string p = "layers." + std::to_string(n) + ".";
    auto layer = [&](const char* name, std::vector<int64_t> shape,
                     int split = WeightEntry::kReplicated) {
      t.push_back({p + name, std::move(shape), split, n, "", false});
    };
    layer("input_layernorm.weight", {h});
    if (!c.rmsnorm) layer("input_layernorm.bias", {h});
    layer("attention.query_key_value.weight", qkv_shape, -1);
    layer("attention.dense.weight", {h, h}, 0);
    if (c.use_gated_activation) layer("mlp.gate.weight", {h, i}, -1);
    layer("mlp.dense_h_to_4h.weight", {h, i}, -1);
    layer("mlp.dense_4h_to_h.weight", {i, h}, 0);
    if (c.has_mlp_bias) {
      if (c.use_gated_activation) layer("mlp.gate.bias", {i}, -1);
      layer("mlp.dense_h_to_4h.bias", {i}, -1);
      layer("mlp.dense_4h_to_h.bias", {h});
    }
    if (c.has_attention_bias) {
      layer("attention.query_key_value.bias", qkv_bias_shape, -1);
      if (c.has_attention_out_bias) layer("attention.dense.bias", {h});
    }
    if (!c.parallel_shared_layernorm) {
      layer("post_attention_layernorm.weight", {h});
      if (!c.rmsnorm) layer("post_attention_layernorm.bias", {h});
    }
  }
  if (c.has_post_decoder_layernorm) {
    model("final_layernorm.weight", {h}, "last");
    if (!c.rmsnorm) model("final_layernorm.bias", {h}, "last");
  }
  model("lm_head.weight", {v, e}, "last", /*optional=*/true);
  if (c.has_lm_head_bias) model("lm_head.bias", {v}, "last");
  return c.quantized() ? quantized_table(c, std::move(t)) : t;
}

}  // namespace gpt
}  // namespace warpformer
