// Logits processing before sampling, and the token-count buffer its penalties read.
//
// The order follows HF's logits processors and docs/GENERATION_API.md:
//   repetition penalty -> frequency penalty -> presence penalty -> min_length and bad-words bans
//   -> temperature.
// All launchers take raw device pointers and a stream, never synchronise the host, and are safe
// to capture in a CUDA graph. They return cudaErrorInvalidValue for arguments they cannot handle.
// "rows" is batch * beam_width; every per-row array has `rows` entries, and a null per-row array
// means every row takes the default.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace warpformer {
namespace kernels {

// ---- token counts ------------------------------------------------------------------------------
// counts[r, t] = how many times token t occurs in row r's sequence so far (prompt included).
// Tokens outside [0, vocab) are ignored.

// counts[r, :] = histogram of ids[r, 0 : lengths[r]] (right-padded prompts; entries past the
// length are not read). Overwrites the whole [rows, vocab] buffer.
struct TokenCountInitParams {
  int32_t* counts;         // [rows, vocab]
  const int32_t* ids;      // [rows, ids_stride] (e.g. the prompt, or output_ids)
  const int32_t* lengths;  // [rows]
  int rows;
  int vocab;
  int ids_stride;  // >= max(lengths)
};
cudaError_t launch_init_token_counts(const TokenCountInitParams& p, cudaStream_t stream);

// counts[r, tokens[r]] += 1 for each row with finished == null or finished[r] == 0. Call it with
// the finished flags of *before* the token update, or let launch_update_tokens do the increment
// (TokenUpdateParams::token_counts), which counts exactly the tokens it appends.
struct TokenCountAddParams {
  int32_t* counts;          // [rows, vocab]
  const int32_t* tokens;    // [rows]
  const int32_t* finished;  // [rows] or null
  int rows;
  int vocab;
};
cudaError_t launch_add_token_counts(const TokenCountAddParams& p, cudaStream_t stream);

// ---- logits processor --------------------------------------------------------------------------
// For each row r and column v < vocab (x = float(logits[r, v]), c = token_counts[r, v]):
//   if c > 0:  x = x < 0 ? x * repetition_penalty[r] : x / repetition_penalty[r]   (HF; once per
//                                                         distinct token, whatever c is)
//              x -= frequency_penalty[r] * c
//              x -= presence_penalty[r]
//   x = -inf   if v == end_ids[r] and generated(r) < min_length[r]
//   x = -inf   if v is banned by a bad-words entry of row r (below)
//   out[r, v] = x / temperature[r]
// generated(r) = cur_pos[r] + 1 - input_lengths[r] when both are given, else `step` (the number
// of tokens every unfinished row has generated so far in a loop that started all rows together).
//
// Bad words (FT format): `bad_words` points at [2, L] int32 (row 0: the entries' token ids
// concatenated; row 1: each entry's exclusive end offset into row 0, -1 padded) shared by all
// rows when bad_words_row_stride == 0, or at [rows, 2, L] with bad_words_row_stride == 2 * L.
// An entry of one token is always banned. An entry w[0..n) with n > 1 bans w[n-1] when
// w[0..n-1) equals output_ids[r, cur_pos[r] - n + 2 ..= cur_pos[r]] (the end of the sequence so
// far, prompt included). Entries with bad offsets and tokens outside [0, vocab) are ignored.
//
// Defaults of null per-row arrays: penalties 1 / 0 / 0 (off), temperature 1, min_length 0.
// token_counts is needed only when a penalty array is given; end_ids only with min_length;
// output_ids and cur_pos only with multi-token bad words. Temperature must be > 0 and the
// repetition penalty > 0 (the caller validates; non-positive values are treated as 1).
// Only columns [0, vocab) of `out` are written; padded columns are left alone.
template <typename T>
struct LogitsProcessorParams {
  float* out;                       // [rows, out_stride]
  const T* logits;                  // [rows, logits_stride]
  const int32_t* token_counts;      // [rows, vocab] or null
  const float* repetition_penalty;  // [rows] or null
  const float* presence_penalty;    // [rows] or null
  const float* frequency_penalty;   // [rows] or null
  const float* temperature;         // [rows] or null
  const int32_t* min_length;        // [rows] or null
  const int32_t* end_ids;           // [rows] (needed with min_length)
  const int32_t* input_lengths;     // [rows] or null (see generated(r))
  const int32_t* cur_pos;           // [rows] or null
  const int32_t* output_ids;        // [rows, output_stride] or null
  const int32_t* bad_words;         // [2, L] or [rows, 2, L] or null
  int64_t logits_stride;            // >= vocab, or 0: all rows read row 0
  int64_t out_stride;               // >= vocab
  int64_t bad_words_row_stride;     // 0 (shared) or 2 * L
  int bad_words_len;                // L
  int output_stride;
  int step;
  int rows;
  int vocab;
};

template <typename T>
cudaError_t launch_process_logits(const LogitsProcessorParams<T>& p, cudaStream_t stream);

}  // namespace kernels
}  // namespace warpformer
