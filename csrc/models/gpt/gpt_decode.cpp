// GptModel's generation session: decode_start / decode_step / decode_finish.
//
// Three token-selection modes share one loop:
//   greedy    argmax + state update in one kernel (kernels/sampling/greedy)
//   sampling  logits processor (penalties, min_length, bad words, temperature) -> top-k/top-p
//             sampler with per-row Philox seeds -> state update (stop words, log probs, counts)
//   beam      processor -> log_softmax -> beam step (candidates, hypotheses) -> beam update
//             (reorders running sequences and the KV-cache indirection the attention reads)
// A decode step is a pure function of device state (no host-varying arguments), so after one
// eager step it is captured into a CUDA graph and replayed when enough steps remain to repay the
// capture; greedy sessions of one batch size on one GPU share their graph (gpt_step_graphs.cpp).
// The host never waits inside the loop: every kPoll steps an all-finished flag is copied to
// pinned memory behind an event and read later only if the event has completed.
#include <c10/util/Exception.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <vector>

#include "csrc/core/check.h"
#include "csrc/models/gpt/gpt_model.h"
#include "kernels/gather.h"
#include "kernels/sampling/beam_search.h"
#include "kernels/sampling/greedy.h"
#include "kernels/sampling/logits_processor.h"
#include "kernels/sampling/sampler.h"
#include "kernels/sampling/token_update.h"

namespace warpformer {
namespace gpt {
namespace {

constexpr int64_t kPoll = 16;
// Pipeline stages split decode steps into micro-batches only for runs of at least this many
// steps: a run fills and drains the ring once (P - 1 extra micro-batch passes on the last stage,
// each costing about a whole stage pass while decode is bound by weight reads), which a run of
// one or a few steps (streaming) would pay every call.
constexpr int64_t kMinSplitSteps = 8;
size_t aligned(size_t n) { return (n + 255) / 256 * 256; }

// Sequential carving of one allocation (each piece 256-byte aligned); base null = measure only.
struct Carve {
  char* base;
  size_t off = 0;
  template <typename T>
  T* take(size_t count) {
    T* p = base == nullptr ? nullptr : reinterpret_cast<T*>(base + off);
    off += aligned(count * sizeof(T));
    return p;
  }
};

}  // namespace

void GptModel::enter_decode_stream() {
  if (decode_stream_ == nullptr) {
    const DeviceScope scope(ctx_->device());
    WF_CUDA_CHECK(cudaStreamCreateWithFlags(&decode_stream_, cudaStreamNonBlocking));
    WF_CUDA_CHECK(cudaEventCreateWithFlags(&order_event_, cudaEventDisableTiming));
  }
  // Scopes never nest: a nested one would take the model's stream for the caller's and leave
  // the real caller unordered after the work.
  TORCH_INTERNAL_ASSERT(ctx_->stream() != decode_stream_,
                        "GptModel: a stream scope was entered inside another");
  caller_stream_ = ctx_->stream();
  WF_CUDA_CHECK(cudaEventRecord(order_event_, caller_stream_));
  WF_CUDA_CHECK(cudaStreamWaitEvent(decode_stream_, order_event_, 0));
  ctx_->set_stream(decode_stream_);
}

// Never throws (it runs from destructors during unwinding); a failure here would also have
// failed the work before it, which reports the error.
void GptModel::leave_decode_stream() {
  if (cudaEventRecord(order_event_, decode_stream_) == cudaSuccess) {
    cudaStreamWaitEvent(caller_stream_, order_event_, 0);
  }
  ctx_->set_stream(caller_stream_);
}

// Lays the session's device state out in `base` (or only measures it when base is null).
size_t GptModel::session_layout(char* base) {
  Session& s = session_;
  const int64_t rows = s.rows, batch = s.batch, V = cfg_.vocab_size;
  const bool beam = s.beam > 1;
  const int64_t max_out = s.out.output_log_probs != nullptr ? s.output_len : 0;
  Carve c{base};
  int32_t* ints = c.take<int32_t>(8 * rows + 3 * batch + 1);
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
    int32_t* staged = c.take<int32_t>(rows * kv_seq_ + 2 * rows);
    if (base != nullptr) {
      s.ids = staged;
      s.ids_stride = kv_seq_;
      s.lengths = staged + rows * kv_seq_;
      s.end_ids = s.lengths + rows;
    }
  }
  s.token_lp = c.take<float>(rows);
  s.proc_logits = (beam || !s.opt.greedy) ? c.take<float>(rows * V) : nullptr;
  s.counts = s.opt.needs_counts ? c.take<int32_t>(rows * V) : nullptr;
  if (!beam && s.opt.greedy) {
    const int64_t chunks = kernels::greedy_step_chunks(static_cast<int>(V));
    s.greedy_arrivals = c.take<uint32_t>(rows);
    s.greedy_values = c.take<float>(rows * chunks);
    s.greedy_indices = c.take<int32_t>(rows * chunks);
  }
  // For every row count the attention runs with: all rows, and the pipeline micro-batches
  // (fewer rows may take more key splits each).
  auto split_bytes = [&](int64_t r) {
    return kernels::decode_attention_workspace_bytes(
        static_cast<int>(r), static_cast<int>(cfg_.local_heads()),
        static_cast<int>(cfg_.size_per_head), static_cast<int>(kv_seq_));
  };
  const int64_t micro = decode_micro_batches();
  s.split_bytes = split_bytes(rows);
  if (micro > 1) {
    s.split_bytes = std::max(
        {s.split_bytes, split_bytes(rows / micro), split_bytes((rows + micro - 1) / micro)});
  }
  s.split = s.split_bytes > 0 ? c.take<float>(s.split_bytes / sizeof(float) + 1) : nullptr;
  if (beam) {
    kernels::BeamSearchState& bs = s.beam_state;
    s.beam_ws_bytes = kernels::beam_search_workspace_bytes(
        static_cast<int>(batch), static_cast<int>(s.beam), static_cast<int>(V));
    s.beam_ws = c.take<char>(s.beam_ws_bytes);
    bs.batch = static_cast<int>(batch);
    bs.beam = static_cast<int>(s.beam);
    bs.ids_stride = static_cast<int>(s.total);
    bs.indir_stride = static_cast<int>(kv_seq_);
    bs.max_out = static_cast<int>(max_out);
    bs.cum_log_probs = c.take<float>(rows);
    bs.output_ids = c.take<int32_t>(rows * s.total);
    bs.run_log_probs = max_out ? c.take<float>(rows * max_out) : nullptr;
    bs.cache_indir = c.take<int32_t>(rows * kv_seq_);
    bs.cur_pos = c.take<int32_t>(rows);
    bs.attn_len = c.take<int32_t>(rows);
    bs.gen_len = c.take<int32_t>(batch);
    bs.parents = c.take<int32_t>(rows);
    bs.tokens = c.take<int32_t>(rows);
    bs.token_log_probs = c.take<float>(rows);
    bs.done = c.take<int32_t>(batch);
    bs.hyp_count = c.take<int32_t>(batch);
    bs.hyp_score = c.take<float>(rows);
    bs.hyp_cum = c.take<float>(rows);
    bs.hyp_len = c.take<int32_t>(rows);
    bs.hyp_ids = c.take<int32_t>(rows * s.total);
    bs.hyp_log_probs = max_out ? c.take<float>(rows * max_out) : nullptr;
    bs.input_lengths = s.in_len_batch;
    bs.end_ids = s.end_ids_batch;
  }
  return c.off;
}

void GptModel::decode_start(const int32_t* ids, const std::vector<int32_t>& lengths, int64_t seq,
                            int64_t output_len, const DecodeOptions& opt,
                            const DecodeOutputs& out) {
  TORCH_CHECK(!session_.active,
              "GptModel: a generation session is running; finish it (decode_finish) first");
  TORCH_CHECK(opt.end_ids != nullptr, "GptModel.decode: end_ids are required");
  TORCH_CHECK(opt.beam_width >= 1 && opt.beam_width <= kernels::kMaxBeamWidth,
              "GptModel.decode: beam_width must be in [1, ", kernels::kMaxBeamWidth, "], got ",
              opt.beam_width);
  TORCH_CHECK(output_len >= 1, "GptModel.decode: output_len must be >= 1, got ", output_len);
  TORCH_CHECK(!lengths.empty(), "GptModel.decode: empty batch");
  drop_graphs(/*unshared_only=*/true);
  const StreamScope scope(this);
  Session& s = session_;
  s = Session{};
  s.batch = static_cast<int64_t>(lengths.size());
  s.beam = opt.beam_width;
  s.rows = s.batch * s.beam;
  s.seq = seq;
  s.output_len = output_len;
  s.total = seq + output_len;
  s.opt = opt;
  s.out = out;
  s.serial = ++session_serial_;
  s.shared = shares_step_graph(opt);
  ensure_kv(s.rows, s.total);
  ensure_activations(std::max(plan_prefill(lengths), s.rows), s.rows);
  const size_t need = session_layout(nullptr);
  if (need > state_need_) {
    state_.reset();
    state_need_ = 0;  // a failed allocation below must not leave a stale size behind
    state_ = DeviceBuffer(ctx_->allocator(), need, ctx_->stream());
    state_need_ = need;
    ++buffer_generation_;
  }
  session_layout(static_cast<char*>(state_.data()));
  if (!s.shared) {
    s.ids = out.output_ids;
    s.ids_stride = s.total;
    s.lengths = out.sequence_lengths;
    s.end_ids = opt.end_ids;
  }

  cudaStream_t stream = ctx_->stream();
  const int64_t rows = s.rows, batch = s.batch;
  // The prompt is prefilled once per batch entry, into the KV slot of its beam 0. Each group's
  // last-token hidden states are kept (in proj, [batch, h]) for the first step's logits.
  prefill(ids, lengths, seq, s.beam, [&](const PrefillGroup& g) {
    const size_t row_bytes = cfg_.hidden() * dtype_size(dtype_);
    WF_CUDA_CHECK(kernels::launch_gather_rows(static_cast<char*>(scratch().proj) + g.b0 * row_bytes,
                                              buffers().n, d_last_ + g.b0, g.b1 - g.b0, row_bytes,
                                              ctx_->stream()));
  });
  std::vector<int32_t> host(8 * rows + 3 * batch + 1, 0);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = r / s.beam;
    host[rows + r] = lengths[b] - 1;               // cur_pos: the newest prompt token
    host[2 * rows + r] = lengths[b];               // attn_len
    host[4 * rows + r] = static_cast<int32_t>(r);  // iota
    host[6 * rows + r] = static_cast<int32_t>(b);  // first_rows: the prompt's row in proj
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
    cp.vocab = static_cast<int>(cfg_.vocab_size);
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

// Selects the next token of rows [r0, r0 + n) from their logits (rows r0.. of last_logits) and
// updates their state. Every per-row array is offset to row r0, so a pipeline micro-batch
// selects its rows alone; beam search always takes all rows (beams of an entry interact).
void GptModel::select_tokens(int64_t r0, int64_t n) {
  Session& s = session_;
  cudaStream_t stream = ctx_->stream();
  const Scratch sc = scratch();
  const int rows = static_cast<int>(n), V = static_cast<int>(cfg_.vocab_size);
  const int64_t stride = cfg_.vocab_padded();  // logits row stride (vocab-parallel padding)
  const bool beam = s.beam > 1;
  TORCH_CHECK(r0 >= 0 && n >= 1 && r0 + n <= s.rows && (!beam || n == s.rows),
              "GptModel.select_tokens: the rows [", r0, ", ", r0 + n,
              ") must be a non-empty "
              "range inside the session's ",
              s.rows, " rows",
              beam ? ", and all of them in beam "
                     "search (beams of an entry interact)"
                   : "");
  // Row r0 of a per-row array of `per_row` elements per row (null stays null).
  auto at = [r0](auto* p, int64_t per_row = 1) { return p == nullptr ? p : p + r0 * per_row; };
  const void* logits = static_cast<const char*>(sc.last_logits) + r0 * stride * dtype_size(dtype_);
  const DecodeOptions& o = s.opt;
  if (!beam && o.greedy) {
    WF_DISPATCH_FLOATING(dtype_, "GptModel.decode", [&] {
      kernels::GreedyStepParams<scalar_t> g{};
      g.logits = static_cast<const scalar_t*>(logits);
      g.next_tokens = at(s.next_tok);
      g.cur_pos = at(s.cur_pos);
      g.attn_len = at(s.attn_len);
      g.finished = at(s.finished);
      g.output_ids = at(s.ids, s.ids_stride);
      g.seq_lengths = at(s.lengths);
      g.end_ids = at(s.end_ids);
      const int64_t chunks = kernels::greedy_step_chunks(V);
      g.arrivals = at(s.greedy_arrivals);
      g.partial_values = at(s.greedy_values, chunks);
      g.partial_indices = at(s.greedy_indices, chunks);
      g.rows = rows;
      g.vocab = V;
      g.logits_stride = stride;
      g.output_stride = static_cast<int>(s.ids_stride);
      WF_CUDA_CHECK(kernels::launch_greedy_step(g, stream));
    });
    return;
  }
  const kernels::BeamSearchState& bs = s.beam_state;
  if (beam && s.counts != nullptr) {
    // Beams reorder every step, so their token counts are recounted from the running sequences.
    kernels::TokenCountInitParams cp{};
    cp.counts = s.counts;
    cp.ids = bs.output_ids;
    cp.lengths = bs.attn_len;  // cur_pos + 1 tokens per row
    cp.rows = rows;
    cp.vocab = V;
    cp.ids_stride = static_cast<int>(s.total);
    WF_CUDA_CHECK(kernels::launch_init_token_counts(cp, stream));
  }
  float* proc = at(s.proc_logits, V);
  int32_t* counts = at(s.counts, V);
  // 1. processed fp32 logits
  WF_DISPATCH_FLOATING(dtype_, "GptModel.decode", [&] {
    kernels::LogitsProcessorParams<scalar_t> p{};
    p.out = proc;
    p.logits = static_cast<const scalar_t*>(logits);
    p.token_counts = counts;
    p.repetition_penalty = at(o.repetition_penalty);
    p.presence_penalty = at(o.presence_penalty);
    p.frequency_penalty = at(o.frequency_penalty);
    p.temperature = at(o.temperature);
    p.min_length = at(o.min_length);
    p.end_ids = at(s.end_ids);
    p.input_lengths = at(s.in_len_rows);
    p.cur_pos = beam ? bs.cur_pos : at(s.cur_pos);
    p.output_ids = beam ? bs.output_ids : at(s.ids, s.ids_stride);
    p.bad_words = at(o.bad_words, o.bad_words_row_stride);  // stride 0: one list for all rows
    p.logits_stride = stride;
    p.out_stride = V;
    p.bad_words_row_stride = o.bad_words_row_stride;
    p.bad_words_len = o.bad_words_len;
    p.output_stride = static_cast<int>(beam ? s.total : s.ids_stride);
    p.step = 0;  // unused: generated counts come from cur_pos and input_lengths
    p.rows = rows;
    p.vocab = V;
    WF_CUDA_CHECK(kernels::launch_process_logits(p, stream));
  });
  if (beam) {
    WF_CUDA_CHECK(
        kernels::launch_log_softmax<float>(s.proc_logits, V, s.proc_logits, V, rows, V, stream));
    kernels::BeamStepParams bp{};
    bp.s = bs;
    bp.log_probs = s.proc_logits;
    bp.log_probs_stride = V;
    bp.shared_rows = false;
    bp.vocab = V;
    bp.length_penalty = o.length_penalty;
    bp.diversity_rate = o.diversity_rate;
    bp.workspace = s.beam_ws;
    bp.workspace_bytes = s.beam_ws_bytes;
    WF_CUDA_CHECK(kernels::launch_beam_step(bp, stream));
    WF_CUDA_CHECK(kernels::launch_beam_update(bs, stream));
    return;
  }
  // 2. sample, 3. update
  kernels::SamplerParams sp{};
  sp.logits = proc;
  sp.tokens = at(s.sampled);
  sp.log_probs = at(s.token_lp);
  sp.top_k = at(o.top_k);
  sp.top_p = at(o.top_p);
  sp.seeds = at(o.seeds);
  sp.positions = at(s.cur_pos);
  sp.logits_stride = V;
  sp.position_offset = 1;
  sp.rows = rows;
  sp.vocab = V;
  WF_CUDA_CHECK(kernels::launch_sample_tokens(sp, stream));
  kernels::TokenUpdateParams up{};
  up.tokens = at(s.sampled);
  up.token_log_probs = at(s.token_lp);
  up.next_tokens = at(s.next_tok);
  up.cur_pos = at(s.cur_pos);
  up.attn_len = at(s.attn_len);
  up.finished = at(s.finished);
  up.output_ids = at(s.ids, s.ids_stride);
  up.seq_lengths = at(s.lengths);
  up.end_ids = at(s.end_ids);
  up.cum_log_probs = at(s.out.cum_log_probs);
  up.output_log_probs = at(s.out.output_log_probs, s.output_len);
  up.input_lengths = at(s.in_len_rows);
  up.token_counts = counts;
  up.stop_words = at(o.stop_words, o.stop_words_row_stride);
  up.stop_words_row_stride = o.stop_words_row_stride;
  up.stop_words_len = o.stop_words_len;
  up.log_probs_stride = static_cast<int>(s.output_len);
  up.vocab = V;
  up.output_stride = static_cast<int>(s.ids_stride);
  up.rows = rows;
  WF_CUDA_CHECK(kernels::launch_update_tokens(up, stream));
}

// The decode attention's inputs for rows [r0, r0 + n): each row's newest token at its position,
// in its own KV slot (slot = row), beams reading the prompt through the cache indirection.
layers::AttentionInputs GptModel::decode_attention(int64_t r0, int64_t n) {
  Session& s = session_;
  const bool beam = s.beam > 1;
  const kernels::BeamSearchState& bs = s.beam_state;
  layers::AttentionInputs ai{};
  ai.num_slots = static_cast<int>(kv_slots_);
  ai.max_seq = static_cast<int>(kv_seq_);
  ai.token_slot = s.iota + r0;
  ai.token_pos = (beam ? bs.cur_pos : s.cur_pos) + r0;
  ai.alibi_slopes = alibi_.as<float>();
  ai.decode = true;
  ai.row_slot = s.iota + r0;
  ai.lengths = (beam ? bs.attn_len : s.attn_len) + r0;
  ai.cache_indir = beam ? bs.cache_indir + r0 * kv_seq_ : nullptr;
  // token_slot = row_slot, token_pos = lengths - 1 and cache_indir[r, pos] = r hold here, as the
  // fused QKV preparation requires. It pays while the attention's (row, head) blocks fit in one
  // wave (two per SM): then it saves a kernel. With more blocks every one repeats the rotary
  // table and the separate kernel is cheaper (H200, gpt-j-6b batch 64: 5.72 fused vs 5.54 ms per
  // step; batch 1: 3.66 vs 3.86).
  ai.fused_prep = n * cfg_.local_heads() <= 2 * int64_t{ctx_->props().multiProcessorCount};
  ai.rotary_inv_freq = rotary_inv_freq_.as<float>();
  ai.workspace = s.split;
  ai.workspace_bytes = s.split_bytes;
  return ai;
}

// One decode step after the first: feed each row's newest token at its position.
void GptModel::decode_step_body() {
  Session& s = session_;
  const bool beam = s.beam > 1;
  const kernels::BeamSearchState& bs = s.beam_state;
  if (cfg_.first_stage()) {
    embed(beam ? bs.tokens : s.next_tok, beam ? bs.cur_pos : s.cur_pos, s.rows, 1);
  } else {
    stage_recv(s.rows);
  }
  run_layers(s.rows, decode_attention(0, s.rows));
  if (!cfg_.last_stage()) {
    stage_send(s.rows);
  } else {
    logits(buffers().n, s.rows, scratch().last_logits);
    select_tokens(0, s.rows);
  }
  share_state();
}

int64_t GptModel::decode_micro_batches() const {
  const Session& s = session_;
  const int64_t stages = cfg_.pipeline_para_size;
  const bool split = pp_comm_ != nullptr && stages > 1 && s.beam == 1 && s.rows >= stages;
  return split ? stages : 1;
}

// Pipeline parallelism, `steps` decode steps (after the first) with the rows split into one
// micro-batch per stage (M = P). Item k is micro-batch k % M of step k / M. The micro-batches go
// round a ring: stage s computes item k, then in one grouped call sends what it produced and
// receives what it needs for item k + 1 —
//   first stage:  sends the hidden states (and, when the next stage is not the last, the rows'
//                 token/position/length state, which that stage's attention reads) to stage 1;
//                 receives the state of item k + 1 - M (the same micro-batch one step earlier)
//                 from the last stage;
//   middle stage: sends hidden states + state on, receives those of item k + 1;
//   last stage:   selects the micro-batch's tokens, sends its new state to the first stage,
//                 receives the hidden states of item k + 1.
// With M = P every stage's group at one time pairs with its neighbours' groups, so the stages
// work on different micro-batches at once, across step boundaries, and no call waits for a peer
// that is waiting for it. The selection on the last stage is the same per-row work as without
// the split (rows are independent), so the tokens are the same. The call ends with the full state
// broadcast, as every unsplit step does, so the all-finished poll sees the same flags everywhere.
void GptModel::decode_steps_split(int64_t steps) {
  Session& s = session_;
  const int64_t M = decode_micro_batches();
  const int stage = static_cast<int>(cfg_.pipeline_para_rank);
  const int last_rank = static_cast<int>(cfg_.pipeline_para_size - 1);
  const bool first = cfg_.first_stage(), last = cfg_.last_stage();
  const int64_t K = steps * M;
  const size_t row_bytes = cfg_.hidden() * dtype_size(dtype_);
  const layers::LayerBuffers b = buffers();
  auto begin = [&](int64_t m) { return m * s.rows / M; };
  auto count = [&](int64_t m) { return begin(m + 1) - begin(m); };
  // The state stages need for an item: the token fed (first stage), its position and the
  // attention length; rows [r0, r0 + n) of each array.
  auto add_state = [&](std::vector<P2pOp>* ops, bool send, int64_t m, int peer) {
    const int64_t r0 = begin(m), bytes = count(m) * sizeof(int32_t);
    for (int32_t* a : {s.next_tok, s.cur_pos, s.attn_len}) {
      ops->push_back(P2pOp{send, a + r0, bytes, peer});
    }
  };
  // What this stage receives before item k.
  auto add_input = [&](std::vector<P2pOp>* ops, int64_t k) {
    const int64_t m = k % M;
    if (first) {
      if (k >= M) add_state(ops, false, m, last_rank);
      return;
    }
    ops->push_back(P2pOp{false, b.x, static_cast<int64_t>(count(m) * row_bytes), stage - 1});
    if (!last) add_state(ops, false, m, stage - 1);
  };
  std::vector<P2pOp> ops;
  add_input(&ops, 0);
  pp_comm_->send_recv(ops.data(), static_cast<int>(ops.size()), ctx_->stream());
  for (int64_t k = 0; k < K; ++k) {
    const int64_t m = k % M, r0 = begin(m), n = count(m);
    if (first) embed(s.next_tok + r0, s.cur_pos + r0, n, 1);
    run_layers(n, decode_attention(r0, n));
    ops.clear();
    if (!last) {
      // The final hidden states are in n (run_layers); x receives the next item meanwhile.
      ops.push_back(P2pOp{true, b.n, static_cast<int64_t>(n * row_bytes), stage + 1});
      if (stage + 1 != last_rank) add_state(&ops, true, m, stage + 1);
    } else {
      const size_t logit_row = cfg_.vocab_padded() * dtype_size(dtype_);
      logits(b.n, n, static_cast<char*>(scratch().last_logits) + r0 * logit_row);
      select_tokens(r0, n);
      if (k + M < K) add_state(&ops, true, m, 0);  // the first stage's item k + M
    }
    if (k + 1 < K) add_input(&ops, k + 1);
    pp_comm_->send_recv(ops.data(), static_cast<int>(ops.size()), ctx_->stream());
  }
  share_state();
}

// Pipeline parallelism: the last stage chose the tokens; every stage needs the new state
// (next_tok, cur_pos, attn_len, finished are contiguous). In beam search the stages' next step
// reads the beams' tokens, positions, lengths and cache indirection instead (every beam of an
// entry may have a new parent), and the all-finished poll reads the entries' done flags. The
// broadcasts form one group, one NCCL launch per step instead of up to six (nothing between them
// waits for one). Eager only: decode_step does not capture steps with pipeline parallelism.
void GptModel::share_state() {
  Session& s = session_;
  GroupScope group(pp_comm_);
  broadcast_from_last_stage(s.next_tok, 4 * s.rows * sizeof(int32_t));
  if (s.beam > 1) {
    const kernels::BeamSearchState& bs = s.beam_state;
    broadcast_from_last_stage(bs.tokens, s.rows * sizeof(int32_t));
    broadcast_from_last_stage(bs.cur_pos, s.rows * sizeof(int32_t));
    broadcast_from_last_stage(bs.attn_len, s.rows * sizeof(int32_t));
    broadcast_from_last_stage(bs.cache_indir, s.rows * kv_seq_ * sizeof(int32_t));
    broadcast_from_last_stage(bs.done, s.batch * sizeof(int32_t));
  }
  group.end();
}

int64_t GptModel::decode_step(int64_t max_steps) {
  Session& s = session_;
  TORCH_CHECK(s.active, "GptModel.decode_step: no generation session (call decode_start)");
  const StreamScope scope(this);
  cudaStream_t stream = ctx_->stream();
  int64_t n = 0;
  while (n < max_steps && s.steps_done < s.output_len && !s.stop) {
    // The all-finished flag copied at the end of the previous multiple of kPoll steps. With
    // tensor/pipeline parallelism every rank must stop at the same step, so the decision waits
    // for that copy (a host wait once every kPoll steps); alone, it only looks if the copy has
    // landed (else the flag is read at a later multiple of kPoll).
    const bool lockstep = (comm_ != nullptr && comm_->size() > 1) || pp_comm_ != nullptr;
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
      // First token of every row: logits of its last prompt token (kept by decode_start).
      if (cfg_.last_stage()) {
        WF_CUDA_CHECK(kernels::launch_gather_rows(scratch().last_rows, scratch().proj, s.first_rows,
                                                  s.rows, cfg_.hidden() * dtype_size(dtype_),
                                                  stream));
        logits(scratch().last_rows, s.rows, scratch().last_logits);
        select_tokens(0, s.rows);
      }
      share_state();
    } else if (const int64_t run = std::min(
                   {max_steps - n, s.output_len - s.steps_done, kPoll - s.steps_done % kPoll});
               decode_micro_batches() > 1 && run >= kMinSplitSteps) {
      // The steps up to the next poll (or the call's or session's end) as one pipelined run.
      decode_steps_split(run);
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
  if (pp_comm_ != nullptr && n > 0) {
    broadcast_from_last_stage(s.out.output_ids, s.rows * s.total * sizeof(int32_t));
  }
  return n;
}

void GptModel::decode_finish() {
  Session& s = session_;
  TORCH_CHECK(s.active, "GptModel.decode_finish: no generation session (call decode_start)");
  const StreamScope scope(this);
  if (s.beam > 1 && cfg_.last_stage()) {  // the other stages receive the outputs below
    kernels::BeamFinalizeParams fp{};
    fp.s = s.beam_state;
    fp.length_penalty = s.opt.length_penalty;
    fp.output_ids = s.out.output_ids;
    fp.out_stride = static_cast<int>(s.total);
    fp.sequence_lengths = s.out.sequence_lengths;
    fp.cum_log_probs = s.out.cum_log_probs;
    fp.output_log_probs = s.out.output_log_probs;
    WF_CUDA_CHECK(kernels::launch_beam_finalize(fp, ctx_->stream()));
  }
  if (pp_comm_ != nullptr) {  // every stage returns the last stage's results, in one launch
    GroupScope group(pp_comm_);
    const int64_t rows = s.rows;
    broadcast_from_last_stage(s.out.output_ids, rows * s.total * sizeof(int32_t));
    broadcast_from_last_stage(s.out.sequence_lengths, rows * sizeof(int32_t));
    if (s.out.cum_log_probs != nullptr) {
      broadcast_from_last_stage(s.out.cum_log_probs, rows * sizeof(float));
    }
    if (s.out.output_log_probs != nullptr) {
      broadcast_from_last_stage(s.out.output_log_probs, rows * s.output_len * sizeof(float));
    }
    group.end();
  }
  // The pinned flag may still be the target of a pending copy.
  if (s.flag_pending) WF_CUDA_CHECK(cudaEventSynchronize(flag_event_));
  drop_graphs(/*unshared_only=*/true);
  s.active = false;
}

void GptModel::decode_abort() {
  Session& s = session_;
  if (decode_stream_ != nullptr) cudaStreamSynchronize(decode_stream_);
  cudaStreamSynchronize(ctx_->stream());
  (void)cudaGetLastError();
  drop_graphs(/*unshared_only=*/false);
  s.flag_pending = false;
  s.active = false;
}

void GptModel::generate_greedy(const int32_t* ids, const std::vector<int32_t>& lengths, int64_t seq,
                               int64_t output_len, const int32_t* end_ids, int32_t* output_ids,
                               int32_t* seq_lengths) {
  DecodeOptions opt;
  opt.end_ids = end_ids;
  opt.greedy = true;
  DecodeOutputs out;
  out.output_ids = output_ids;
  out.sequence_lengths = seq_lengths;
  decode_start(ids, lengths, seq, output_len, opt, out);
  try {
    decode_step(output_len);
    decode_finish();
  } catch (...) {
    decode_abort();
    throw;
  }
}

}  // namespace gpt
}  // namespace warpformer
