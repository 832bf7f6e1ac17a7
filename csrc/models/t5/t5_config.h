// T5Config (C++ side): an encoder-decoder model of the T5 family (T5, T5 v1.1 / Flan-T5, mT5, UL2)
// or the BART family (BART, mBART), as converted into FT's layouts (docs/FORMAT.md, "T5 family",
// "BART family"). Parsed from the flat JSON that python/warpformer/t5_config.py writes
// (T5Config.to_json(): model keys plain, each stack's keys prefixed "encoder_" / "decoder_"), plus
// this rank's place in the tensor/pipeline-parallel grid.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/activations.h"

namespace warpformer {
namespace t5 {

// One stack (the encoder or the decoder). JSON keys: <stack>_<field> (<stack>_layer_norm_epsilon
// for eps, <stack>_relative_attention_num_buckets / _max_distance for the bucket fields).
struct T5StackConfig {
  int64_t d_model = 0;          // model width (both stacks share it: one embedding)
  int64_t d_kv = 0;             // head size; need not be d_model / num_heads (T5 v1.1, mT5)
  int64_t d_ff = 0;             // FFN width
  int64_t num_layers = 0;       // layers of this stack (UL2's decoder may differ from its encoder)
  int64_t num_heads = 0;        // attention heads (self and, in the decoder, cross)
  int64_t num_buckets = 32;     // T5: relative-position buckets (HF relative_attention_num_buckets)
  int64_t max_distance = 128;   // T5: distance past which every offset shares the last bucket
  int64_t max_pos_seq_len = 0;  // BART: rows of the learned position table; 0 for T5
  double eps = 1e-6;            // the norms' epsilon (T5: RMSNorm; BART: LayerNorm, 1e-5)
  // The FFN's activation: warpformer's names in the JSON (relu, gelu_erf, gelu_tanh, silu; the
  // Python side has translated HF's), through the families' shared mapping.
  kernels::Activation activation = kernels::Activation::kRelu;
  bool gated = false;  // gated FFN: act(x wi) * (x wi2) (T5 v1.1, mT5, UL2)

  int64_t inner() const { return num_heads * d_kv; }  // Q/K/V width, the out projection's input
  // This rank's heads, Q/K/V width and FFN width under tensor parallelism of `tp` ranks.
  int64_t local_heads(int64_t tp) const { return num_heads / tp; }
  int64_t local_inner(int64_t tp) const { return local_heads(tp) * d_kv; }
  int64_t local_ff(int64_t tp) const { return d_ff / tp; }
};

struct T5Config {
  T5StackConfig encoder, decoder;
  int64_t vocab_size = 0;  // rows of the embedding(s) and of lm_head
  int64_t pad_token_id = 0;
  int64_t eos_token_id = 1;
  int64_t decoder_start_token_id = 0;  // the decoder's first input token
  // T5 only: scale the decoder output by d_model ** -0.5 before lm_head (original T5, FT's and
  // HF 4's meaning of the key); the head is a file of its own either way. Never true for BART.
  bool tie_word_embeddings = true;
  std::string model_type = "t5";          // the family switch: t5, mt5, bart, mbart
  std::string weight_data_type = "fp32";  // the files' element type: fp32, fp16, bf16
  int64_t tensor_para_size = 1;

  // this rank
  int64_t tensor_para_rank = 0;
  int64_t pipeline_para_size = 1;
  int64_t pipeline_para_rank = 0;

  // derived
  // BART family: learned positions, LayerNorm with biases, a bias beside every projection and
  // norm, an embedding LayerNorm, scores scaled by d_kv ** -0.5, final_logits_bias.
  bool is_bart() const { return model_type == "bart" || model_type == "mbart"; }
  // Norm before each sublayer and a final norm per stack (T5, mBART); BART alone norms after the
  // residual add and has no final norms.
  bool pre_layernorm() const { return model_type != "bart"; }
  // T5 family: relative position buckets added to the attention scores.
  bool relative_positions() const { return !is_bart(); }
  int64_t d_model() const { return decoder.d_model; }
  // Pipeline stages hold equal contiguous layer ranges of each stack (num_layers %
  // pipeline_para_size == 0 for both).
  int64_t first_layer(const T5StackConfig& s) const {
    return pipeline_para_rank * (s.num_layers / pipeline_para_size);
  }
  int64_t end_layer(const T5StackConfig& s) const {
    return first_layer(s) + s.num_layers / pipeline_para_size;
  }

  // Parses and validates; every error names the key and the rule. engine: also what the engine
  // needs beyond the format (a head size its attention kernels are built for); the weight table
  // op parses with engine = false, so a model the kernels cannot run still converts and runs on
  // the reference backend.
  static T5Config from_json(const std::string& json, int64_t tensor_para_rank = 0,
                            int64_t pipeline_para_size = 1, int64_t pipeline_para_rank = 0,
                            bool engine = true);
};

}  // namespace t5
}  // namespace warpformer
