// Generation-state update after a sampling step: appends each unfinished row's chosen token,
// accumulates log-probs, counts the token for the penalties, and ends rows on their end id, a
// stop word or the output limit. It is the sampled counterpart of the state update inside
// launch_greedy_step (greedy.h) and uses the same state layout.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace warpformer {
namespace kernels {

// State (as in greedy.h; all [rows] unless noted, rows = batch * beam):
//   cur_pos[r]   position of row r's newest token     attn_len[r]  cur_pos[r] + 1
//   finished[r]  1 once the row ended                  seq_lengths[r]  tokens in the row
//   output_ids   [rows, output_stride]: prompt, then generated tokens
// For each row with finished[r] == 0, with pos = cur_pos[r] + 1 and t = tokens[r]:
//   output_ids[r, pos] = t; cur_pos = pos; attn_len = seq_lengths = pos + 1; next_tokens = t
//   cum_log_probs[r] += token_log_probs[r]              (when both are given)
//   output_log_probs[r, col] = token_log_probs[r]       (when both are given; col < stride)
//     with col = pos - input_lengths[r] (the index of the generated token) when input_lengths
//     is given, else `step`
//   token_counts[r, t] += 1                             (when given; t in [0, vocab))
//   finished = 1 if t == end_ids[r], or pos + 1 >= output_stride (no room for another token), or
//   output_ids[r, 0..=pos] ends with one of the row's stop words (the match may reach back into
//   the prompt).
// Finished rows: next_tokens = end_ids[r]; nothing else is written (their output_log_probs
// entries are left as they are: zero-fill the buffer once per request).
// A row that is unfinished but already at pos >= output_stride (inconsistent state) is only
// marked finished.
// Stop words use the FT format of the bad words (logits_processor.h): [2, L] shared
// (stop_words_row_stride == 0) or [rows, 2, L] (stride 2 * L); -1 padded offsets.
struct TokenUpdateParams {
  const int32_t* tokens;          // [rows] chosen tokens
  const float* token_log_probs;   // [rows] or null
  int32_t* next_tokens;           // [rows] token fed to the next step
  int32_t* cur_pos;               // [rows]
  int32_t* attn_len;              // [rows]
  int32_t* finished;              // [rows]
  int32_t* output_ids;            // [rows, output_stride]
  int32_t* seq_lengths;           // [rows]
  const int32_t* end_ids;         // [rows]
  float* cum_log_probs;           // [rows] or null
  float* output_log_probs;        // [rows, log_probs_stride] or null
  int32_t* token_counts;          // [rows, vocab] or null
  const int32_t* input_lengths;   // [rows] prompt lengths, or null (see output_log_probs)
  const int32_t* stop_words;      // [2, L] or [rows, 2, L] or null
  int64_t stop_words_row_stride;  // 0 or 2 * L
  int stop_words_len;             // L
  int log_probs_stride;
  int step;   // output_log_probs column when input_lengths is null
  int vocab;  // columns of token_counts
  int output_stride;
  int rows;
};

cudaError_t launch_update_tokens(const TokenUpdateParams& p, cudaStream_t stream);

}  // namespace kernels
}  // namespace warpformer
