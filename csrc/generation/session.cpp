#include "csrc/generation/session.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <vector>

#include "csrc/core/carve.h"
#include "csrc/core/check.h"
#include "kernels/gather.h"
#include "kernels/sampling/beam_search.h"
#include "kernels/sampling/greedy.h"
#include "kernels/sampling/logits_processor.h"
#include "kernels/sampling/token_update.h"

namespace warpformer {
namespace generation {
namespace {

constexpr int64_t kPoll = 16;
// Pipeline stages split decode steps into micro-batches only for runs of at least this many
// steps: a run fills and drains the ring once (P - 1 extra micro-batch passes on the last stage,
// each costing about a whole stage pass while decode is bound by weight reads), which a run of
// one or a few steps (streaming) would pay every call.
constexpr int64_t kMinSplitSteps = 8;
// A decode step is captured into a CUDA graph only when at least this many steps of the session
// remain (the capture's own step included), or when sessions sharing its graph ran this many
// eagerly before: capturing launches as much as an eager step does, and instantiating, uploading
// and destroying the graph come on top, so a graph replayed once or twice costs more than it
// saves (benchmarks/HISTORY.md, "Step graphs").
constexpr int64_t kMinGraphSteps = 6;

}  // namespace

Session::Session(Decoder* model, bool cuda_graphs)
    : model_(model), ctx_(model->context()), cuda_graphs_(cuda_graphs) {}

Session::~Session() {
  drop_graphs(/*unshared_only=*/false);
  if (flag_event_ != nullptr) {
    cudaEventSynchronize(flag_event_);
    cudaEventDestroy(flag_event_);
  }
  if (host_flag_ != nullptr) cudaFreeHost(host_flag_);
}

// Lays the session's device state out in `base` (or only measures it when base is null).
size_t Session::layout(char* base) {
  State& s = s_;
  const int64_t rows = s.rows, batch = s.batch, V = model_->vocab_size();
  const bool beam = s.beam > 1;
  const int64_t max_out = s.out.output_log_probs != nullptr ? s.output_len : 0;
  Carver c(base);
  int32_t* ints = c.take_n<int32_t>(8 * rows + 3 * batch + 1);
  if (base != nullptr) {
    s.next_tok = ints;
    s.cur_pos = ints + rows;
    s.attn_len = ints + 2 * rows;
    s.finished = ints + 3 * rows;
    s.iota = ints + 4 * rows;
    s.sampled = ints + 5 * rows;
    s.first_rows = ints + 6 * rows;
    s.in_len_rows = ints + 7 * rows;
    s.in_len_batch = ints + 8 * rows;
    s.end_ids_batch = ints + 8 * rows + batch;
    s.row0_index = ints + 8 * rows + 2 * batch;
    s.all_done = ints + 8 * rows + 3 * batch;
  }
  // The staged outputs (Session::ids). Token selection also takes the row stride as the limit
  // of a row's positions; the staged stride (the KV capacity) is beyond every session's total,
  // which changes nothing: a row's positions end at its prompt length + output_len - 1 <= total
  // - 1, and the session ends after output_len tokens, whether or not that row was flagged.
  if (s.shared) {
    int32_t* staged = c.take_n<int32_t>(rows * s.kv_capacity + 2 * rows);
    if (base != nullptr) {
      s.ids = staged;
      s.ids_stride = s.kv_capacity;
      s.lengths = staged + rows * s.kv_capacity;
      s.end_ids = s.lengths + rows;
    }
  }
  s.token_lp = c.take_n<float>(rows);
  s.proc_logits = (beam || !s.opt.greedy) ? c.take_n<float>(rows * V) : nullptr;
  s.counts = s.opt.needs_counts ? c.take_n<int32_t>(rows * V) : nullptr;
  if (!beam && s.opt.greedy) {
    const int64_t chunks = kernels::greedy_step_chunks(static_cast<int>(V));
    s.greedy_arrivals = c.take_n<uint32_t>(rows);
    s.greedy_values = c.take_n<float>(rows * chunks);
    s.greedy_indices = c.take_n<int32_t>(rows * chunks);
  }
  // For every row count the attention runs with: all rows, and the pipeline micro-batches
  // (fewer rows may take more key splits each).
  auto split_bytes = [&](int64_t r) { return model_->step_workspace_bytes(r); };
  const int64_t micro = micro_batches();
  s.split_bytes = split_bytes(rows);
  if (micro > 1) {
    s.split_bytes = std::max(
        {s.split_bytes, split_bytes(rows / micro), split_bytes((rows + micro - 1) / micro)});
  }
  s.split = s.split_bytes > 0 ? c.take_n<float>(s.split_bytes / sizeof(float) + 1) : nullptr;
  if (beam) {
    kernels::BeamSearchState& bs = s.beam_state;
    s.beam_ws_bytes = kernels::beam_search_workspace_bytes(
        static_cast<int>(batch), static_cast<int>(s.beam), static_cast<int>(V));
    s.beam_ws = c.take_n<char>(s.beam_ws_bytes);
    bs.batch = static_cast<int>(batch);
    bs.beam = static_cast<int>(s.beam);
    bs.ids_stride = static_cast<int>(s.total);
    bs.indir_stride = static_cast<int>(s.kv_capacity);
    bs.max_out = static_cast<int>(max_out);
    bs.cum_log_probs = c.take_n<float>(rows);
    bs.output_ids = c.take_n<int32_t>(rows * s.total);
    bs.run_log_probs = max_out ? c.take_n<float>(rows * max_out) : nullptr;
    bs.cache_indir = c.take_n<int32_t>(rows * s.kv_capacity);
    bs.cur_pos = c.take_n<int32_t>(rows);
    bs.attn_len = c.take_n<int32_t>(rows);
    bs.gen_len = c.take_n<int32_t>(batch);
    bs.parents = c.take_n<int32_t>(rows);
    bs.tokens = c.take_n<int32_t>(rows);
    bs.token_log_probs = c.take_n<float>(rows);
    bs.done = c.take_n<int32_t>(batch);
    bs.hyp_count = c.take_n<int32_t>(batch);
    bs.hyp_score = c.take_n<float>(rows);
    bs.hyp_cum = c.take_n<float>(rows);
    bs.hyp_len = c.take_n<int32_t>(rows);
    bs.hyp_ids = c.take_n<int32_t>(rows * s.total);
    bs.hyp_log_probs = max_out ? c.take_n<float>(rows * max_out) : nullptr;
    bs.input_lengths = s.in_len_batch;
    bs.end_ids = s.end_ids_batch;
  }
  return c.used();
}

void Session::start(const int32_t* ids, const std::vector<int32_t>& lengths, int64_t seq,
                    int64_t output_len, const DecodeOptions& opt, const DecodeOutputs& out,
                    const std::vector<int32_t>& past) {
  const char* m = model_->name();
  TORCH_CHECK(!s_.active, m, ": a generation session is running; finish it (decode_finish) first");
  TORCH_CHECK(opt.end_ids != nullptr, m, ".decode: end_ids are required");
  TORCH_CHECK(opt.beam_width >= 1 && opt.beam_width <= kernels::kMaxBeamWidth, m,
              ".decode: beam_width must be in [1, ", kernels::kMaxBeamWidth, "], got ",
              opt.beam_width);
  TORCH_CHECK(output_len >= 1, m, ".decode: output_len must be >= 1, got ", output_len);
  TORCH_CHECK(!lengths.empty(), m, ".decode: empty batch");
  TORCH_CHECK(out.hidden_states == nullptr || opt.beam_width == 1, m,
              ".decode: option 'return_hidden_states' is not supported when 'beam_width' "
              "(num_beams) > 1");
  TORCH_CHECK(out.context_embeddings == nullptr || past.empty(), m,
              ".decode: option 'return_context_embeddings' cannot be combined with 'session'");
  // The tokens each entry's prompt pass runs: those its slot does not hold yet.
  std::vector<int32_t> run = lengths;
  if (!past.empty()) {
    TORCH_CHECK(past.size() == lengths.size() && opt.beam_width == 1, m,
                ".decode: cached prefixes need one per batch entry and beam_width 1");
    for (size_t b = 0; b < run.size(); ++b) {
      TORCH_CHECK(past[b] >= 0 && past[b] < lengths[b], m, ".decode: entry ", b, " holds ", past[b],
                  " cached positions of a ", lengths[b], "-token prompt");
      run[b] -= past[b];
    }
  }
  drop_graphs(/*unshared_only=*/true);
  const OwnStreamScope scope(ctx_);
  State& s = s_;
  s = State{};
  s.batch = static_cast<int64_t>(lengths.size());
  s.beam = opt.beam_width;
  s.rows = s.batch * s.beam;
  s.seq = seq;
  s.output_len = output_len;
  s.total = seq + output_len;
  s.opt = opt;
  s.out = out;
  s.serial = ++serial_;
  s.shared = shares_step_graph(opt, out);
  s.kv_capacity = model_->reserve(s.rows, s.total, run);
  const size_t need = layout(nullptr);
  if (need > state_.size()) {
    state_.reset();  // a failed allocation below leaves no stale size behind
    state_ = DeviceBuffer(ctx_.allocator(), need, ctx_.stream());
    ++state_generation_;
  }
  layout(static_cast<char*>(state_.data()));
  if (!s.shared) {
    s.ids = out.output_ids;
    s.ids_stride = s.total;
    s.lengths = out.sequence_lengths;
    s.end_ids = opt.end_ids;
  }

  cudaStream_t stream = ctx_.stream();
  const int64_t rows = s.rows, batch = s.batch;
  // The prompt is prefilled once per batch entry, into the KV slot of its beam 0.
  model_->prefill(ids, run, past, seq, s.beam, out.context_embeddings);
  std::vector<int32_t> host(8 * rows + 3 * batch + 1, 0);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = r / s.beam;
    host[rows + r] = lengths[b] - 1;               // cur_pos: the newest prompt token
    host[2 * rows + r] = lengths[b];               // attn_len
    host[4 * rows + r] = static_cast<int32_t>(r);  // iota
    host[6 * rows + r] = static_cast<int32_t>(b);  // first_rows: the row's prompt
    host[7 * rows + r] = lengths[b];               // in_len_rows
  }
  for (int64_t b = 0; b < batch; ++b) {
    host[8 * rows + b] = lengths[b];
    host[8 * rows + 2 * batch + b] = static_cast<int32_t>(b * s.beam);
  }
  WF_CUDA_CHECK(cudaMemcpyAsync(s.next_tok, host.data(), host.size() * sizeof(int32_t),
                                cudaMemcpyHostToDevice, stream));
  if (s.shared) {
    const size_t row = s.total * sizeof(int32_t);
    WF_CUDA_CHECK(cudaMemcpy2DAsync(s.ids, s.ids_stride * sizeof(int32_t), out.output_ids, row, row,
                                    rows, cudaMemcpyDeviceToDevice, stream));
    WF_CUDA_CHECK(cudaMemcpyAsync(s.lengths, out.sequence_lengths, rows * sizeof(int32_t),
                                  cudaMemcpyDeviceToDevice, stream));
    WF_CUDA_CHECK(cudaMemcpyAsync(const_cast<int32_t*>(s.end_ids), opt.end_ids,
                                  rows * sizeof(int32_t), cudaMemcpyDeviceToDevice, stream));
  }
  if (s.greedy_arrivals != nullptr) {
    WF_CUDA_CHECK(cudaMemsetAsync(s.greedy_arrivals, 0, rows * sizeof(uint32_t), stream));
  }
  WF_CUDA_CHECK(kernels::launch_gather_rows(s.end_ids_batch, opt.end_ids, s.row0_index, batch,
                                            sizeof(int32_t), stream));
  if (opt.needs_counts) {
    kernels::TokenCountInitParams cp{};
    cp.counts = s.counts;
    cp.ids = out.output_ids;  // [rows, total]: the prompt, then end ids
    cp.lengths = s.in_len_rows;
    cp.rows = static_cast<int>(rows);
    cp.vocab = static_cast<int>(model_->vocab_size());
    cp.ids_stride = static_cast<int>(s.total);
    WF_CUDA_CHECK(kernels::launch_init_token_counts(cp, stream));
  }
  if (s.beam > 1) {
    WF_CUDA_CHECK(
        kernels::launch_beam_init(s.beam_state, ids, seq, /*shared_prompt_slot=*/true, stream));
  }
  if (host_flag_ == nullptr) {
    WF_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host_flag_), sizeof(int32_t)));
    WF_CUDA_CHECK(cudaEventCreateWithFlags(&flag_event_, cudaEventDisableTiming));
  }
  *host_flag_ = 0;
  s.active = true;
}

// One decode step after the first: feed each row's newest token at its position.
void Session::step_body() {
  const State& s = s_;
  model_->step(step_rows(), 0, s.rows, /*exchange=*/true);
  if (model_->last_stage()) {
    keep_hidden(0, s.rows);
    select_tokens(0, s.rows);
  }
  share_state();
}

// Row r predicts the token after its newest one (at cur_pos[r]): generated token cur_pos[r] + 1 -
// input length, computed on the device since a replayed step has no host-side count. Finished
// rows predict nothing (their column is past their end).
void Session::keep_hidden(int64_t r0, int64_t n) {
  const State& s = s_;
  if (s.out.hidden_states == nullptr) return;
  const int64_t row_bytes = static_cast<int64_t>(model_->hidden_row_bytes());
  WF_CUDA_CHECK(kernels::launch_scatter_rows_to_columns(
      static_cast<char*>(s.out.hidden_states) + r0 * s.output_len * row_bytes,
      model_->final_hidden(), s.cur_pos + r0, s.in_len_rows + r0, /*offset=*/1, s.finished + r0, n,
      s.output_len, row_bytes, ctx_.stream()));
}

// The rows' state a step reads; beam search reads the beams' reordered state.
StepRows Session::step_rows() const {
  const State& s = s_;
  const bool beam = s.beam > 1;
  const kernels::BeamSearchState& bs = s.beam_state;
  StepRows in;
  in.tokens = beam ? bs.tokens : s.next_tok;
  in.positions = beam ? bs.cur_pos : s.cur_pos;
  in.lengths = beam ? bs.attn_len : s.attn_len;
  in.slots = s.iota;
  in.cache_indir = beam ? bs.cache_indir : nullptr;
  in.workspace = s.split;
  in.workspace_bytes = s.split_bytes;
  return in;
}

// Shared only where the state layout depends on nothing but the key (greedy: no token counts)
// and on one GPU: tensor-parallel ranks must capture and replay their NCCL calls together,
// which a graph outliving its session could not promise (each rank's buffers grow on its own
// schedule), and a graph must not outlive the communicator it baked. A step that writes hidden
// states bakes the caller's output tensor: its graph is the session's own.
bool Session::shares_step_graph(const DecodeOptions& opt, const DecodeOutputs& out) const {
  Communicator* tp = model_->tensor_group();
  return opt.greedy && !opt.needs_counts && opt.beam_width == 1 && out.hidden_states == nullptr &&
         model_->pipeline_group() == nullptr && (tp == nullptr || tp->size() == 1);
}

void Session::drop_graphs(bool unshared_only) {
  step_graphs_.drop_if([&](const auto& g) { return !unshared_only || g.key.serial != 0; });
}

// One decode step after the first token. Tensor parallelism is captured too (NCCL collectives are
// graph-capturable, and every rank makes the same choices); pipeline stages run eagerly, their
// send/recv pairs ordered by the host. Without a graph for the step's key yet, the step runs
// eagerly when nothing ran under the key before (the session's first step plans the GEMMs, and
// may grow their workspace, which a capture cannot) or when the graph would not be replayed
// often enough to repay its capture (kMinGraphSteps: counting this session's remaining steps, or
// the eager steps that sessions sharing the key ran before).
void Session::run_step() {
  State& s = s_;
  if (!cuda_graphs_ || model_->pipeline_group() != nullptr) {
    step_body();
    return;
  }
  StepKey key;
  key.serial = s.shared ? 0 : s.serial;
  key.rows = s.rows;
  key.batch = s.batch;
  key.view = model_->cache_view();
  key.state = state_.data();
  key.generation = model_->buffer_generation() + state_generation_;
  auto& g = step_graphs_.find_or_add(key);
  const bool planned = s.steps_done > 1 || g.eager_runs > 0;
  const bool repays =
      s.output_len - s.steps_done >= kMinGraphSteps || g.eager_runs >= kMinGraphSteps;
  step_graphs_.run(g, ctx_.stream(), [this] { step_body(); }, planned && repays, "decode step");
}

void Session::sync_out() {
  State& s = s_;
  cudaStream_t stream = ctx_.stream();
  const size_t row = s.total * sizeof(int32_t);
  WF_CUDA_CHECK(cudaMemcpy2DAsync(s.out.output_ids, row, s.ids, s.ids_stride * sizeof(int32_t), row,
                                  s.rows, cudaMemcpyDeviceToDevice, stream));
  WF_CUDA_CHECK(cudaMemcpyAsync(s.out.sequence_lengths, s.lengths, s.rows * sizeof(int32_t),
                                cudaMemcpyDeviceToDevice, stream));
}

int64_t Session::step(int64_t max_steps) {
  State& s = s_;
  TORCH_CHECK(s.active, model_->name(), ".decode_step: no generation session (call decode_start)");
  const OwnStreamScope scope(ctx_);
  cudaStream_t stream = ctx_.stream();
  int64_t n = 0;
  while (n < max_steps && s.steps_done < s.output_len && !s.stop) {
    // The all-finished flag copied at the end of the previous multiple of kPoll steps. With
    // tensor/pipeline parallelism every rank must stop at the same step, so the decision waits
    // for that copy (a host wait once every kPoll steps); alone, it only looks if the copy has
    // landed (else the flag is read at a later multiple of kPoll).
    Communicator* tp = model_->tensor_group();
    const bool lockstep = (tp != nullptr && tp->size() > 1) || model_->pipeline_group() != nullptr;
    if (s.flag_pending && s.steps_done % kPoll == 0 &&
        (lockstep ? cudaEventSynchronize(flag_event_) == cudaSuccess
                  : cudaEventQuery(flag_event_) == cudaSuccess)) {
      s.flag_pending = false;
      if (*host_flag_) {
        s.stop = true;
        break;
      }
    }
    int64_t ran = 1;
    if (s.steps_done == 0) {
      // First token of every row: logits of its last prompt token (kept by the prefill).
      if (model_->last_stage()) {
        model_->prompt_logits(s.first_rows, s.rows);
        keep_hidden(0, s.rows);
        select_tokens(0, s.rows);
      }
      share_state();
    } else if (const int64_t run = std::min(
                   {max_steps - n, s.output_len - s.steps_done, kPoll - s.steps_done % kPoll});
               micro_batches() > 1 && run >= kMinSplitSteps) {
      // The steps up to the next poll (or the call's or session's end) as one pipelined run.
      steps_split(run);
      ran = run;
    } else {
      run_step();
    }
    s.steps_done += ran;
    n += ran;
    if (s.steps_done % kPoll == 0 && !s.flag_pending) {
      const bool beam = s.beam > 1;
      WF_CUDA_CHECK(kernels::launch_all_finished(beam ? s.beam_state.done : s.finished,
                                                 static_cast<int>(beam ? s.batch : s.rows),
                                                 s.all_done, stream));
      WF_CUDA_CHECK(
          cudaMemcpyAsync(host_flag_, s.all_done, sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
      WF_CUDA_CHECK(cudaEventRecord(flag_event_, stream));
      s.flag_pending = true;
    }
  }
  if (s.shared && n > 0) sync_out();
  // Pipeline parallelism: the tokens live on the last stage; streaming callers on every stage
  // read them after each call.
  if (model_->pipeline_group() != nullptr && n > 0) {
    broadcast_from_last_stage(s.out.output_ids, s.rows * s.total * sizeof(int32_t));
  }
  return n;
}

void Session::finish() {
  State& s = s_;
  TORCH_CHECK(s.active, model_->name(),
              ".decode_finish: no generation session (call decode_start)");
  const OwnStreamScope scope(ctx_);
  if (s.beam > 1 && model_->last_stage()) {  // the other stages receive the outputs below
    kernels::BeamFinalizeParams fp{};
    fp.s = s.beam_state;
    fp.length_penalty = s.opt.length_penalty;
    fp.output_ids = s.out.output_ids;
    fp.out_stride = static_cast<int>(s.total);
    fp.sequence_lengths = s.out.sequence_lengths;
    fp.cum_log_probs = s.out.cum_log_probs;
    fp.output_log_probs = s.out.output_log_probs;
    WF_CUDA_CHECK(kernels::launch_beam_finalize(fp, ctx_.stream()));
  }
  if (model_->pipeline_group() !=
      nullptr) {  // every stage returns the last stage's results, in one launch
    GroupScope group(model_->pipeline_group());
    const int64_t rows = s.rows;
    broadcast_from_last_stage(s.out.output_ids, rows * s.total * sizeof(int32_t));
    broadcast_from_last_stage(s.out.sequence_lengths, rows * sizeof(int32_t));
    if (s.out.cum_log_probs != nullptr) {
      broadcast_from_last_stage(s.out.cum_log_probs, rows * sizeof(float));
    }
    if (s.out.output_log_probs != nullptr) {
      broadcast_from_last_stage(s.out.output_log_probs, rows * s.output_len * sizeof(float));
    }
    const int64_t row_bytes = static_cast<int64_t>(model_->hidden_row_bytes());
    if (s.out.context_embeddings != nullptr) {
      broadcast_from_last_stage(s.out.context_embeddings, s.batch * s.seq * row_bytes);
    }
    if (s.out.hidden_states != nullptr) {
      broadcast_from_last_stage(s.out.hidden_states, rows * s.output_len * row_bytes);
    }
    group.end();
  }
  // The pinned flag may still be the target of a pending copy.
  if (s.flag_pending) WF_CUDA_CHECK(cudaEventSynchronize(flag_event_));
  drop_graphs(/*unshared_only=*/true);
  s.active = false;
}

void Session::abort() {
  State& s = s_;
  ctx_.synchronize_own_stream();
  cudaStreamSynchronize(ctx_.stream());
  (void)cudaGetLastError();
  drop_graphs(/*unshared_only=*/false);
  model_->drop_graphs();
  s.flag_pending = false;
  s.active = false;
}

void Session::generate_greedy(const int32_t* ids, const std::vector<int32_t>& lengths, int64_t seq,
                              int64_t output_len, const int32_t* end_ids, int32_t* output_ids,
                              int32_t* seq_lengths) {
  DecodeOptions opt;
  opt.end_ids = end_ids;
  opt.greedy = true;
  DecodeOutputs out;
  out.output_ids = output_ids;
  out.sequence_lengths = seq_lengths;
  start(ids, lengths, seq, output_len, opt, out);
  try {
    step(output_len);
    finish();
  } catch (...) {
    abort();
    throw;
  }
}

}  // namespace generation
}  // namespace warpformer
