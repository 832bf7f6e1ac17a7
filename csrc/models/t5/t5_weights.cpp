#include "csrc/models/t5/t5_weights.h"

#include <string>
#include <utility>

namespace warpformer {
namespace t5 {
namespace {

constexpr int kRep = WeightEntry::kReplicated;

class TableBuilder {
 public:
  explicit TableBuilder(const T5Config& c) : c_(c) {}

  std::vector<WeightEntry> build() {
    const int64_t v = c_.vocab_size, d = c_.d_model();
    if (!c_.is_bart()) model("shared.weight_T", {v, d}, "embedding");  // one table, both stacks
    stack("encoder", c_.encoder);
    stack("decoder", c_.decoder);
    if (c_.is_bart()) {
      model("decoder.lm_head.weight", {v, d}, "lm_head");
      model("decoder.final_logits_bias", {v}, "logits_bias");
    } else {
      model("lm_head.weight", {v, d}, "lm_head");
    }
    return std::move(t_);
  }

 private:
  // A model-level tensor (stack ""), with the BART family's bias beside a norm.
  void model(const std::string& name, std::vector<int64_t> shape, const std::string& role,
             bool norm = false) {
    t_.push_back({name, std::move(shape), kRep, -1, "", false, "", false, "", role});
    if (norm && c_.is_bart()) bias_of(t_.back());
  }

  // The bias file beside weight `w` (BART): a norm's is [d] like it; a kernel [in, *out]'s is
  // [*out], split with the output axis, or whole and per rank when the kernel splits its rows.
  void bias_of(const WeightEntry& w) {
    WeightEntry b = w;
    b.name = w.name.substr(0, w.name.size() - std::string("weight").size()) + "bias";
    b.role = w.role + "_bias";
    if (w.shape.size() > 1) {
      b.shape.erase(b.shape.begin());
      b.per_rank = w.split_axis == 0;
      b.split_axis = w.split_axis == 0 ? kRep : w.split_axis - 1;
    }
    t_.push_back(std::move(b));
  }

  void stack(const std::string& s, const T5StackConfig& st) {
    const int64_t d = c_.d_model();
    if (c_.is_bart()) {
      model(s + ".embed_tokens.weight", {c_.vocab_size, d}, s + "_embedding");
      model(s + ".embed_positions.weight", {st.max_pos_seq_len, d}, s + "_positions");
      // FT's name for the embedding LayerNorm (HF's layernorm_embedding).
      model(s + ".final_layer_norm.weight", {d}, s + "_embedding_norm", /*norm=*/true);
    } else {
      // FT keeps the table in block 0's files (HF's has_relative_attention_bias layer).
      t_.push_back({s + ".block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                    {st.num_heads, st.num_buckets},
                    0,
                    0,
                    "",
                    false,
                    "",
                    false,
                    "",
                    s + "_positions"});
    }
    for (int64_t i = 0; i < st.num_layers; ++i) layer(s, st, i);
    if (c_.is_bart()) {
      if (c_.pre_layernorm()) model(s + ".layer_norm.weight", {d}, s + "_final_norm", true);
    } else {
      model(s + ".final_layer_norm.weight", {d}, s + "_final_norm");
    }
  }

  void layer(const std::string& s, const T5StackConfig& st, int64_t i) {
    const bool decoder = s == "decoder", bart = c_.is_bart();
    const int64_t d = c_.d_model(), inner = st.inner(), f = st.d_ff;
    // FT's file prefixes: T5 names sublayers by index (the FFN is the decoder's third), BART by
    // module, its FFN under SelfAttention.
    std::string sa, ca, ffn, self_norm, cross_norm, ffn_norm, o, in, gate, out;
    if (bart) {
      const std::string p = s + "." + std::to_string(i) + ".layer.";
      sa = p + "SelfAttention.";
      ca = p + "CrossAttention.";
      ffn = sa;
      self_norm = sa + "attn_layer_norm.weight";
      cross_norm = ca + "attn_layer_norm.weight";
      ffn_norm = ffn + "final_layer_norm.weight";
      o = "out_proj.weight";
      in = ffn + "fc1.weight";
      out = ffn + "fc2.weight";
    } else {
      const std::string p = s + ".block." + std::to_string(i) + ".layer.";
      sa = p + "0.SelfAttention.";
      ca = p + "1.EncDecAttention.";
      ffn = p + (decoder ? "2." : "1.") + "DenseReluDense.";
      self_norm = p + "0.layer_norm.weight";
      cross_norm = p + "1.layer_norm.weight";
      ffn_norm = p + (decoder ? "2." : "1.") + "layer_norm.weight";
      o = "o.weight";
      in = ffn + "wi.weight";
      gate = ffn + "wi2.weight";
      out = ffn + "wo.weight";
    }
    auto add = [&](const std::string& name, std::vector<int64_t> shape, int split,
                   const char* role) {
      t_.push_back({name, std::move(shape), split, i, "", false, "", false, s, role});
      if (bart) bias_of(t_.back());
    };
    add(self_norm, {d}, kRep, "self_norm");
    if (decoder) {
      add(sa + "qkv.weight", {d, 3, inner}, 2, "self_qkv");
    } else {
      add(sa + "q.weight", {d, inner}, 1, "self_q");
      add(sa + "k.weight", {d, inner}, 1, "self_k");
      add(sa + "v.weight", {d, inner}, 1, "self_v");
    }
    add(sa + o, {inner, d}, 0, "self_o");
    if (decoder) {
      add(cross_norm, {d}, kRep, "cross_norm");
      add(ca + "q.weight", {d, inner}, 1, "cross_q");
      add(ca + "k.weight", {d, inner}, 1, "cross_k");
      add(ca + "v.weight", {d, inner}, 1, "cross_v");
      add(ca + o, {inner, d}, 0, "cross_o");
    }
    add(ffn_norm, {d}, kRep, "ffn_norm");
    add(in, {d, f}, 1, "ffn_in");
    if (st.gated) add(gate, {d, f}, 1, "ffn_gate");  // T5 only: BART has no gated FFN
    add(out, {f, d}, 0, "ffn_out");
  }

  const T5Config& c_;
  std::vector<WeightEntry> t_;
};

}  // namespace

std::vector<WeightEntry> weight_table(const T5Config& c) { return TableBuilder(c).build(); }

}  // namespace t5
}  // namespace warpformer
