// T5Model: one encoder-decoder instance (T5, T5 v1.1 / Flan-T5, mT5, UL2, BART, mBART) on one GPU
// (one tensor-parallel rank), built from the layers: the encoder is a stack of the decoder block
// run bidirectionally, the decoder a stack of the same block with a cross-attention sub-block. A
// call encodes its inputs once (encode), writes every decoder layer's cross-attention memory (the
// encoder output's K/V, one slot per batch entry, read by every beam of the entry without a
// copy), and is then a generation::Decoder that the generation session drives for greedy,
// sampling and beam search exactly as it drives the GPT family.
//
// T5's relative position bias is one fp32 table per stack of [heads, 2 * max_distance + 1]
// values, one per clamped key - query distance (the bucket of a distance is constant past
// max_distance), made once at construction from the learned [heads, buckets] weights.
//
// Memory: the encoder's activations (with its per-layer K/V scratch), the cross-attention memory,
// the decoder's KV cache and activations are allocated on first use, sized for the call, and
// grow (never shrink) up to the limits given at construction. No torch here: the torch wrapper
// (csrc/torch/seq2seq_class.cpp) validates tensors and owns the weights.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "csrc/core/communicator.h"
#include "csrc/core/cuda_context.h"
#include "csrc/core/engine_options.h"
#include "csrc/core/gemm.h"
#include "csrc/generation/decoder.h"
#include "csrc/generation/prompt_plan.h"
#include "csrc/layers/decoder_layer.h"
#include "csrc/layers/embedding.h"
#include "csrc/models/t5/t5_config.h"

namespace warpformer {
namespace t5 {

// One stack's weights on this rank (element type = the model dtype).
struct T5StackWeights {
  layers::EmbeddingWeights embedding;        // token rows (learned positions, embedding norm: BART)
  std::vector<layers::LayerWeights> layers;  // qkv fused [d, 3 * inner]
  layers::NormWeights final_norm;            // null gamma: none (BART)
  // T5: the relative attention bias [local heads, buckets], fp32 on the device; null for BART.
  const float* relative_bias = nullptr;
};

struct T5Weights {
  T5StackWeights encoder, decoder;
  // Per decoder layer: the cross-attention's K and V products of the encoder output as one
  // [d, 2 * inner] weight (K heads then V heads) and bias.
  std::vector<layers::Linear> cross_kv;
  layers::LmHeadWeights lm_head;
};

class T5Model final : public generation::Decoder {
 public:
  T5Model(T5Config cfg, T5Weights weights, DType dtype, std::shared_ptr<CudaContext> ctx,
          int64_t max_batch, int64_t max_seq_len, const EngineOptions& options = {},
          Communicator* tp_comm = nullptr);
  ~T5Model() override;
  T5Model(const T5Model&) = delete;
  T5Model& operator=(const T5Model&) = delete;

  const T5Config& config() const { return cfg_; }
  Gemm& gemm() { return *gemm_; }
  int64_t max_batch() const { return max_batch_; }
  int64_t max_seq_len() const { return max_seq_len_; }
  // Attach the tensor-parallel group (size tensor_para_size, rank tensor_para_rank); required
  // before any call when tensor_para_size > 1. Not owned; not during a generation session.
  void set_tensor_parallel(Communicator* comm);
  // Bytes held for the decoder's KV cache and the cross-attention memory, and for activations
  // and the cuBLASLt workspace (grow only).
  size_t cache_bytes() const { return kv_.size() + memory_.size(); }
  size_t workspace_bytes() const {
    return enc_act_.size() + dec_act_.size() + meta_.size() + cross_ws_.size() +
           ctx_->workspace_size();
  }

  // Runs the encoder over ids [batch, seq] (device int32, right-padded; lengths on the host, each
  // 1..seq) and writes every decoder layer's cross-attention memory: entry b's memory is slot b.
  // out (device [batch, seq, d_model] of the model dtype, or null) receives the encoder output,
  // zero past each row's length. The generation session that follows (reserve with this batch)
  // attends to it.
  void encode(const int32_t* ids, const std::vector<int32_t>& lengths, int64_t seq, void* out);

  // ---- generation::Decoder (the decoder stack after encode) ----
  const char* name() const override { return "T5Model"; }
  CudaContext& context() override { return *ctx_; }
  DType dtype() const override { return dtype_; }
  int64_t vocab_size() const override { return cfg_.vocab_size; }
  int64_t logits_stride() const override { return w_.lm_head.local_vocab; }
  void* logits() override { return dec_scratch().logits; }
  Communicator* tensor_group() const override { return comm_; }
  Communicator* pipeline_group() const override { return nullptr; }
  int pipeline_stage() const override { return 0; }
  int pipeline_stages() const override { return 1; }
  int64_t reserve(int64_t rows, int64_t total, const std::vector<int32_t>& lengths) override;
  size_t step_workspace_bytes(int64_t rows) const override;
  size_t buffer_generation() const override {
    return buffer_generation_ + ctx_->workspace_generation();
  }
  int64_t cache_view() const override { return 0; }
  void prefill(const int32_t* ids, const std::vector<int32_t>& lengths,
               const std::vector<int32_t>& past, int64_t seq, int64_t slot_stride,
               void* hidden_out) override;
  void prompt_logits(const int32_t* entry_of_row, int64_t rows) override;
  const void* final_hidden() const override { return final_hidden_; }
  void step(const generation::StepRows& rows, int64_t r0, int64_t n, bool exchange) override;
  void* stage_input() override { return nullptr; }
  void* stage_output() override { return nullptr; }
  size_t hidden_row_bytes() const override { return cfg_.decoder.d_model * dtype_size(dtype_); }
  void drop_graphs() override {}

 private:
  // Regions of the decoder's activation buffer beside the layer buffers.
  struct DecScratch {
    void* last_rows;  // [rows, d] hidden states of the rows whose logits are needed
    void* kept;       // [batch, d] each prompt's last final hidden state (prefill to first step)
    void* logits;     // [rows, local_vocab]
  };
  size_t dec_layout(void* base, int64_t tokens, int64_t rows, layers::LayerBuffers* layer,
                    DecScratch* scratch) const;
  layers::LayerBuffers dec_buffers() const;
  DecScratch dec_scratch() const;
  // The encoder's buffer: layer buffers for `tokens` packed tokens and its self-attention K/V
  // scratch [batch, heads, seq, d_kv] (one layer at a time).
  size_t enc_layout(void* base, int64_t tokens, int64_t batch, int64_t seq,
                    layers::LayerBuffers* layer, void** k, void** v) const;
  void ensure_encoder(int64_t tokens, int64_t batch, int64_t seq);
  void ensure_memory(int64_t batch, int64_t seq);
  void ensure_kv(int64_t slots, int64_t seq);
  void ensure_decoder(int64_t tokens, int64_t rows);
  // The packed index arrays of a prompt pass (generation::pack_prompt, one group) in meta_; for
  // the decoder, also each token's cross-attention slot (its entry) and memory length.
  void upload_index(const generation::PromptIndex& index, const std::vector<int32_t>& extra);
  layers::LayerContext context_for(const layers::LayerSpec& spec);
  // One stack's layers over `tokens` rows in buffers b (the stream in b.x after embedding);
  // leaves the final hidden states in b.n. The decoder's layers read their own KV cache and
  // cross-attention memory; the encoder's share the caches `ai` names.
  void run_stack(const layers::LayerSpec& spec, const T5StackWeights& w,
                 const layers::LayerBuffers& b, int64_t tokens, layers::AttentionInputs ai,
                 bool decoder);
  // T5's [heads, 2M + 1] table of a stack (bidirectional: the encoder's) into buf.
  void make_position_bias(const T5StackConfig& stack, const float* relative_bias,
                          bool bidirectional, DeviceBuffer* buf);

  T5Config cfg_;
  layers::LayerSpec enc_spec_, dec_spec_;
  EngineOptions options_;
  T5Weights w_;
  DType dtype_;
  std::shared_ptr<CudaContext> ctx_;
  std::unique_ptr<Gemm> gemm_;
  Communicator* comm_;
  int64_t max_batch_;
  int64_t max_seq_len_;
  DeviceBuffer enc_bias_, dec_bias_;  // position-bias tables (T5) or empty

  DeviceBuffer enc_act_;
  int64_t enc_tokens_ = 0, enc_batch_ = 0, enc_seq_ = 0;
  DeviceBuffer memory_;  // [dec layers][K, V][batch, heads, mem_seq_, d_kv]
  int64_t mem_batch_ = 0, mem_seq_ = 0;
  std::vector<int32_t> enc_lengths_;  // the last encode's lengths (the entries of the session)
  DeviceBuffer kv_;                   // [dec layers][K, V][slots, heads, kv_seq_, d_kv]
  int64_t kv_slots_ = 0, kv_seq_ = 0;
  DeviceBuffer dec_act_;
  int64_t dec_tokens_ = 0, dec_rows_ = 0;
  DeviceBuffer cross_ws_;  // the prompt pass's cross-attention split-KV scratch
  DeviceBuffer rows_;      // int32 [2, max rows]: each step row's memory slot and length
  int32_t* d_row_entry_ = nullptr;
  int32_t* d_row_len_ = nullptr;
  DeviceBuffer meta_;  // int32 per-call index arrays
  int64_t meta_ints_ = 0;
  size_t buffer_generation_ = 0;
  const void* final_hidden_ = nullptr;
  // views into meta_ filled by upload_index
  int32_t* d_gather_ = nullptr;
  int32_t* d_slot_ = nullptr;
  int32_t* d_pos_ = nullptr;
  int32_t* d_ids_ = nullptr;
  int32_t* d_cu_ = nullptr;
  int32_t* d_seq_slot_ = nullptr;
  int32_t* d_last_ = nullptr;
  int32_t* d_extra_ = nullptr;  // decoder: [2, tokens] each token's memory slot and length
};

// T5's bucket of a key - query distance (transformers' _relative_position_bucket, in fp32 as it
// computes the logarithmic part).
int32_t relative_position_bucket(int64_t distance, bool bidirectional, int64_t num_buckets,
                                 int64_t max_distance);

}  // namespace t5
}  // namespace warpformer
