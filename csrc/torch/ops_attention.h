// Stateless torch ops of the attention kernel family (implementations and schemas in
// ops_attention.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <cstdint>
#include <string>

namespace warpformer {
namespace ops {

using OptTensor = c10::optional<at::Tensor>;

// q [tokens, heads, head_dim] = rotary(qkv[:, 0] + bias[0]); k/v (rotated k) written in place into
// k_cache/v_cache [slots, heads, max_seq, head_dim] at (token_slot[t], :, token_pos[t]).
at::Tensor qkv_rotary_cache(const at::Tensor& qkv, const OptTensor& bias, at::Tensor& k_cache,
                            at::Tensor& v_cache, const at::Tensor& token_slot,
                            const at::Tensor& token_pos, int64_t rotary_dim,
                            const std::string& rotary_style, double rotary_base);

// k/v [tokens, 2, kv_heads, head_dim] or [tokens, 2 kv_heads, head_dim] (+ bias, kv's shape without
// the tokens) written in place into k_cache/v_cache [slots, kv_heads, max_seq, head_dim] at
// (token_slot[t], :, token_pos[t]); no query, no rotary (a cross-attention's memory).
void kv_cache_write(const at::Tensor& kv, at::Tensor& k_cache, at::Tensor& v_cache,
                    const at::Tensor& token_slot, const at::Tensor& token_pos,
                    const OptTensor& bias = c10::nullopt);

// Causal attention of packed sequences (cu_seqlens) against their cache slots (seq_slot); window
// > 0: each query sees only its last `window` positions; seq_past [batch]: positions already
// cached before each sequence's rows (none: 0); position_bias [heads, 2 bias_max_distance + 1]
// (fp32): T5's relative bias per clamped key - query distance; causal false: every query sees
// its whole sequence (window 0).
at::Tensor context_attention(const at::Tensor& q, const at::Tensor& k_cache,
                             const at::Tensor& v_cache, const at::Tensor& cu_seqlens,
                             const at::Tensor& seq_slot, const OptTensor& alibi_slopes,
                             double scale, int64_t max_seqlen, int64_t window = 0,
                             const OptTensor& seq_past = c10::nullopt,
                             const OptTensor& position_bias = c10::nullopt,
                             int64_t bias_max_distance = 0, bool causal = true);

// One query per row against lengths[r] cache positions (optionally through cache_indir), with
// context_attention's position_bias.
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k_cache,
                            const at::Tensor& v_cache, const OptTensor& row_slot,
                            const at::Tensor& lengths, const OptTensor& cache_indir,
                            const OptTensor& alibi_slopes, double scale, int64_t window = 0,
                            const OptTensor& position_bias = c10::nullopt,
                            int64_t bias_max_distance = 0);

// decode_attention with the QKV preparation fused in: the query is formed from qkv [rows, 3,
// heads, head_dim] (+ bias, rotary at lengths[r] - 1), and the new token's rotated k and its v are
// written in place into k_cache/v_cache at (row_slot[r] or r, :, lengths[r] - 1) — the same as
// qkv_rotary_cache followed by decode_attention, in one kernel.
at::Tensor decode_attention_fused(const at::Tensor& qkv, const OptTensor& bias, at::Tensor& k_cache,
                                  at::Tensor& v_cache, const OptTensor& row_slot,
                                  const at::Tensor& lengths, const OptTensor& cache_indir,
                                  const OptTensor& alibi_slopes, double scale, int64_t rotary_dim,
                                  const std::string& rotary_style, double rotary_base,
                                  int64_t window = 0, const OptTensor& position_bias = c10::nullopt,
                                  int64_t bias_max_distance = 0);

// HF BLOOM ALiBi slopes for num_heads heads, float32 on the CPU.
at::Tensor alibi_slopes(int64_t num_heads);

}  // namespace ops
}  // namespace warpformer
