// Stateless torch ops of the sampling kernel family (kernels/sampling): token counts, logits
// processing, the sampler and the generation-state update. Implementations, schemas and
// registration in ops_sampling.cpp; fake implementations in python/warpformer/_ops_sampling.py.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <cstdint>
#include <tuple>

namespace warpformer {
namespace ops {

using OptTensor = c10::optional<at::Tensor>;

// int32 [rows, vocab]: occurrences of each token in ids[r, :lengths[r]].
at::Tensor count_tokens(const at::Tensor& ids, const at::Tensor& lengths, int64_t vocab);

// counts[r, tokens[r]] += 1 for the rows with finished[r] == 0 (all rows without `finished`).
void add_token_counts(at::Tensor& counts, const at::Tensor& tokens, const OptTensor& finished);

// float32 [rows, vocab]: penalties, min_length and bad-words bans (-inf), temperature.
at::Tensor process_logits(const at::Tensor& logits, const OptTensor& token_counts,
                          const OptTensor& repetition_penalty, const OptTensor& presence_penalty,
                          const OptTensor& frequency_penalty, const OptTensor& temperature,
                          const OptTensor& min_length, const OptTensor& end_ids,
                          const OptTensor& input_lengths, const OptTensor& cur_pos,
                          const OptTensor& output_ids, const OptTensor& bad_words, int64_t vocab,
                          int64_t step);

// (tokens int32 [rows], log_probs float32 [rows]) drawn from processed float32 logits.
std::tuple<at::Tensor, at::Tensor> sample_tokens(const at::Tensor& logits, const at::Tensor& top_k,
                                                 const at::Tensor& top_p, const at::Tensor& seeds,
                                                 const at::Tensor& positions, int64_t vocab);

// int32 [rows]: each row's argmax (lowest index among ties, NaN never chosen) by the engine's
// greedy-step kernel, its vocabulary split over blocks (split) or one block per row.
at::Tensor greedy_tokens(const at::Tensor& logits, int64_t vocab, bool split);

// Appends tokens to the generation state in place; returns next_tokens int32 [rows].
at::Tensor update_tokens(const at::Tensor& tokens, const OptTensor& log_probs, at::Tensor& cur_pos,
                         at::Tensor& attn_len, at::Tensor& finished, at::Tensor& output_ids,
                         at::Tensor& seq_lengths, const at::Tensor& end_ids,
                         const OptTensor& stop_words, const OptTensor& cum_log_probs,
                         const OptTensor& output_log_probs, int64_t step,
                         const OptTensor& token_counts, const OptTensor& input_lengths);

}  // namespace ops
}  // namespace warpformer
