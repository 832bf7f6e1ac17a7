// GptModel: one GPT-family model instance on one GPU (one tensor/pipeline-parallel rank), built
// from the layers: GptConfig -> LayerSpec, named weights -> Linears, the forward as embedding,
// this stage's decoder blocks, final norm and lm_head, and the memory plan (KV cache, activation
// workspace, prefill groups, prompt graphs). It is a generation::Decoder: the generation session
// (csrc/generation) drives it for greedy, sampling and beam search.
//
// Memory: the KV cache and the activation workspace are allocated from the context's allocator
// (PyTorch's caching allocator) on first use, sized for what the call needs, and reused by later
// calls; they grow (never shrink) when a call needs more, up to the limits given at construction.
// No torch here: the torch wrapper (csrc/torch/gpt_class.cpp) validates tensors and owns weights.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "csrc/core/communicator.h"
#include "csrc/core/cuda_context.h"
#include "csrc/core/engine_options.h"
#include "csrc/core/gemm.h"
#include "csrc/generation/decoder.h"
#include "csrc/generation/graph_cache.h"
#include "csrc/generation/prompt_plan.h"
#include "csrc/layers/decoder_layer.h"
#include "csrc/layers/embedding.h"
#include "csrc/models/gpt/gpt_config.h"

namespace warpformer {
namespace gpt {

// The model-level weights of this rank (element type = the model dtype).
struct GptWeights {
  layers::EmbeddingWeights embedding;        // first stage
  layers::NormWeights final_norm;            // last stage, null gamma: none
  layers::LmHeadWeights lm_head;             // last stage
  std::vector<layers::LayerWeights> layers;  // this stage's layers, first_layer() .. end_layer()
};

class GptModel final : public generation::Decoder {
 public:
  GptModel(GptConfig cfg, GptWeights weights, DType dtype, std::shared_ptr<CudaContext> ctx,
           int64_t max_batch, int64_t max_seq_len, const EngineOptions& options = {},
           Communicator* tp_comm = nullptr);
  ~GptModel() override;
  GptModel(const GptModel&) = delete;
  GptModel& operator=(const GptModel&) = delete;

  const GptConfig& config() const { return cfg_; }
  const EngineOptions& options() const { return options_; }
  Gemm& gemm() { return *gemm_; }
  int64_t max_batch() const { return max_batch_; }
  int64_t max_seq_len() const { return max_seq_len_; }
  // Attach the tensor-parallel group (size tensor_para_size, rank tensor_para_rank); required
  // before any call when tensor_para_size > 1. Not owned. Not during a generation session; the
  // caller then drops its step graphs (they baked the group before).
  void set_tensor_parallel(Communicator* comm);
  // Attach the pipeline-parallel group (size pipeline_para_size, rank pipeline_para_rank): stages
  // pass hidden states with send/recv; the last stage computes logits. Not owned.
  void set_pipeline_parallel(Communicator* comm);
  // Bytes held for the KV cache, and for activations and the cuBLASLt workspace (grow only).
  size_t kv_cache_bytes() const { return kv_.size(); }
  size_t workspace_bytes() const { return act_.size() + meta_.size() + gemm_workspace_bytes(); }
  size_t gemm_workspace_bytes() const { return ctx_->workspace_size(); }

  // The prompt runs through the layers in groups of whole sequences of at most
  // prefill_group_tokens() tokens together (a longer sequence forms a group alone), so the
  // activation buffer is sized for one group; with pipeline parallelism the groups are the
  // micro-batches that keep the stages busy during the prompt. The size is kPrefillGroupTokens,
  // doubled up to kMaxPrefillGroupTokens while a group's activations stay within
  // kPrefillActivationBytes (benchmarks/HISTORY.md, "Prefill groups");
  // EngineOptions::prefill_tokens sets another size.
  static constexpr int64_t kPrefillGroupTokens = 2048;
  static constexpr int64_t kMaxPrefillGroupTokens = 4096;
  static constexpr int64_t kPrefillActivationBytes = int64_t{64} << 20;
  int64_t prefill_group_tokens() const { return prefill_group_tokens_; }
  // Bytes of the activation buffer per prompt token of a group (what layout() takes per token).
  int64_t activation_bytes_per_token() const;

  // Scoring pass. ids: device int32 [batch, seq] right-padded; lengths: host, 1..seq each.
  // logits: device [batch, seq, V] of the model dtype; rows past a sequence's length are zero.
  void forward(const int32_t* ids, const std::vector<int32_t>& lengths, int64_t seq, void* logits);
  // The attention window of the calls that follow (a request's memory_len: each token attends to
  // its last `window` positions; 0: none), on top of the config's sliding_window. Graphs
  // captured under another window are not replayed (buffer_generation changes).
  void set_attention_window(int64_t window);
  // Interactive sessions keep their rows' KV caches between calls: hold_slots reserves `rows`
  // slots of at least `max_len` positions (growing the cache, whose held slots keep their
  // contents) and returns the first; use_slots(first) makes the calls that follow run in that
  // range (slot r of a call is first + r), use_slots(-1) returns to the shared range above every
  // held one. Not during a generation session.
  int64_t hold_slots(int64_t rows, int64_t max_len);
  void release_slots(int64_t first);
  void use_slots(int64_t first);
  // The prompt table of the calls that follow (ids vocab + j embed as its row j; count 0:
  // none); the caller keeps the rows alive while they are set. Prompt passes with a table run
  // eagerly (a graph would bake the rows' address).
  void set_prompt_table(const layers::PromptTable& table) { prompt_table_ = table; }
  // (prompt graphs held, prompt passes replayed from one so far): for tests and benchmarks.
  std::pair<int64_t, int64_t> prompt_graph_stats() const {
    return {static_cast<int64_t>(prompt_graphs_.size()), prompt_replays_};
  }

  // ---- generation::Decoder ----
  const char* name() const override { return "GptModel"; }
  CudaContext& context() override { return *ctx_; }
  DType dtype() const override { return dtype_; }
  int64_t vocab_size() const override { return cfg_.vocab_size; }
  int64_t logits_stride() const override { return cfg_.vocab_padded(); }
  void* logits() override { return scratch().last_logits; }
  Communicator* tensor_group() const override { return comm_; }
  Communicator* pipeline_group() const override { return pp_comm_; }
  int pipeline_stage() const override { return static_cast<int>(cfg_.pipeline_para_rank); }
  int pipeline_stages() const override { return static_cast<int>(cfg_.pipeline_para_size); }
  int64_t reserve(int64_t rows, int64_t total, const std::vector<int32_t>& lengths) override;
  size_t step_workspace_bytes(int64_t rows) const override;
  size_t buffer_generation() const override {
    return buffer_generation_ + ctx_->workspace_generation();
  }
  int64_t cache_view() const override { return slot_base(); }
  void prefill(const int32_t* ids, const std::vector<int32_t>& lengths,
               const std::vector<int32_t>& past, int64_t seq, int64_t slot_stride,
               void* hidden_out) override;
  void prompt_logits(const int32_t* entry_of_row, int64_t rows) override;
  const void* final_hidden() const override { return final_hidden_; }
  void step(const generation::StepRows& rows, int64_t r0, int64_t n, bool exchange) override;
  void* stage_input() override { return buffers().x; }
  void* stage_output() override { return buffers().n; }
  size_t hidden_row_bytes() const override { return cfg_.hidden() * dtype_size(dtype_); }
  void drop_graphs() override { prompt_graphs_.clear(); }

 private:
  // Room for `slots` slots of the current range (use_slots) of seq_total positions each.
  void ensure_kv(int64_t slots, int64_t seq_total);
  // Reallocates the cache for new_slots x new_seq, copying the held slots' contents over.
  void grow_kv(int64_t new_slots, int64_t new_seq);
  // The first slot of the current range and the slots it spans.
  int64_t slot_base() const { return view_base_ >= 0 ? view_base_ : held_end_; }
  int64_t view_slots() const { return kv_slots_ - slot_base(); }
  void ensure_activations(int64_t tokens, int64_t batch);
  layers::LayerBuffers buffers() const;
  // Regions of the activation buffer beside the layer buffers.
  struct Scratch {
    void* emb;          // [tokens, e] word embeddings before project_in (or null)
    void* last_rows;    // [rows, max(h, e)] hidden states of the rows whose logits are needed
    void* proj;         // [rows, max(h, e)] project_out scratch; from a generation prefill to
                        // the first step also the final hidden state of each prompt's last token
    void* last_logits;  // [rows, vocab_padded]
    void* tp_local;     // [rows, local_vocab] this rank's logits (tensor parallel) or null
    void* tp_gathered;  // [tp, rows, local_vocab] all-gathered slices or null
  };
  Scratch scratch() const;
  // The one carve-up of the activation buffer (base null: sizes only) for `tokens` packed tokens
  // and `rows` logit rows; returns the bytes it spans.
  size_t layout(void* base, int64_t tokens, int64_t rows, layers::LayerBuffers* layer,
                Scratch* scratch) const;
  layers::LayerContext layer_context();
  using PrefillGroup = generation::PrefillGroup;
  // Splits the batch into as few prefill groups as prefill_group_tokens() allows, of about equal
  // size (none over it unless one sequence is), and decides whether the pass runs as a captured
  // prompt graph (prompt_tokens_); returns the token count the activation buffer must hold.
  int64_t plan_prefill(const std::vector<int32_t>& lengths);
  int64_t prefill_group_size() const;
  void attach(Communicator* comm, const char* kind, int64_t size, int64_t rank,
              Communicator** slot);
  // Packs ids and runs each planned group through embedding (or the receive from the previous
  // stage) and this stage's layers. On the last stage, `done(g)` runs after each group with the
  // group's final-normed hidden states in the `n` buffer, [g.tokens(), h]. Sequence b goes to KV
  // slot b * slot_stride.
  void run_prefill(const int32_t* ids, const std::vector<int32_t>& lengths,
                   const std::vector<int32_t>& past, int64_t seq, int64_t slot_stride,
                   const std::function<void(const PrefillGroup&)>& done);
  void embed(const int32_t* token_ids, const int32_t* positions, int64_t tokens, int64_t seq_len);
  void prompt_body(int64_t t0, int64_t tokens, int64_t seq, const layers::AttentionInputs& ai);
  void run_layers(int64_t tokens, const layers::AttentionInputs& base);
  void stage_recv(int64_t tokens);  // hidden states [tokens, h] from the previous stage into x
  void stage_send(int64_t tokens);  // n (the stage's output) to the next stage
  void broadcast_from_last_stage(void* data, int64_t bytes);
  void lm_head(const void* hidden, int64_t rows, void* out);  // logits of final hidden rows
  // A one-group pass on one GPU runs over its token count padded up (prompt_graph_tokens: to a
  // multiple of 16 up to 128 tokens, of 64 beyond), the padded tokens' KV writes skipped (slot
  // -1), its attention grid sized for the longest sequence rounded up to 64; so prompts of other
  // lengths and contents share one graph of the embedding and every layer. The key holds what
  // those launches bake. A key's first pass runs eagerly (it plans the products and may grow
  // their workspace, which a capture cannot); its second is captured.
  int64_t prompt_graph_tokens(int64_t tokens) const;
  void run_prompt(int64_t tokens, int64_t seq, const layers::AttentionInputs& ai);
  struct PromptKey {
    int64_t tokens = 0, batch = 0, max_seqlen = 0, view = 0;
    const void* meta = nullptr;
    size_t generation = 0;
    bool operator==(const PromptKey& o) const {
      return tokens == o.tokens && batch == o.batch && max_seqlen == o.max_seqlen &&
             view == o.view && meta == o.meta && generation == o.generation;
    }
  };
  // Room for the LAMBADA-shaped workload's keys, and more when a buffer moves
  // (benchmarks/HISTORY.md, "Measured: the `[n, k]` GEMV on the layer products, prompts padded to
  // 32 past 128 tokens, the graphs' memory").
  static constexpr size_t kMaxPromptGraphs = 48;

  GptConfig cfg_;
  layers::LayerSpec spec_;
  EngineOptions options_;
  GptWeights w_;
  DType dtype_;
  std::shared_ptr<CudaContext> ctx_;
  std::unique_ptr<Gemm> gemm_;
  Communicator* comm_;
  Communicator* pp_comm_ = nullptr;
  int64_t max_batch_;
  int64_t max_seq_len_;
  DeviceBuffer alibi_;            // [local_heads] float
  DeviceBuffer rotary_inv_freq_;  // [rotary_dim / 2] float, for the fused decode attention

  DeviceBuffer kv_;
  int64_t kv_slots_ = 0, kv_seq_ = 0;
  std::map<int64_t, int64_t> held_;  // hold_slots: first slot -> rows
  int64_t held_end_ = 0;             // past the last held slot: where the shared range starts
  int64_t view_base_ = -1;           // use_slots (-1: the shared range)
  int64_t shared_slots_ = 0;         // the most slots a call in the shared range asked for
  DeviceBuffer act_;
  int64_t act_tokens_ = 0, act_batch_ = 0;
  DeviceBuffer meta_;  // int32 per-call index arrays
  int64_t meta_ints_ = 0;
  size_t buffer_generation_ = 0;  // bumped whenever a buffer a graph may bake is reallocated
  int64_t call_window_ = 0;       // set_attention_window
  layers::PromptTable prompt_table_;

  int64_t prefill_group_tokens_ = 0;
  std::vector<PrefillGroup> groups_;  // set by plan_prefill
  int64_t prompt_tokens_ = 0;         // set by plan_prefill: the padded count, or 0 (no graph)
  generation::GraphCache<PromptKey> prompt_graphs_{kMaxPromptGraphs};
  int64_t prompt_replays_ = 0;
  const void* final_hidden_ = nullptr;  // final_hidden(): set by prompt_logits and step
  // views into meta_ filled by run_prefill
  int32_t* d_gather_ = nullptr;  // [T]  packed token -> b * seq + i
  int32_t* d_slot_ = nullptr;    // [T]
  int32_t* d_pos_ = nullptr;     // [T]
  int32_t* d_cu_ = nullptr;      // [B + groups] per group, its sequences' starts (from 0) + end
  int32_t* d_iota_ = nullptr;    // [B]  KV slot of each sequence
  int32_t* d_last_ = nullptr;    // [B]  index of each sequence's last token within its group
  int32_t* d_ids_ = nullptr;     // [T]  packed ids
  int32_t* d_past_ = nullptr;    // [B]  positions each sequence's slot held before the pass
};

}  // namespace gpt
}  // namespace warpformer
