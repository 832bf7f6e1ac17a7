// The generation session, model-agnostic: start / step (repeatedly) / finish over any Decoder.
// Three token-selection modes share one loop (greedy, sampling with the logits processor, beam
// search), with penalties, min_length, stop and bad words, log probs and streaming; the host
// never waits inside the loop (an all-finished flag is polled through pinned memory); decode steps
// are replayed from CUDA graphs; pipeline stages run steps as micro-batches round a ring.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "csrc/core/cuda_context.h"
#include "csrc/generation/decoder.h"
#include "csrc/generation/graph_cache.h"
#include "kernels/sampling/beam_search.h"

namespace warpformer {
namespace generation {

// Options of a session: per-row device arrays of rows = batch * beam_width entries (null = the
// default), owned by the caller until finish. See docs/GENERATION_API.md.
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

// Where a session writes (device). Beam search writes them at finish, sorted best first.
struct DecodeOutputs {
  int32_t* output_ids = nullptr;        // [batch, beam, seq + output_len], pre-filled by the
                                        // caller with the prompt then end ids
  int32_t* sequence_lengths = nullptr;  // [batch, beam], pre-filled with the prompt lengths
  float* cum_log_probs = nullptr;       // [batch, beam] or null
  float* output_log_probs = nullptr;    // [batch, beam, output_len] or null
  // Final hidden states (rows of Decoder::hidden_row_bytes(), model dtype), zeroed by the caller:
  // of every prompt token, [batch, seq] (not with cached prefixes: their tokens do not run);
  // and (beam width 1) of each generated token's prediction, [rows, output_len]: column i of
  // row r holds the state whose logits chose generated token i, left as it is past the row's end.
  void* context_embeddings = nullptr;
  void* hidden_states = nullptr;
};

class Session {
 public:
  // cuda_graphs: replay decode steps from CUDA graphs (EngineOptions::cuda_graphs).
  Session(Decoder* model, bool cuda_graphs);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // ids: device int32 [batch, seq] right-padded; lengths: host. Options and outputs are device
  // arrays owned by the caller for the whole session. past (host, empty: none; beam width 1):
  // the positions of each entry's KV slot that already hold ids[b, 0 : past[b]] (an interactive
  // session's history, past[b] < lengths[b]): the prompt pass runs the rest only.
  void start(const int32_t* ids, const std::vector<int32_t>& lengths, int64_t seq,
             int64_t output_len, const DecodeOptions& options, const DecodeOutputs& outputs,
             const std::vector<int32_t>& past = {});
  // Runs up to max_steps generation steps (the first produces each row's first new token from the
  // prompt's logits). Returns the number run; 0 once every row has ended or output_len tokens
  // exist. Launches only: the work is ordered on the stream, nothing waits for it.
  int64_t step(int64_t max_steps);
  // Writes the final outputs (beam search: the best hypotheses, sorted) and ends the session.
  void finish();
  // Ends a session after an error, leaving the instance usable (outputs are unspecified).
  void abort();
  bool active() const { return s_.active; }
  int64_t tokens_done() const { return s_.steps_done; }
  // Drops the step graphs (all, or only those no later session can use). Callers replacing a
  // communicator drop all first: no graph may outlive the communicator it baked.
  void drop_graphs(bool unshared_only);
  // Greedy generation in one call (start with greedy options + steps + finish).
  void generate_greedy(const int32_t* ids, const std::vector<int32_t>& lengths, int64_t seq,
                       int64_t output_len, const int32_t* end_ids, int32_t* output_ids,
                       int32_t* seq_lengths);
  size_t state_bytes() const { return state_.size(); }

 private:
  struct State {
    bool active = false;
    int64_t batch = 0, beam = 1, rows = 0, seq = 0, output_len = 0, total = 0;
    int64_t kv_capacity = 0;  // positions per KV slot (Decoder::reserve)
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
    int32_t* first_rows = nullptr;     // [rows] batch entry of each row (its prompt)
    int32_t* in_len_rows = nullptr;    // [rows] prompt length of each row
    int32_t* in_len_batch = nullptr;   // [batch]
    int32_t* end_ids_batch = nullptr;  // [batch]
    int32_t* row0_index = nullptr;     // [batch] b * beam
    int32_t* all_done = nullptr;       // [1]
    float* token_lp = nullptr;         // [rows]
    float* proc_logits = nullptr;      // [rows, V] fp32 processed logits / log probs
    int32_t* counts = nullptr;         // [rows, V] token counts (penalties)
    // Greedy step scratch (kernels::GreedyStepParams; arrivals zeroed at start).
    uint32_t* greedy_arrivals = nullptr;  // [rows]
    float* greedy_values = nullptr;       // [rows, kernels::greedy_step_chunks(V)]
    int32_t* greedy_indices = nullptr;    // [rows, kernels::greedy_step_chunks(V)]
    float* split = nullptr;               // the model's step workspace
    size_t split_bytes = 0;
    void* beam_ws = nullptr;  // beam search scratch
    size_t beam_ws_bytes = 0;
    kernels::BeamSearchState beam_state{};
    bool flag_pending = false;
    bool stop = false;
    // Where token selection writes the tokens and lengths and reads the end ids (non-beam rows):
    // the caller's outputs, or, for a session whose step graph others may share (`shared`:
    // greedy on one GPU), copies of them in state_ with the KV capacity as row stride, filled
    // at start and copied back after every step call (sync_out).
    int32_t* ids = nullptr;  // [rows, ids_stride]
    int64_t ids_stride = 0;
    int32_t* lengths = nullptr;        // [rows]
    const int32_t* end_ids = nullptr;  // [rows]
    bool shared = false;
    uint64_t serial = 0;  // this session's number (StepKey of an unshared session)
  };

  size_t layout(char* base);  // carve (or measure) the session's device state
  StepRows step_rows() const;
  void step_body();  // one step's launches (captured into a graph when possible)
  void run_step();   // one step: replayed, captured, or eager
  void sync_out();   // a shared session's tokens and lengths to the caller's
  // Greedy / sampling / beam selection + state update of rows [r0, r0 + n) (beam: all rows).
  void select_tokens(int64_t r0, int64_t n);
  // Rows [r0, r0 + n) of the model's final_hidden() into out.hidden_states (when asked), at the
  // column of the token their logits are about to choose; before select_tokens moves cur_pos.
  void keep_hidden(int64_t r0, int64_t n);
  // Pipeline parallelism (session_pipeline.cpp): the micro-batches a step is split into, a run
  // of `steps` split steps, the state broadcast from the last stage.
  int64_t micro_batches() const;
  void steps_split(int64_t steps);
  void share_state();
  void broadcast_from_last_stage(void* data, int64_t bytes);
  bool shares_step_graph(const DecodeOptions& opt, const DecodeOutputs& out) const;

  // A step graph bakes the buffers it launches on; the key names everything that decides them,
  // so a graph serves every session with its key: a shared session's key (serial 0) holds its
  // row counts, the state_ block and the generation of the buffers, and greedy sessions of one
  // batch size on one GPU share a graph; any other session's key holds its own serial, so its
  // graph dies with it.
  struct StepKey {
    uint64_t serial = 0;
    int64_t rows = 0, batch = 0, view = 0;
    const void* state = nullptr;
    size_t generation = 0;
    bool operator==(const StepKey& o) const {
      return serial == o.serial && rows == o.rows && batch == o.batch && view == o.view &&
             state == o.state && generation == o.generation;
    }
  };
  // At most this many keys are remembered (least recently used dropped).
  static constexpr size_t kMaxStepGraphs = 4;

  Decoder* model_;
  CudaContext& ctx_;
  bool cuda_graphs_;
  State s_;
  DeviceBuffer state_;  // generation state + the model's step workspace
  size_t state_generation_ = 0;
  uint64_t serial_ = 0;
  GraphCache<StepKey> step_graphs_{kMaxStepGraphs};
  int32_t* host_flag_ = nullptr;  // pinned: the all-finished flag polled during generation
  cudaEvent_t flag_event_ = nullptr;
};

}  // namespace generation
}  // namespace warpformer
