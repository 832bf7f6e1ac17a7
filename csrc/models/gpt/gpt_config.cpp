#include "csrc/models/gpt/gpt_config.h"

#include <c10/util/Exception.h>

#include "csrc/core/flat_json.h"
#include "csrc/models/model_config.h"
#include "kernels/attention/attention.h"

namespace warpformer {
namespace gpt {
namespace {

constexpr const char* kWhat = "GptModel config";

// A rotary scaling's parameters are usable: a positive factor, and the pretraining context for
// the kinds that read it.
bool rope_scaling_usable(const GptConfig& c) {
  return c.rope_scaling_factor > 0 &&
         (c.rope_scaling_type == "linear" || c.rope_scaling_original_max_position > 0);
}

}  // namespace

GptConfig GptConfig::from_json(const std::string& json, int64_t tensor_para_rank,
                               int64_t pipeline_para_size, int64_t pipeline_para_rank,
                               bool engine) {
  const FlatJson j = FlatJson::parse(json, kWhat);
  GptConfig c;
  c.model_name = j.get_string("model_name", "gpt");
  c.model_variant = j.get_string("model_variant", "gpt2");
  c.head_num = j.require_int("head_num");
  c.size_per_head = j.require_int("size_per_head");
  c.inter_size = j.require_int("inter_size");
  c.num_layer = j.require_int("num_layer");
  c.vocab_size = j.require_int("vocab_size");
  c.max_pos_seq_len = j.get_int("max_pos_seq_len", 0);
  c.start_id = j.get_int("start_id", 0);
  c.end_id = j.get_int("end_id", 0);
  c.tensor_para_size = j.get_int("tensor_para_size", 1);
  c.layernorm_eps = j.get_double("layernorm_eps", 1e-5);
  const std::string ln_type = j.get_string("layernorm_type", "pre_layernorm");
  TORCH_CHECK(ln_type == "pre_layernorm" || ln_type == "post_layernorm" || ln_type == "rmsnorm",
              kWhat, ": layernorm_type must be pre_layernorm, post_layernorm or rmsnorm, got '",
              ln_type, "'");
  c.pre_layernorm = ln_type != "post_layernorm";
  c.rmsnorm = ln_type == "rmsnorm";
  c.activation = models::config_activation(j.get_string("activation_type", "gelu_tanh"), kWhat,
                                           "activation_type");
  c.has_positional_encoding = j.get_bool("has_positional_encoding", true);
  c.has_pre_decoder_layernorm = j.get_bool("has_pre_decoder_layernorm", false);
  c.has_post_decoder_layernorm = j.get_bool("has_post_decoder_layernorm", true);
  c.use_attention_linear_bias = j.get_bool("use_attention_linear_bias", false);
  c.rotary_embedding_dim = j.get_int("rotary_embedding_dim", 0);
  const std::string style = j.get_string("rotary_style", "interleaved");
  TORCH_CHECK(style == "interleaved" || style == "half", kWhat,
              ": rotary_style must be interleaved or half, got '", style, "'");
  c.rotary_style = c.rotary_embedding_dim == 0 ? RotaryStyle::kNone
                   : style == "half"           ? RotaryStyle::kHalf
                                               : RotaryStyle::kInterleaved;
  c.rotary_base = j.get_double("rotary_base", 10000.0);
  c.parallel_residual = j.get_bool("parallel_residual", false);
  c.parallel_shared_layernorm = j.get_bool("parallel_shared_layernorm", false);
  c.has_attention_bias = j.get_bool("has_attention_bias", true);
  c.has_lm_head_bias = j.get_bool("has_lm_head_bias", false);
  c.word_embed_proj_dim = j.get_int("word_embed_proj_dim", 0);
  c.weight_quant = j.get_string("weight_quant", "none");
  c.quant_group_size = j.get_int("quant_group_size", 0);
  c.quant_asymmetric = j.get_bool("quant_asymmetric", false);
  c.quant_lm_head = j.get_bool("quant_lm_head", false);
  c.kv_head_num = j.get_int("kv_head_num", 0);
  c.use_gated_activation = j.get_bool("use_gated_activation", false);
  c.has_attention_out_bias = j.get_bool("has_attention_out_bias", true);
  c.has_mlp_bias = j.get_bool("has_mlp_bias", true);
  c.sliding_window = j.get_int("sliding_window", 0);
  c.rope_scaling_type = j.get_string("rope_scaling_type", "none");
  c.rope_scaling_factor = j.get_double("rope_scaling_factor", 1.0);
  c.rope_scaling_low_freq_factor = j.get_double("rope_scaling_low_freq_factor", 1.0);
  c.rope_scaling_high_freq_factor = j.get_double("rope_scaling_high_freq_factor", 4.0);
  c.rope_scaling_original_max_position = j.get_int("rope_scaling_original_max_position", 0);
  c.rope_scaling_beta_fast = j.get_double("rope_scaling_beta_fast", 32.0);
  c.rope_scaling_beta_slow = j.get_double("rope_scaling_beta_slow", 1.0);
  c.rope_scaling_attention_factor = j.get_double("rope_scaling_attention_factor", 1.0);
  c.rope_scaling_truncate = j.get_bool("rope_scaling_truncate", true);
  c.tensor_para_rank = tensor_para_rank;
  c.pipeline_para_size = pipeline_para_size;
  c.pipeline_para_rank = pipeline_para_rank;

  for (auto [name, v] : {std::pair<const char*, int64_t>{"head_num", c.head_num},
                         {"size_per_head", c.size_per_head},
                         {"inter_size", c.inter_size},
                         {"num_layer", c.num_layer},
                         {"vocab_size", c.vocab_size},
                         {"tensor_para_size", c.tensor_para_size},
                         {"pipeline_para_size", c.pipeline_para_size}}) {
    TORCH_CHECK(v > 0, kWhat, ": ", name, " must be positive, got ", v);
  }
  TORCH_CHECK(c.head_num % c.tensor_para_size == 0, kWhat, ": head_num (", c.head_num,
              ") must be divisible by tensor_para_size (", c.tensor_para_size, ")");
  TORCH_CHECK(c.inter_size % c.tensor_para_size == 0, kWhat, ": inter_size (", c.inter_size,
              ") must be divisible by tensor_para_size (", c.tensor_para_size, ")");
  TORCH_CHECK(tensor_para_rank >= 0 && tensor_para_rank < c.tensor_para_size, kWhat,
              ": tensor_para_rank must be in [0, ", c.tensor_para_size, "), got ",
              tensor_para_rank);
  TORCH_CHECK(pipeline_para_rank >= 0 && pipeline_para_rank < c.pipeline_para_size, kWhat,
              ": pipeline_para_rank must be in [0, ", c.pipeline_para_size, "), got ",
              pipeline_para_rank);
  TORCH_CHECK(c.num_layer % c.pipeline_para_size == 0, kWhat, ": num_layer (", c.num_layer,
              ") must be divisible by pipeline_para_size (", c.pipeline_para_size, ")");
  const int64_t hd = c.size_per_head;
  TORCH_CHECK(!engine || (hd <= 256 && kernels::attention_head_dim_supported(static_cast<int>(hd))),
              kWhat, ": size_per_head must be one of ", kernels::kAttentionHeadDimsText,
              " (the attention kernels' head sizes), got ", hd);
  TORCH_CHECK(c.rotary_embedding_dim >= 0 && c.rotary_embedding_dim <= hd &&
                  c.rotary_embedding_dim % 2 == 0,
              kWhat, ": rotary_embedding_dim must be even and in [0, size_per_head], got ",
              c.rotary_embedding_dim);
  TORCH_CHECK(!c.has_positional_encoding || c.max_pos_seq_len > 0, kWhat,
              ": max_pos_seq_len must be positive with learned positions, got ", c.max_pos_seq_len);
  TORCH_CHECK(c.layernorm_eps > 0, kWhat, ": layernorm_eps must be positive");
  TORCH_CHECK(!c.parallel_residual || c.pre_layernorm, kWhat,
              ": parallel_residual needs layernorm_type = pre_layernorm");
  TORCH_CHECK(c.end_id >= 0 && c.end_id < c.vocab_size, kWhat, ": end_id (", c.end_id,
              ") must be in [0, vocab_size)");
  TORCH_CHECK(c.weight_quant == "none" || c.weight_quant == "int8" || c.weight_quant == "int4",
              kWhat, ": weight_quant must be none, int8 or int4, got '", c.weight_quant, "'");
  TORCH_CHECK(
      c.weight_quant == "int4" ? c.quant_group_size >= 2 && c.quant_group_size % 2 == 0
                               : c.quant_group_size == 0 && !c.quant_asymmetric,
      kWhat, ": quant_group_size (", c.quant_group_size, ") and quant_asymmetric apply to ",
      "int4 only, whose group size is an even integer >= 2 (weight_quant = ", c.weight_quant, ")");
  TORCH_CHECK(c.quantized() || !c.quant_lm_head, kWhat,
              ": quant_lm_head needs weight_quant int8 or int4");
  const int64_t kv = c.kv_head_num, tp = c.tensor_para_size;
  TORCH_CHECK(kv >= 0 && (kv == 0 || c.head_num % kv == 0), kWhat, ": kv_head_num (", kv,
              ") must divide head_num (", c.head_num, ")");
  TORCH_CHECK(kv == 0 || kv % tp == 0 || tp % kv == 0, kWhat, ": kv_head_num (", kv,
              ") and tensor_para_size (", tp, ") must divide one another");
  TORCH_CHECK(c.sliding_window >= 0, kWhat, ": sliding_window must be >= 0, got ",
              c.sliding_window);
  const std::string& rope = c.rope_scaling_type;
  TORCH_CHECK(
      rope == "none" || rope == "linear" || rope == "dynamic" || rope == "llama3" || rope == "yarn",
      kWhat, ": rope_scaling_type must be none, linear, dynamic, llama3 or yarn, got '", rope, "'");
  TORCH_CHECK(rope == "none" || rope_scaling_usable(c), kWhat, ": rope_scaling_type ", rope,
              " needs rope_scaling_factor > 0 and, except linear, "
              "rope_scaling_original_max_position > 0");
  // Format features whose kernels are not in the engine yet: the reference backend runs them.
  TORCH_CHECK(!engine || !c.use_gated_activation || (!c.parallel_residual && c.pre_layernorm),
              kWhat, ": a gated MLP beside the attention or after a post-norm is not supported by ",
              "the CUDA engine yet; backend='reference' runs this model");
  return c;
}

layers::LayerSpec layer_spec(const GptConfig& c) {
  using layers::MlpPlacement;
  using layers::PositionEncoding;
  layers::LayerSpec s;
  s.hidden = c.hidden();
  s.heads = c.local_heads();
  s.kv_heads = c.local_kv_heads();
  s.head_dim = c.size_per_head;
  s.inter = c.local_inter();
  s.norm = c.rmsnorm ? kernels::NormKind::kRmsNorm : kernels::NormKind::kLayerNorm;
  s.norm_eps = static_cast<float>(c.layernorm_eps);
  s.residual = c.pre_layernorm ? layers::ResidualOrder::kPreNorm : layers::ResidualOrder::kPostNorm;
  s.mlp = !c.parallel_residual          ? MlpPlacement::kSequential
          : c.parallel_shared_layernorm ? MlpPlacement::kParallelSharedNorm
                                        : MlpPlacement::kParallel;
  s.activation = c.activation;
  s.gated = c.use_gated_activation;
  s.position = c.rotary_embedding_dim > 0    ? PositionEncoding::kRotary
               : c.use_attention_linear_bias ? PositionEncoding::kAlibi
               : c.has_positional_encoding   ? PositionEncoding::kLearned
                                             : PositionEncoding::kNone;
  s.rotary_dim = c.rotary_embedding_dim;
  s.rotary_style = c.rotary_style;
  s.rotary_base = static_cast<float>(c.rotary_base);
  s.rotary_mscale =
      c.rope_scaling_type == "yarn" ? static_cast<float>(c.rope_scaling_attention_factor) : 1.f;
  return s;
}

}  // namespace gpt
}  // namespace warpformer
