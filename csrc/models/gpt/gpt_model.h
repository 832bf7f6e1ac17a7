// GptModel: one GPT-family model instance on one GPU (one tensor/pipeline-parallel rank) —
// embedding, this stage's decoder layers, final norm and logits, the KV cache, and the greedy
// generation loop, which runs on the device with no host synchronisation per step.
//
// Memory: the KV cache and the activation workspace are allocated from the context's allocator
// (PyTorch's caching allocator) on first use, sized for what the call needs, and reused by later
// calls; they grow (never shrink) when a call needs more, up to the limits given at construction.
// No torch here: the torch wrapper (csrc/torch/gpt_class.cpp) validates tensors and owns weights.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "csrc/core/communicator.h"
#include "csrc/core/cuda_context.h"
#include "csrc/core/gemm.h"
#include "csrc/layers/decoder_layer.h"
#include "csrc/models/gpt/gpt_config.h"

namespace warpformer {
namespace gpt {

// Device pointers of the model-level weights (element type = the model dtype). e = embed_dim().
struct GptWeights {
  const void* wte = nullptr;          // [V, e]
  const void* wpe = nullptr;          // [P, h] or null
  const void* pre_ln_w = nullptr;     // [h] or null (BLOOM's embedding norm)
  const void* pre_ln_b = nullptr;
  const void* final_ln_w = nullptr;   // [h] or null
  const void* final_ln_b = nullptr;
  const void* lm_head = nullptr;      // [V, e] (may be wte: tied)
  const void* lm_head_b = nullptr;    // [V] or null
  const void* project_in = nullptr;   // [e, h] or null (OPT-350m)
  const void* project_out = nullptr;  // [h, e] or null
  std::vector<layers::LayerWeights> layers;  // this stage's layers, first_layer() .. end_layer()
};

class GptModel {
 public:
  GptModel(GptConfig cfg, GptWeights weights, DType dtype, std::shared_ptr<CudaContext> ctx,
           int64_t max_batch, int64_t max_seq_len, Communicator* tp_comm = nullptr);
  ~GptModel();
  GptModel(const GptModel&) = delete;
  GptModel& operator=(const GptModel&) = delete;

  const GptConfig& config() const { return cfg_; }
  DType dtype() const { return dtype_; }
  CudaContext& context() { return *ctx_; }
  Gemm& gemm() { return *gemm_; }
  int64_t max_batch() const { return max_batch_; }
  int64_t max_seq_len() const { return max_seq_len_; }
  // Bytes currently held for the KV cache and for activations (both grow only).
  size_t kv_cache_bytes() const { return kv_.size(); }
  size_t workspace_bytes() const { return act_.size() + meta_.size() + state_.size(); }

  // Scoring pass. ids: device int32 [batch, seq] right-padded; lengths: host, 1..seq each.
  // logits: device [batch, seq, V] of the model dtype; rows past a sequence's length are zero.
  void forward(const int32_t* ids, const std::vector<int32_t>& lengths, int64_t seq,
               void* logits);

  // Greedy generation of output_len tokens per row. output_ids: device int32 [batch, seq +
  // output_len], pre-filled by the caller with the input ids then end ids; generated tokens go
  // from each row's length on. seq_lengths: device int32 [batch] (length incl. generated tokens,
  // the end id included when produced). end_ids: device int32 [batch].
  void generate_greedy(const int32_t* ids, const std::vector<int32_t>& lengths, int64_t seq,
                       int64_t output_len, const int32_t* end_ids, int32_t* output_ids,
                       int32_t* seq_lengths);

 private:
  struct Meta;  // per-call device index arrays (packing, slots, positions)

  void ensure_kv(int64_t slots, int64_t seq_total);
  void ensure_activations(int64_t tokens, int64_t batch);
  layers::LayerBuffers buffers() const;
  layers::LayerContext layer_context();
  // Packs ids, embeds them and runs this stage's layers; leaves final-normed hidden states of
  // all packed tokens in the `n` buffer. Returns the device packing metadata.
  void prefill(const int32_t* ids, const std::vector<int32_t>& lengths, int64_t seq);
  void embed(const int32_t* token_ids, const int32_t* positions, int64_t tokens, int64_t seq_len);
  void run_layers(int64_t tokens, const layers::AttentionInputs& base);
  // logits [rows, V] of the normed hidden rows `hidden` [rows, h].
  void logits(const void* hidden, int64_t rows, void* out);

  GptConfig cfg_;
  GptWeights w_;
  DType dtype_;
  std::shared_ptr<CudaContext> ctx_;
  std::unique_ptr<Gemm> gemm_;
  Communicator* comm_;
  int64_t max_batch_;
  int64_t max_seq_len_;
  DeviceBuffer alibi_;  // [local_heads] float

  DeviceBuffer kv_;
  int64_t kv_slots_ = 0, kv_seq_ = 0;
  DeviceBuffer act_;
  int64_t act_tokens_ = 0, act_batch_ = 0;
  DeviceBuffer meta_;   // int32 per-call index arrays
  int64_t meta_ints_ = 0;
  DeviceBuffer state_;  // generation state + split-KV workspace
  size_t state_need_ = 0;

  // views into meta_ filled by prefill()
  int32_t* d_gather_ = nullptr;   // [T]  packed token -> b * seq + i
  int32_t* d_slot_ = nullptr;     // [T]
  int32_t* d_pos_ = nullptr;      // [T]
  int32_t* d_cu_ = nullptr;       // [B + 1]
  int32_t* d_iota_ = nullptr;     // [B]  0..B-1 (slots of rows)
  int32_t* d_last_ = nullptr;     // [B]  packed index of each row's last token
  int32_t* d_ids_ = nullptr;      // [T]  packed ids
  int64_t tokens_ = 0, batch_ = 0;
  int32_t* host_flag_ = nullptr;     // pinned: the all-finished flag polled during generation
  cudaEvent_t flag_event_ = nullptr;
};

}  // namespace gpt
}  // namespace warpformer
