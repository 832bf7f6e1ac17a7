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
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "csrc/core/communicator.h"
#include "csrc/core/cuda_context.h"
#include "csrc/core/engine_options.h"
#include "csrc/core/gemm.h"
#include "csrc/layers/decoder_layer.h"
#include "csrc/models/gpt/gpt_config.h"
#include "kernels/sampling/beam_search.h"

namespace warpformer {
namespace gpt {

// Device pointers of the model-level weights (element type = the model dtype). e = embed_dim().
struct GptWeights {
  const void* wte = nullptr;       // [V, e]
  const void* wpe = nullptr;       // [P, h] or null
  const void* pre_ln_w = nullptr;  // [h] or null (BLOOM's embedding norm)
  const void* pre_ln_b = nullptr;
  const void* final_ln_w = nullptr;  // [h] or null
  const void* final_ln_b = nullptr;
  const void* lm_head = nullptr;             // [local_vocab, e] (may be wte, tied, padded in place)
  const void* lm_head_b = nullptr;           // [local_vocab] or null
  const void* project_in = nullptr;          // [e, h] or null (OPT-350m)
  const void* project_out = nullptr;         // [h, e] or null
  std::vector<layers::LayerWeights> layers;  // this stage's layers, first_layer() .. end_layer()
};

// Options of a generation session: per-row device arrays of rows = batch * beam_width entries
// (null = the default), owned by the caller until decode_finish. See docs/GENERATION_API.md.
struct DecodeOptions {
  int beam_width = 1;
  const int32_t* end_ids = nullptr;           // [rows] (required)
  const int32_t* top_k = nullptr;             // [rows] (1 = greedy)
  const float* top_p = nullptr;               // [rows]
  const float* temperature = nullptr;         // [rows]
  const float* repetition_penalty = nullptr;  // [rows]
  const float* presence_penalty = nullptr;    // [rows]
  const float* frequency_penalty = nullptr;   // [rows]
  const int32_t* min_length = nullptr;        // [rows]
  const uint64_t* seeds = nullptr;            // [rows]
  const int32_t* input_lengths = nullptr;     // [rows] prompt length of each row
  const int32_t* bad_words = nullptr;         // [2, L] or [rows, 2, L]
  int64_t bad_words_row_stride = 0;
  int bad_words_len = 0;
  const int32_t* stop_words = nullptr;  // [2, L] or [rows, 2, L]
  int64_t stop_words_row_stride = 0;
  int stop_words_len = 0;
  bool greedy = true;         // every row top_k == 1 and nothing to process: argmax fast path
  bool needs_counts = false;  // repetition/presence/frequency penalties in use
  float length_penalty = 1.f;
  float diversity_rate = 0.f;
};

// Where a session writes (device). Beam search writes them at decode_finish, sorted best first.
struct DecodeOutputs {
  int32_t* output_ids = nullptr;        // [batch, beam, seq + output_len], pre-filled by the
                                        // caller with the prompt then end ids
  int32_t* sequence_lengths = nullptr;  // [batch, beam], pre-filled with the prompt lengths
  float* cum_log_probs = nullptr;       // [batch, beam] or null
  float* output_log_probs = nullptr;    // [batch, beam, output_len] or null
};

class GptModel {
 public:
  GptModel(GptConfig cfg, GptWeights weights, DType dtype, std::shared_ptr<CudaContext> ctx,
           int64_t max_batch, int64_t max_seq_len, const EngineOptions& options = {},
           Communicator* tp_comm = nullptr);
  ~GptModel();
  GptModel(const GptModel&) = delete;
  GptModel& operator=(const GptModel&) = delete;

  const GptConfig& config() const { return cfg_; }
  const EngineOptions& options() const { return options_; }
  DType dtype() const { return dtype_; }
  CudaContext& context() { return *ctx_; }
  // Attach the tensor-parallel group (size tensor_para_size, rank tensor_para_rank); required
  // before any call when tensor_para_size > 1. Not owned.
  void set_tensor_parallel(Communicator* comm);
  // Attach the pipeline-parallel group (size pipeline_para_size, rank pipeline_para_rank): stages
  // pass hidden states with send/recv; the last stage computes logits and selects tokens and
  // shares the generation state (and the final outputs) with the other stages; decode steps run
  // as micro-batches round the stages (decode_steps_split). Not owned.
  void set_pipeline_parallel(Communicator* comm);
  Gemm& gemm() { return *gemm_; }
  int64_t max_batch() const { return max_batch_; }
  int64_t max_seq_len() const { return max_seq_len_; }
  // Bytes currently held for the KV cache, and for activations, session state and the cuBLASLt
  // workspace (all grow only).
  size_t kv_cache_bytes() const { return kv_.size(); }
  size_t workspace_bytes() const {
    return act_.size() + meta_.size() + state_.size() + gemm_workspace_bytes();
  }
  // The cuBLASLt workspace: what the algorithms chosen so far need (Gemm::kMaxWorkspaceBytes
  // at most).
  size_t gemm_workspace_bytes() const { return ctx_->workspace_size(); }

  // The prompt runs through the layers in groups of whole sequences of at most
  // prefill_group_tokens() tokens together (a longer sequence forms a group alone), so the
  // activation buffer is sized for one group, not for the whole batch; with pipeline parallelism
  // the groups are the micro-batches that keep the stages busy at once during the prompt. The
  // size is kPrefillGroupTokens, doubled up to kMaxPrefillGroupTokens while the group's
  // activations (activation_bytes_per_token) stay within kPrefillActivationBytes: gpt2-medium and
  // bloom-560m run 4,096-token groups in fp16 (batch-64 prompts 9-12% faster than with 2,048,
  // peak memory under HF's), wider models 2,048 (groups of about 2,700 were slower than both;
  // benchmarks/HISTORY.md). EngineOptions::prefill_tokens sets another size.
  static constexpr int64_t kPrefillGroupTokens = 2048;
  static constexpr int64_t kMaxPrefillGroupTokens = 4096;
  static constexpr int64_t kPrefillActivationBytes = int64_t{64} << 20;
  int64_t prefill_group_tokens() const { return prefill_group_tokens_; }
  // Bytes of the activation buffer per prompt token of a group (what layout() takes per token):
  // x, n and p (o); y only for post-norm layers (pre-norm layers keep the stream in x past
  // kGemvMaxRows rows); the qkv / q / attention-output region or the MLP hidden, whichever is
  // larger; OPT-350m's narrow embedding.
  int64_t activation_bytes_per_token() const;

  // Scoring pass. ids: device int32 [batch, seq] right-padded; lengths: host, 1..seq each.
  // logits: device [batch, seq, V] of the model dtype; rows past a sequence's length are zero.
  void forward(const int32_t* ids, const std::vector<int32_t>& lengths, int64_t seq, void* logits);

  // ---- generation: a session of decode_start, decode_step (repeatedly), decode_finish ----
  // ids: device int32 [batch, seq] right-padded; lengths: host. Options and outputs are device
  // arrays owned by the caller for the whole session (see DecodeOptions / DecodeOutputs).
  void decode_start(const int32_t* ids, const std::vector<int32_t>& lengths, int64_t seq,
                    int64_t output_len, const DecodeOptions& options, const DecodeOutputs& outputs);
  // Runs up to max_steps generation steps (the first produces each row's first new token from the
  // prompt's logits). Returns the number run; 0 once every row has ended or output_len tokens
  // exist. Launches only: the work is ordered on the stream, nothing waits for it.
  int64_t decode_step(int64_t max_steps);
  // Writes the final outputs (beam search: the best hypotheses, sorted) and ends the session.
  void decode_finish();
  // Ends a session after an error, leaving the instance usable (outputs are unspecified).
  void decode_abort();
  bool decode_active() const { return session_.active; }
  // (prompt graphs held, prompt passes replayed from one so far): for tests and benchmarks.
  std::pair<int64_t, int64_t> prompt_graph_stats() const {
    return {static_cast<int64_t>(prompt_graphs_.size()), prompt_replays_};
  }
  int64_t decode_tokens_done() const { return session_.steps_done; }
  // Greedy generation in one call (decode_start with greedy options + steps + finish).
  void generate_greedy(const int32_t* ids, const std::vector<int32_t>& lengths, int64_t seq,
                       int64_t output_len, const int32_t* end_ids, int32_t* output_ids,
                       int32_t* seq_lengths);

 private:
  struct Meta;  // per-call device index arrays (packing, slots, positions)

  void ensure_kv(int64_t slots, int64_t seq_total);
  void ensure_activations(int64_t tokens, int64_t batch);
  layers::LayerBuffers buffers() const;
  // Regions of the activation buffer beside the layer buffers.
  struct Scratch {
    void* emb;          // [tokens, e] word embeddings before project_in (or null)
    void* last_rows;    // [rows, max(h, e)] hidden states of the rows whose logits are needed
    void* proj;         // [rows, max(h, e)] project_out scratch; from decode_start to the first
                        // step also the final hidden state of each prompt's last token [batch, h]
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
  // A group of the prompt pass: sequences [b0, b1), packed tokens [t0, t1).
  struct PrefillGroup {
    int64_t b0 = 0, b1 = 0, t0 = 0, t1 = 0;
    int32_t max_len = 0;
    int64_t tokens() const { return t1 - t0; }
  };
  // Splits the batch into as few prefill groups as prefill_group_tokens() allows, of about equal
  // size (none over it unless one sequence is), and decides whether the pass runs as a captured
  // prompt graph (prompt_tokens_); returns the token count the activation buffer must hold (the
  // largest group's, or the graph's padded count).
  int64_t plan_prefill(const std::vector<int32_t>& lengths);
  // The group size: EngineOptions::prefill_tokens, else as prefill_group_tokens() says.
  int64_t prefill_group_size() const;
  // Refuses a communicator whose ranks would cut the prompt, or split decode steps, differently
  // (`kind`: "tensor" or "pipeline", naming the group).
  void check_same_schedule(Communicator* comm, const char* kind);
  // set_tensor_parallel / set_pipeline_parallel: checks `comm` against the group's size and this
  // rank, then installs it in `*slot`, dropping the step graphs that baked the one before.
  void attach(Communicator* comm, const char* kind, int64_t size, int64_t rank,
              Communicator** slot);
  // Packs ids and runs each group planned by plan_prefill through embedding (or the receive
  // from the previous stage) and this stage's layers. On the last stage, `done(g)` runs after
  // each group with the group's final-normed hidden states in the `n` buffer, [g.tokens(), h].
  // slot_stride: sequence b goes to KV slot b * slot_stride (beam search prefills each prompt
  // once, into the slot of its beam 0).
  void prefill(const int32_t* ids, const std::vector<int32_t>& lengths, int64_t seq,
               int64_t slot_stride, const std::function<void(const PrefillGroup&)>& done);
  void embed(const int32_t* token_ids, const int32_t* positions, int64_t tokens, int64_t seq_len);
  // One group's embedding (or, past the first pipeline stage, its hidden states received from
  // the previous stage) and this stage's layers over the `tokens` packed tokens from t0.
  void prompt_body(int64_t t0, int64_t tokens, int64_t seq, const layers::AttentionInputs& ai);
  void run_layers(int64_t tokens, const layers::AttentionInputs& base);
  void stage_recv(int64_t tokens);  // hidden states [tokens, h] from the previous stage into x
  void stage_send(int64_t tokens);  // x to the next stage
  void broadcast_from_last_stage(void* data, int64_t bytes);
  // logits [rows, V] of the normed hidden rows `hidden` [rows, h].
  void logits(const void* hidden, int64_t rows, void* out);

  GptConfig cfg_;
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
  DeviceBuffer act_;
  int64_t act_tokens_ = 0, act_batch_ = 0;
  DeviceBuffer meta_;  // int32 per-call index arrays
  int64_t meta_ints_ = 0;
  DeviceBuffer state_;  // generation state + split-KV workspace
  size_t state_need_ = 0;

  int64_t prefill_group_tokens_ = 0;
  std::vector<PrefillGroup> groups_;  // set by plan_prefill
  // views into meta_ filled by prefill()
  int32_t* d_gather_ = nullptr;   // [T]  packed token -> b * seq + i
  int32_t* d_slot_ = nullptr;     // [T]
  int32_t* d_pos_ = nullptr;      // [T]
  int32_t* d_cu_ = nullptr;       // [B + groups] per group, its sequences' starts (from 0) + end
  int32_t* d_iota_ = nullptr;     // [B]  KV slot of each sequence
  int32_t* d_last_ = nullptr;     // [B]  index of each sequence's last token within its group
  int32_t* d_ids_ = nullptr;      // [T]  packed ids
  int32_t* host_flag_ = nullptr;  // pinned: the all-finished flag polled during generation
  cudaEvent_t flag_event_ = nullptr;
  // Generation and scoring run on a stream of the model's own (PyTorch's default current stream
  // is the legacy default stream, which cannot be captured into a CUDA graph), ordered after
  // the caller's stream on entry and before it on exit of every decode_* call and forward: an
  // instance's work runs in call order whatever streams its callers use.
  cudaStream_t decode_stream_ = nullptr;
  cudaEvent_t order_event_ = nullptr;
  cudaStream_t caller_stream_ = nullptr;
  void enter_decode_stream();
  void leave_decode_stream();
  // Runs the enclosing decode_* or forward call on decode_stream_ (entered here, left on scope
  // exit).
  struct StreamScope {
    GptModel* m;
    explicit StreamScope(GptModel* model) : m(model) { m->enter_decode_stream(); }
    ~StreamScope() { m->leave_decode_stream(); }
    StreamScope(const StreamScope&) = delete;
    StreamScope& operator=(const StreamScope&) = delete;
  };

  // The generation session (gpt_decode.cpp).
  struct Session {
    bool active = false;
    int64_t batch = 0, beam = 1, rows = 0, seq = 0, output_len = 0, total = 0;
    int64_t steps_done = 0;
    DecodeOptions opt;
    DecodeOutputs out;
    // device views into state_ (rows = batch * beam)
    int32_t* next_tok = nullptr;       // [rows] token fed to the next step
    int32_t* cur_pos = nullptr;        // [rows]
    int32_t* attn_len = nullptr;       // [rows]
    int32_t* finished = nullptr;       // [rows]
    int32_t* iota = nullptr;           // [rows] 0..rows-1: the KV slot of each row
    int32_t* sampled = nullptr;        // [rows]
    int32_t* first_rows = nullptr;     // [rows] batch entry (row of scratch proj) of each row
    int32_t* in_len_rows = nullptr;    // [rows] prompt length of each row
    int32_t* in_len_batch = nullptr;   // [batch]
    int32_t* end_ids_batch = nullptr;  // [batch]
    int32_t* row0_index = nullptr;     // [batch] b * beam
    int32_t* all_done = nullptr;       // [1]
    float* token_lp = nullptr;         // [rows]
    float* proc_logits = nullptr;      // [rows, V] fp32 processed logits / log probs
    int32_t* counts = nullptr;         // [rows, V] token counts (penalties)
    // Greedy step scratch (kernels::GreedyStepParams; arrivals zeroed at decode_start).
    uint32_t* greedy_arrivals = nullptr;  // [rows]
    float* greedy_values = nullptr;       // [rows, kernels::greedy_step_chunks(V)]
    int32_t* greedy_indices = nullptr;    // [rows, kernels::greedy_step_chunks(V)]
    float* split = nullptr;               // split-KV attention workspace
    size_t split_bytes = 0;
    void* beam_ws = nullptr;  // beam search scratch
    size_t beam_ws_bytes = 0;
    kernels::BeamSearchState beam_state{};
    bool flag_pending = false;
    bool stop = false;
    // Where token selection writes the tokens and lengths and reads the end ids (non-beam rows):
    // the caller's outputs, or, for a session whose step graph others may share (`shared`:
    // greedy on one GPU), copies of them in state_ with the KV capacity as row
    // stride, filled at decode_start and copied back after every decode_step call (sync_out).
    int32_t* ids = nullptr;  // [rows, ids_stride]
    int64_t ids_stride = 0;
    int32_t* lengths = nullptr;        // [rows]
    const int32_t* end_ids = nullptr;  // [rows]
    bool shared = false;
    uint64_t serial = 0;  // this session's number (StepKey of an unshared session)
  };
  size_t session_layout(char* base);  // carve (or measure) the session's device state
  void decode_step_body();            // one step's launches (captured into a graph when possible)
  void sync_out();                    // a shared session's tokens and lengths to the caller's
  // Greedy / sampling / beam selection + state update of rows [r0, r0 + n) (beam: all rows).
  void select_tokens(int64_t r0, int64_t n);
  layers::AttentionInputs decode_attention(int64_t r0, int64_t n);  // rows [r0, r0 + n)
  // Pipeline parallelism: how many micro-batches a decode step is split into (one per stage when
  // the session is not beam search and has at least as many rows as stages; else 1), and `steps`
  // steps run that way (gpt_decode.cpp explains the schedule; runs shorter than kMinSplitSteps take
  // whole steps).
  int64_t decode_micro_batches() const;
  void decode_steps_split(int64_t steps);
  void share_state();  // pipeline parallel: state from the last stage

  // Captured decode steps (gpt_step_graphs.cpp). A step graph bakes the buffers it launches on; the
  // key names everything that decides them, so a graph serves every session with its key: a shared
  // session's key (serial 0) holds its row counts, the state_ block and the generation of the
  // buffers, and greedy sessions of one batch size on one GPU share a graph; any other session's
  // key holds its own serial, so its graph dies with it.
  struct StepKey {
    uint64_t serial = 0;
    int64_t rows = 0, batch = 0;
    const void* state = nullptr;
    size_t generation = 0;
    bool operator==(const StepKey& o) const {
      return serial == o.serial && rows == o.rows && batch == o.batch && state == o.state &&
             generation == o.generation;
    }
  };
  struct StepGraph {
    StepKey key;
    cudaGraphExec_t exec = nullptr;
    int64_t eager_steps = 0;  // steps run without a graph under this key
    bool failed = false;      // its capture failed: run eagerly
    uint64_t used = 0;        // last use (step_clock_), for eviction
  };
  // At most this many keys are remembered (least recently used dropped).
  static constexpr size_t kMaxStepGraphs = 4;
  std::vector<StepGraph> step_graphs_;
  uint64_t step_clock_ = 0;
  uint64_t session_serial_ = 0;
  bool shares_step_graph(const DecodeOptions& opt) const;  // Session::shared for a new session
  StepKey step_key() const;
  StepGraph& step_graph(const StepKey& key);  // found or added (stale keys dropped)
  // Drops the unshared step graphs, or (unshared_only false) every step and prompt graph.
  void drop_graphs(bool unshared_only);
  void run_step();  // one step: replayed, captured, or eager (decode_step)
  // `body`'s launches on the model's stream captured as a graph (null: could not; `what` names
  // the work in the warning).
  cudaGraphExec_t capture(const std::function<void()>& body, const char* what);

  // Captured prompt passes (gpt_step_graphs.cpp). A one-group prompt pass on one GPU runs over
  // its token count padded up (prompt_graph_tokens: to a multiple of 16 up to 128 tokens, of 64
  // beyond), the padded tokens' KV-cache writes skipped (slot -1) and their rows left unread,
  // and its attention grid sized for the longest sequence rounded up to 64; so prompts of other
  // lengths and contents share a graph of the embedding and every layer, replayed with one launch
  // instead of ~8 kernel and cuBLASLt launches a layer. The key holds everything those launches
  // bake: the padded count, the sequences, the attention grid, the index arrays' block and the
  // buffers' generation. A key's first pass runs eagerly (it plans the products and may grow
  // their workspace, which a capture cannot); its second is captured.
  struct PromptKey {
    int64_t tokens = 0, batch = 0, max_seqlen = 0;
    const void* meta = nullptr;
    size_t generation = 0;
    bool operator==(const PromptKey& o) const {
      return tokens == o.tokens && batch == o.batch && max_seqlen == o.max_seqlen &&
             meta == o.meta && generation == o.generation;
    }
  };
  struct PromptGraph {
    PromptKey key;
    cudaGraphExec_t exec = nullptr;
    int64_t eager_runs = 0;
    bool failed = false;
    uint64_t used = 0;
  };
  // bench_lambada.py's 645 batches make 19 keys (batch 8 or its last 1; 48-980 tokens, the
  // longest 64-256 once rounded), more when a buffer moves.
  static constexpr size_t kMaxPromptGraphs = 48;
  std::vector<PromptGraph> prompt_graphs_;
  uint64_t prompt_clock_ = 0;
  int64_t prompt_tokens_ = 0;   // set by plan_prefill: the padded count, or 0 (no graph)
  int64_t prompt_replays_ = 0;  // prompt passes replayed from a graph (prompt_graph_stats)
  // The padded token count of a one-group pass of `tokens` tokens that may run as a graph, or 0.
  int64_t prompt_graph_tokens(int64_t tokens) const;
  // A one-group pass: replayed, captured or eager (prefill).
  void run_prompt(int64_t tokens, int64_t seq, const layers::AttentionInputs& ai);

  Session session_;
  size_t buffer_generation_ = 0;  // bumped whenever a buffer a graph may bake is reallocated
  // Changes whenever a buffer a graph may bake was reallocated, the GEMM workspace included.
  size_t graph_generation() const { return buffer_generation_ + ctx_->workspace_generation(); }
};

}  // namespace gpt
}  // namespace warpformer
