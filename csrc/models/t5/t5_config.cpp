#include "csrc/models/t5/t5_config.h"

#include <c10/util/Exception.h>

#include <utility>

#include "csrc/core/flat_json.h"
#include "csrc/models/model_config.h"
#include "kernels/attention/attention.h"

namespace warpformer {
namespace t5 {
namespace {

constexpr const char* kWhat = "T5Model config";
constexpr const char* kStacks[] = {"encoder", "decoder"};

// One stack's fields from its "<stack>_" keys; the shapes are required, the rest default as in
// python/warpformer/t5_config.py's T5StackConfig.
T5StackConfig read_stack(const FlatJson& j, const std::string& stack) {
  const std::string p = stack + "_";
  T5StackConfig s;
  s.d_model = j.require_int(p + "d_model");
  s.d_kv = j.require_int(p + "d_kv");
  s.d_ff = j.require_int(p + "d_ff");
  s.num_layers = j.require_int(p + "num_layers");
  s.num_heads = j.require_int(p + "num_heads");
  s.num_buckets = j.get_int(p + "relative_attention_num_buckets", 32);
  s.max_distance = j.get_int(p + "relative_attention_max_distance", 128);
  s.max_pos_seq_len = j.get_int(p + "max_pos_seq_len", 0);
  s.eps = j.get_double(p + "layer_norm_epsilon", 1e-6);
  const std::string key = p + "activation";
  s.activation = models::config_activation(j.get_string(key, "relu"), kWhat, key.c_str());
  s.gated = j.get_bool(p + "gated", false);
  return s;
}

}  // namespace

T5Config T5Config::from_json(const std::string& json, int64_t tensor_para_rank,
                             int64_t pipeline_para_size, int64_t pipeline_para_rank, bool engine) {
  const FlatJson j = FlatJson::parse(json, kWhat);
  // A misspelt key would otherwise fall back to its default silently.
  j.check_known({"model_type",
                 "vocab_size",
                 "pad_token_id",
                 "eos_token_id",
                 "decoder_start_token_id",
                 "tie_word_embeddings",
                 "weight_data_type",
                 "tensor_para_size",
                 "encoder_d_model",
                 "encoder_d_kv",
                 "encoder_d_ff",
                 "encoder_num_layers",
                 "encoder_num_heads",
                 "encoder_relative_attention_num_buckets",
                 "encoder_relative_attention_max_distance",
                 "encoder_max_pos_seq_len",
                 "encoder_layer_norm_epsilon",
                 "encoder_activation",
                 "encoder_gated",
                 "decoder_d_model",
                 "decoder_d_kv",
                 "decoder_d_ff",
                 "decoder_num_layers",
                 "decoder_num_heads",
                 "decoder_relative_attention_num_buckets",
                 "decoder_relative_attention_max_distance",
                 "decoder_max_pos_seq_len",
                 "decoder_layer_norm_epsilon",
                 "decoder_activation",
                 "decoder_gated"});
  T5Config c;
  c.model_type = j.get_string("model_type", "t5");
  TORCH_CHECK(c.model_type == "t5" || c.model_type == "mt5" || c.is_bart(), kWhat,
              ": model_type must be one of t5, mt5, bart, mbart, got '", c.model_type, "'");
  c.vocab_size = j.require_int("vocab_size");
  c.pad_token_id = j.get_int("pad_token_id", 0);
  c.eos_token_id = j.get_int("eos_token_id", 1);
  c.decoder_start_token_id = j.get_int("decoder_start_token_id", 0);
  c.tie_word_embeddings = j.get_bool("tie_word_embeddings", true);
  c.weight_data_type = j.get_string("weight_data_type", "fp32");
  c.tensor_para_size = j.get_int("tensor_para_size", 1);
  c.encoder = read_stack(j, "encoder");
  c.decoder = read_stack(j, "decoder");
  c.tensor_para_rank = tensor_para_rank;
  c.pipeline_para_size = pipeline_para_size;
  c.pipeline_para_rank = pipeline_para_rank;

  const int64_t tp = c.tensor_para_size, pp = c.pipeline_para_size;
  for (auto [name, v] : {std::pair<const char*, int64_t>{"vocab_size", c.vocab_size},
                         {"tensor_para_size", tp},
                         {"pipeline_para_size", pp}}) {
    TORCH_CHECK(v > 0, kWhat, ": ", name, " must be positive, got ", v);
  }
  TORCH_CHECK(tensor_para_rank >= 0 && tensor_para_rank < tp, kWhat,
              ": tensor_para_rank must be in [0, ", tp, "), got ", tensor_para_rank);
  TORCH_CHECK(pipeline_para_rank >= 0 && pipeline_para_rank < pp, kWhat,
              ": pipeline_para_rank must be in [0, ", pp, "), got ", pipeline_para_rank);
  TORCH_CHECK(
      c.weight_data_type == "fp32" || c.weight_data_type == "fp16" || c.weight_data_type == "bf16",
      kWhat, ": weight_data_type must be one of fp32, fp16, bf16, got '", c.weight_data_type, "'");
  for (const char* stack : kStacks) {
    const T5StackConfig& s = std::string(stack) == "encoder" ? c.encoder : c.decoder;
    const std::string p = std::string(stack) + "_";
    for (auto [name, v] : {std::pair<const char*, int64_t>{"d_model", s.d_model},
                           {"d_kv", s.d_kv},
                           {"d_ff", s.d_ff},
                           {"num_layers", s.num_layers},
                           {"num_heads", s.num_heads},
                           {"relative_attention_num_buckets", s.num_buckets},
                           {"relative_attention_max_distance", s.max_distance}}) {
      TORCH_CHECK(v > 0, kWhat, ": ", p, name, " must be positive, got ", v);
    }
    TORCH_CHECK(s.max_pos_seq_len >= 0, kWhat, ": ", p, "max_pos_seq_len must be >= 0, got ",
                s.max_pos_seq_len);
    TORCH_CHECK(s.eps > 0, kWhat, ": ", p, "layer_norm_epsilon must be positive, got ", s.eps);
    TORCH_CHECK(s.num_heads % tp == 0, kWhat, ": ", p, "num_heads (", s.num_heads,
                ") must be divisible by tensor_para_size (", tp, ")");
    TORCH_CHECK(s.d_ff % tp == 0, kWhat, ": ", p, "d_ff (", s.d_ff,
                ") must be divisible by tensor_para_size (", tp, ")");
    TORCH_CHECK(s.num_layers % pp == 0, kWhat, ": ", p, "num_layers (", s.num_layers,
                ") must be divisible by pipeline_para_size (", pp, ")");
    if (c.is_bart()) {
      TORCH_CHECK(s.max_pos_seq_len >= 1, kWhat, ": ", p,
                  "max_pos_seq_len (rows of the learned position table) must be >= 1 for ",
                  c.model_type, ", got ", s.max_pos_seq_len);
      TORCH_CHECK(!s.gated, kWhat, ": ", p,
                  "gated must be false: the BART family has no gated FFN");
    }
    // The engine's attention kernels are instantiated for a fixed set of head sizes.
    TORCH_CHECK(!engine || (s.d_kv <= 256 &&
                            kernels::attention_head_dim_supported(static_cast<int>(s.d_kv))),
                kWhat, ": ", p, "d_kv must be one of ", kernels::kAttentionHeadDimsText,
                " (the attention kernels' head sizes), got ", s.d_kv);
    if (engine && c.relative_positions()) {
      // The logarithmic buckets divide by log(max_distance / exact) with exact = num_buckets / 4
      // (the encoder's bidirectional half) or / 2: both must be >= 1 and below max_distance;
      // the kernels index the bias table by distances within +-65535.
      TORCH_CHECK(s.num_buckets >= 4 && s.max_distance > s.num_buckets / 2, kWhat, ": ", p,
                  "relative_attention_num_buckets (", s.num_buckets,
                  ") must be >= 4 and below 2 x relative_attention_max_distance (", s.max_distance,
                  ")");
      TORCH_CHECK(s.max_distance <= 65535, kWhat, ": ", p,
                  "relative_attention_max_distance must be <= 65535, got ", s.max_distance);
    }
  }
  // The cross-attention memory's K/V product writes into the encoder's QKV region.
  TORCH_CHECK(!engine || 2 * c.decoder.inner() <= 3 * c.encoder.inner(), kWhat,
              ": 2 x decoder_num_heads x decoder_d_kv (", 2 * c.decoder.inner(),
              ") must be <= 3 x encoder_num_heads x encoder_d_kv (", 3 * c.encoder.inner(), ")");
  TORCH_CHECK(c.encoder.d_model == c.decoder.d_model, kWhat, ": encoder_d_model (",
              c.encoder.d_model, ") must equal decoder_d_model (", c.decoder.d_model,
              "): the stacks share the embedding");
  TORCH_CHECK(c.encoder.gated == c.decoder.gated, kWhat, ": encoder_gated (",
              c.encoder.gated ? "true" : "false", ") must equal decoder_gated (",
              c.decoder.gated ? "true" : "false", "): one FFN form per model");
  TORCH_CHECK(!c.is_bart() || !c.tie_word_embeddings, kWhat,
              ": tie_word_embeddings (T5's d_model ** -0.5 rescale before lm_head) must be false "
              "for ",
              c.model_type);
  for (auto [name, v] : {std::pair<const char*, int64_t>{"pad_token_id", c.pad_token_id},
                         {"eos_token_id", c.eos_token_id},
                         {"decoder_start_token_id", c.decoder_start_token_id}}) {
    TORCH_CHECK(v >= 0 && v < c.vocab_size, kWhat, ": ", name, " (", v,
                ") must be in [0, vocab_size = ", c.vocab_size, ")");
  }
  return c;
}

}  // namespace t5
}  // namespace warpformer
