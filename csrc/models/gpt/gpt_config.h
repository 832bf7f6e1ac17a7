// GptConfig (C++ side): the switches that let one decoder implementation run GPT-2/Megatron, OPT,
// BLOOM, GPT-J and GPT-NeoX. Parsed from the JSON that python/warpformer/config.py writes
// (GptConfig.to_json(); keys are config.ini's, see docs/FORMAT.md), plus this rank's place in the
// tensor/pipeline-parallel grid.
#pragma once

#include <cstdint>
#include <string>

#include "csrc/core/dispatch.h"
#include "csrc/layers/layer_spec.h"
#include "kernels/activations.h"
#include "kernels/attention/attention.h"

namespace warpformer {
namespace gpt {

using kernels::RotaryStyle;

struct GptConfig {
  // from config.ini
  std::string model_name;
  std::string model_variant;
  int64_t head_num = 0;
  int64_t size_per_head = 0;
  int64_t inter_size = 0;
  int64_t num_layer = 0;
  int64_t vocab_size = 0;
  int64_t max_pos_seq_len = 0;
  int64_t start_id = 0;
  int64_t end_id = 0;
  int64_t tensor_para_size = 1;
  double layernorm_eps = 1e-5;
  bool pre_layernorm = true;
  kernels::Activation activation = kernels::Activation::kGeluTanh;
  bool has_positional_encoding = true;
  bool has_pre_decoder_layernorm = false;
  bool has_post_decoder_layernorm = true;
  bool use_attention_linear_bias = false;
  int64_t rotary_embedding_dim = 0;
  RotaryStyle rotary_style = RotaryStyle::kNone;
  double rotary_base = 10000.0;
  bool parallel_residual = false;
  bool parallel_shared_layernorm = false;
  bool has_attention_bias = true;
  bool has_lm_head_bias = false;
  int64_t word_embed_proj_dim = 0;
  // Weight-only quantization of the layers' linear kernels (docs/FORMAT.md): "none", "int8" (per
  // output column) or "int4" (quant_group_size input rows per scale; zero points when
  // asymmetric); quant_lm_head quantizes the head too.
  std::string weight_quant = "none";
  int64_t quant_group_size = 0;
  bool quant_asymmetric = false;
  bool quant_lm_head = false;
  // LLaMA-style decoders (docs/FORMAT.md): RMSNorm pre-norm blocks, a gated MLP (a gate weight
  // whose activation multiplies the up product), grouped-query attention (kv_head_num key/value
  // heads; QKV files hold each rank's Q, K, V heads), optional biases, a sliding attention window
  // and rotary scaling ("dynamic" equals the unscaled rotary up to its original context, past
  // which the engine refuses a call: GptModel::check_positions).
  bool rmsnorm = false;
  int64_t kv_head_num = 0;  // 0: head_num
  bool use_gated_activation = false;
  bool has_attention_out_bias = true;
  bool has_mlp_bias = true;
  int64_t sliding_window = 0;
  std::string rope_scaling_type = "none";
  double rope_scaling_factor = 1.0;
  double rope_scaling_low_freq_factor = 1.0;
  double rope_scaling_high_freq_factor = 4.0;
  int64_t rope_scaling_original_max_position = 0;
  double rope_scaling_beta_fast = 32.0;  // yarn
  double rope_scaling_beta_slow = 1.0;
  double rope_scaling_attention_factor = 1.0;
  bool rope_scaling_truncate = true;

  // this rank
  int64_t tensor_para_rank = 0;
  int64_t pipeline_para_size = 1;
  int64_t pipeline_para_rank = 0;

  // derived
  int64_t hidden() const { return head_num * size_per_head; }
  bool quantized() const { return weight_quant != "none"; }
  int64_t embed_dim() const { return word_embed_proj_dim > 0 ? word_embed_proj_dim : hidden(); }
  int64_t local_heads() const { return head_num / tensor_para_size; }
  int64_t local_hidden() const { return local_heads() * size_per_head; }
  int64_t local_inter() const { return inter_size / tensor_para_size; }
  int64_t kv_heads() const { return kv_head_num > 0 ? kv_head_num : head_num; }
  bool grouped_query() const { return kv_heads() != head_num; }
  // Key/value heads of one rank: split over the ranks, or one (a copy) when there are fewer.
  int64_t local_kv_heads() const {
    return kv_heads() >= tensor_para_size ? kv_heads() / tensor_para_size : 1;
  }
  // Logits: each rank computes local_vocab() columns, its vocabulary slice (the whole vocabulary
  // without tensor parallelism) padded to a multiple of 8 -- an odd width such as GPT-2's 50,257
  // puts the lm_head on a much slower cuBLASLt kernel past 8 rows (benchmarks/HISTORY.md, "The
  // lm_head padded to a multiple of 8"). Logits rows have vocab_padded() columns, the first
  // vocab_size valid; nothing reads the rest.
  int64_t local_vocab() const {
    const int64_t per = (vocab_size + tensor_para_size - 1) / tensor_para_size;
    return (per + 7) / 8 * 8;
  }
  int64_t vocab_padded() const { return local_vocab() * tensor_para_size; }
  // Stages hold equal contiguous layer ranges (num_layer % pipeline_para_size == 0).
  int64_t layers_per_stage() const { return num_layer / pipeline_para_size; }
  int64_t first_layer() const { return pipeline_para_rank * layers_per_stage(); }
  int64_t end_layer() const { return first_layer() + layers_per_stage(); }
  bool first_stage() const { return pipeline_para_rank == 0; }
  bool last_stage() const { return pipeline_para_rank == pipeline_para_size - 1; }

  // Parses and validates; every error names the key and the rule. engine: also what the engine
  // needs beyond the format (a head size its attention kernels are built for).
  static GptConfig from_json(const std::string& json, int64_t tensor_para_rank = 0,
                             int64_t pipeline_para_size = 1, int64_t pipeline_para_rank = 0,
                             bool engine = true);
};

// The LayerSpec of this rank's blocks.
layers::LayerSpec layer_spec(const GptConfig& cfg);

}  // namespace gpt
}  // namespace warpformer
