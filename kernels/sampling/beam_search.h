// Beam search on the device (FT's beam_width, len_penalty and beam_search_diversity_rate) with
// the semantics of HF transformers 5.x `generate(num_beams=W, do_sample=False,
// early_stopping=False, length_penalty=lp)`, plus the reordering of the running sequences and of
// the KV-cache indirection that the decode attention reads. No host synchronisation: every
// decision (which beams continue, which hypotheses are kept, when a batch entry is done) is taken
// on the device, so a whole decode step can be captured in a CUDA graph.
//
// Rows: rows = batch * beam, row r = b * beam + k is beam k of batch entry b, and row r writes its
// new tokens' K/V into cache slot r. Positions are absolute: row r holds its prompt at positions
// [0, len_b) and its generated tokens from len_b on (len_b = input_lengths[b]); all beams of a
// batch entry share the prompt, so they are always at the same position.
//
// One step (W = beam, K = 2W candidates; all arithmetic fp32, rounded as PyTorch does):
//   1. s[k, v] = cum_log_probs[b, k] + log_probs[row, v]. Per row, the top K by (s desc, v asc);
//      a candidate's score is s - diversity_rate * (its rank 0..K-1 within its row) (FT's
//      diversity; 0 = HF). Over the W rows of the entry, the top K candidates by
//      (score desc, k * vocab + v asc): candidate ranks 0..K-1.
//   2. A candidate hits the end when its token is end_ids[b]. Running beams for the next step:
//      the top W candidates by (score + (hit ? -1e9 : 0)) desc, rank asc; their cum_log_probs
//      are those values. (Beams k > 0 start at -1e9 so that the first step, whose W rows are
//      identical, draws from beam 0 only — HF's initialisation.)
//   3. Unless the entry is done, each candidate of rank < W that hits the end becomes a finished
//      hypothesis with score = score / n^lp, n = number of generated tokens including the end
//      token (HF: cur_len + 1 - prompt_len). The store keeps the best W hypotheses: a new one
//      fills a free slot, or replaces the lowest-scoring slot (ties: the highest slot index) when
//      its score is strictly greater. Slots are unsorted; the finalize kernel sorts them.
//   4. HF's early-stop heuristic (early_stopping=False): the entry becomes done (for good) when
//      the store is full and !(best running score / n^lp > lowest stored score), where the best
//      running score is the (penalised) score of new running beam 0. A done entry keeps its
//      store; its running beams only repeat end_id (parent = itself) so the loop may run on.
//   5. Finalize (max length reached): entries that are not done add their running beams (in rank
//      order) as hypotheses with score = cum / n^lp; the W hypotheses are written best first.
//      Equal to HF, which at the last step adds the top-W candidates: the running beams are a
//      superset of those that are not end tokens, and the extra ones never outrank them.
// Differences from HF only in exact ties (HF's torch.topk order is unspecified there) and in the
// length-penalty division on CUDA (HF's GPU path multiplies by the reciprocal; this code divides,
// like HF on the CPU).
//
// Per-step call sequence of a generation loop (see docs/ARCHITECTURE.md):
//   launch_beam_init                                      once, after the prompt's prefill
//   loop: log-probs [rows, V] (or [batch, V] for the first step: shared_rows)
//         -> launch_beam_step -> launch_beam_update -> feed tokens[r] at cur_pos[r] (K/V into slot
//         r at cur_pos[r], attention over attn_len[r] positions through cache_indir)
//   launch_beam_finalize                                  once
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace warpformer {
namespace kernels {

constexpr int kMaxBeamWidth = 16;
// HF's "impossible" score: the initial score of beams k > 0 and the penalty of end tokens among
// the running candidates.
constexpr float kBeamImpossible = -1.0e9f;

// Device state of a beam search. All pointers are device memory, written only by the launchers
// below; the loop reads cur_pos, attn_len, tokens, cache_indir and done.
struct BeamSearchState {
  int batch;
  int beam;          // 1 .. kMaxBeamWidth
  int ids_stride;    // row stride of output_ids / hyp_ids (>= max prompt + output_len)
  int indir_stride;  // row stride of cache_indir (the KV cache's max_seq)
  int max_out;       // row stride of the log-prob buffers (output_len), 0 if none
  // running beams
  float* cum_log_probs;          // [batch, beam]
  int32_t* output_ids;           // [rows, ids_stride] prompt, then generated tokens
  float* run_log_probs;          // [rows, max_out] log prob of each generated token, or null
  int32_t* cache_indir;          // [rows, indir_stride] KV slot to read position p of row r from
  int32_t* cur_pos;              // [rows] position of the newest token (fed to the next step)
  int32_t* attn_len;             // [rows] cur_pos + 1 (cache length of the next step)
  int32_t* gen_len;              // [batch] generated tokens per running beam so far
  const int32_t* input_lengths;  // [batch] prompt lengths (>= 1)
  const int32_t* end_ids;        // [batch] end token (outside [0, vocab): never ends)
  // result of the last step (inputs of launch_beam_update)
  int32_t* parents;        // [batch, beam] beam (0..beam-1) each new beam continues
  int32_t* tokens;         // [batch, beam] its new token (= the next step's input, row order)
  float* token_log_probs;  // [batch, beam] log_probs[parent row, token]
  // finished hypotheses (slot order, unsorted)
  int32_t* done;         // [batch] 1 once the entry cannot improve (sticky)
  int32_t* hyp_count;    // [batch] filled slots, 0..beam
  float* hyp_score;      // [batch, beam] cum / n^lp
  float* hyp_cum;        // [batch, beam] cum log prob (score before length penalty)
  int32_t* hyp_len;      // [batch, beam] total length (prompt + generated, end included)
  int32_t* hyp_ids;      // [batch, beam, ids_stride]
  float* hyp_log_probs;  // [batch, beam, max_out] or null (filled only with run_log_probs)
};

// Prompt into every running row (end_id past it), cache_indir[r, p] = prompt slot for p < len_b
// (b * beam when shared_prompt_slot — the prompt was prefilled once per entry, into slot b*beam —
// else r) and r elsewhere, run_log_probs = 0, cur_pos = len_b - 1, attn_len = len_b,
// cum_log_probs = (0, -1e9, ...), parents = k, tokens = last prompt token, token_log_probs = 0,
// gen_len = done = hyp_count = 0. The hypothesis buffers need no initialisation.
cudaError_t launch_beam_init(const BeamSearchState& s,
                             const int32_t* input_ids,  // [batch, input_stride]
                             int64_t input_stride, bool shared_prompt_slot, cudaStream_t stream);

struct BeamStepParams {
  BeamSearchState s;
  const float* log_probs;  // [rows, vocab] or [batch, vocab] when shared_rows (row stride ld)
  int64_t log_probs_stride;
  bool shared_rows;       // one log-prob row per batch entry (the first step)
  int vocab;              // >= 2; beam * vocab + 2 * beam^2 < 2^31
  double length_penalty;  // double, as HF's Python float: n ** lp is formed in double
  float diversity_rate;   // >= 0 recommended; 0 = HF
  void* workspace;        // beam_search_workspace_bytes(batch, beam, vocab) bytes
  size_t workspace_bytes;
};

// Scratch of launch_beam_step: the per-row, per-vocab-split candidate lists. The split depends
// only on (rows, vocab).
size_t beam_search_workspace_bytes(int batch, int beam, int vocab);
int beam_search_num_splits(int rows, int vocab);

// Steps 1-4 above: writes parents, tokens, token_log_probs, cum_log_probs and the hypothesis
// store (copying the parent's running sequence from output_ids / run_log_probs). Entries already
// done get parents = k, tokens = end_id, token_log_probs = 0 and keep their cum_log_probs.
cudaError_t launch_beam_step(const BeamStepParams& p, cudaStream_t stream);

// Reorders the running beams after launch_beam_step. With pos = len_b + gen_len[b]: new row
// (b, k) takes parent row (b, parents[b, k])'s output_ids and cache_indir at positions
// [len_b, pos) (the prompt part never changes) and run_log_probs at [0, gen_len); then
// output_ids[r, pos] = tokens[r], cache_indir[r, pos] = r (the slot its new K/V goes to),
// run_log_probs[r, gen_len] = token_log_probs[r], cur_pos[r] = pos, attn_len[r] = pos + 1, and
// gen_len[b] += 1. In place: one block owns the rows of one entry.
cudaError_t launch_beam_update(const BeamSearchState& s, cudaStream_t stream);

struct BeamFinalizeParams {
  BeamSearchState s;  // read only
  double length_penalty;
  int32_t* output_ids;  // [batch, beam, out_stride] (not aliasing s.output_ids)
  int out_stride;
  int32_t* sequence_lengths;  // [batch, beam]
  float* cum_log_probs;       // [batch, beam] or null
  float* scores;              // [batch, beam] (cum / n^lp) or null
  float* output_log_probs;    // [batch, beam, s.max_out] (0 past the end) or null
};

// Step 5 above, without modifying the state (it may be called again). Beams best first
// (score desc, slot asc); output_ids holds end_id past each sequence.
cudaError_t launch_beam_finalize(const BeamFinalizeParams& p, cudaStream_t stream);

// out[r, v] = logits[r, v] - max_r - log(sum_v exp(logits[r, v] - max_r)) in fp32 (HF's
// log_softmax of the fp32-upcast logits); NaN entries count as -inf, and a row with no finite
// entry gives -inf everywhere. May run in place (out == logits with T = float, equal strides).
template <typename T>
cudaError_t launch_log_softmax(float* out,  // [rows, out_stride]
                               int64_t out_stride,
                               const T* logits,  // [rows, in_stride]
                               int64_t in_stride, int rows, int vocab, cudaStream_t stream);

}  // namespace kernels
}  // namespace warpformer
