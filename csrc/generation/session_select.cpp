// Token selection of the generation session: greedy (argmax + state update in one kernel),
// sampling (logits processor -> top-k/top-p sampler with per-row Philox seeds -> state update
// with stop words, log probs and counts) and beam search (processor -> log_softmax -> beam step
// -> beam update, which reorders the running sequences and the KV-cache indirection).
#include <c10/util/Exception.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "csrc/core/check.h"
#include "csrc/generation/session.h"
#include "kernels/sampling/beam_search.h"
#include "kernels/sampling/greedy.h"
#include "kernels/sampling/logits_processor.h"
#include "kernels/sampling/sampler.h"
#include "kernels/sampling/token_update.h"

namespace warpformer {
namespace generation {

// Selects the next token of rows [r0, r0 + n) from their logits (rows r0.. of last_logits) and
// updates their state. Every per-row array is offset to row r0, so a pipeline micro-batch
// selects its rows alone; beam search always takes all rows (beams of an entry interact).
void Session::select_tokens(int64_t r0, int64_t n) {
  State& s = s_;
  cudaStream_t stream = ctx_.stream();
  const int rows = static_cast<int>(n), V = static_cast<int>(model_->vocab_size());
  const int64_t stride = model_->logits_stride();  // logits row stride (vocab-parallel padding)
  const bool beam = s.beam > 1;
  TORCH_CHECK(r0 >= 0 && n >= 1 && r0 + n <= s.rows && (!beam || n == s.rows), model_->name(),
              ".select_tokens: the rows [", r0, ", ", r0 + n,
              ") must be a non-empty "
              "range inside the session's ",
              s.rows, " rows",
              beam ? ", and all of them in beam "
                     "search (beams of an entry interact)"
                   : "");
  // Row r0 of a per-row array of `per_row` elements per row (null stays null).
  auto at = [r0](auto* p, int64_t per_row = 1) { return p == nullptr ? p : p + r0 * per_row; };
  const void* logits =
      static_cast<const char*>(model_->logits()) + r0 * stride * dtype_size(model_->dtype());
  const DecodeOptions& o = s.opt;
  if (!beam && o.greedy) {
    WF_DISPATCH_FLOATING(model_->dtype(), "generation.select_tokens", [&] {
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
  WF_DISPATCH_FLOATING(model_->dtype(), "generation.select_tokens", [&] {
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

}  // namespace generation
}  // namespace warpformer
