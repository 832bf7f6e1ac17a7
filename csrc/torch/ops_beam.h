// Stateless torch ops of the beam-search kernel family (kernels/sampling/beam_search.h):
// implementations, schemas (TORCH_LIBRARY_FRAGMENT) and CUDA/CPU registrations in ops_beam.cpp.
// They are test and user entry points; the engine calls the launchers directly with the same
// state held in its own buffers.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <tuple>

namespace warpformer {
namespace ops {

// fp32 log_softmax over the last axis of logits [rows, V] (fp32/fp16/bf16).
at::Tensor beam_log_softmax(const at::Tensor& logits);

// A fresh beam-search state for input_ids int32 [B, S] (row b valid up to input_lengths[b]).
// Returns (output_ids [B*W, S+output_len], cache_indir [B*W, max_seq], cum_log_probs [B, W],
// cur_pos [B*W], attn_len [B*W], gen_len [B], done [B], hyp_count [B], hyp_score [B, W],
// hyp_cum [B, W], hyp_len [B, W], hyp_ids [B, W, S+output_len], run_log_probs [B*W, output_len],
// hyp_log_probs [B, W, output_len]).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
           at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
beam_search_init(const at::Tensor& input_ids, const at::Tensor& input_lengths,
                 const at::Tensor& end_ids, int64_t beam_width, int64_t output_len, int64_t max_seq,
                 bool shared_prompt_slot);

// One step: log_probs fp32 [B*W, V] (or [B, V], one row per entry). Updates cum_log_probs, done
// and the hypothesis store in place; returns (parents, tokens, token_log_probs), each [B, W].
std::tuple<at::Tensor, at::Tensor, at::Tensor> beam_search_step(
    const at::Tensor& log_probs, const at::Tensor& input_lengths, const at::Tensor& end_ids,
    const at::Tensor& output_ids, const at::Tensor& run_log_probs, const at::Tensor& gen_len,
    at::Tensor& cum_log_probs, at::Tensor& done, at::Tensor& hyp_count, at::Tensor& hyp_score,
    at::Tensor& hyp_cum, at::Tensor& hyp_len, at::Tensor& hyp_ids, at::Tensor& hyp_log_probs,
    double length_penalty, double diversity_rate);

// Reorders the running rows by parent and appends the step's tokens (in place).
void beam_search_update(const at::Tensor& parents, const at::Tensor& tokens,
                        const at::Tensor& token_log_probs, const at::Tensor& input_lengths,
                        at::Tensor& gen_len, at::Tensor& output_ids, at::Tensor& cache_indir,
                        at::Tensor& run_log_probs, at::Tensor& cur_pos, at::Tensor& attn_len);

// The W best hypotheses per entry, best first: (output_ids [B, W, out_stride], sequence_lengths
// [B, W], cum_log_probs [B, W], scores [B, W], output_log_probs [B, W, output_len]).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> beam_search_finalize(
    const at::Tensor& input_lengths, const at::Tensor& end_ids, const at::Tensor& output_ids,
    const at::Tensor& run_log_probs, const at::Tensor& cum_log_probs, const at::Tensor& gen_len,
    const at::Tensor& done, const at::Tensor& hyp_count, const at::Tensor& hyp_score,
    const at::Tensor& hyp_cum, const at::Tensor& hyp_len, const at::Tensor& hyp_ids,
    const at::Tensor& hyp_log_probs, double length_penalty, int64_t out_stride);

}  // namespace ops
}  // namespace warpformer
