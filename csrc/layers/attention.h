// The attention step of a block: it reads the rows of the QKV product and writes the attention
// output rows. Self-attention over the KV cache is implemented here; an attention over another
// source (cross-attention over a cached encoder memory) is a function of the same shape,
// (LayerContext, AttentionIO, tokens, its own inputs), that the block calls in its place.
#pragma once

#include <cstddef>
#include <cstdint>

#include "csrc/layers/layer_context.h"

namespace warpformer {
namespace layers {

// The block's buffers the attention touches, all of the model dtype.
struct AttentionIO {
  const void* qkv;       // [tokens, 3 * q_width] the QKV product (bias not yet added)
  const void* qkv_bias;  // [3 * q_width] or null
  void* q;               // [tokens, q_width] scratch (rotated queries)
  void* out;             // [tokens, q_width]
};

// Where self-attention reads and writes: the layer's KV cache and the token -> (slot, position)
// map, plus either the packed-prefill description or the one-token-per-row decode description.
struct AttentionInputs {
  void* k_cache;  // [num_slots, kv_heads, max_seq, head_dim]
  void* v_cache;
  int num_slots;
  int max_seq;
  const int32_t* token_slot;  // [tokens]
  const int32_t* token_pos;   // [tokens]
  const float* alibi_slopes;  // [heads] or null
  int window;                 // > 0: each query sees its last `window` positions (sliding window)
  // T5's relative bias: [heads, 2 * bias_max_distance + 1] fp32 per clamped key - query distance
  // (kernels::ContextAttentionParams::position_bias), or null.
  const float* position_bias;
  int bias_max_distance;
  bool bidirectional;  // an encoder's prompt pass: every query sees its whole sequence
  bool decode;
  // prefill
  const int32_t* cu_seqlens;  // [batch + 1]
  const int32_t* seq_slot;    // [batch]
  const int32_t* seq_past;    // [batch] positions each slot held before this pass, or null (0)
  int batch;
  int max_seqlen;
  // decode (rows == tokens)
  const int32_t* row_slot;     // [rows] or null
  const int32_t* lengths;      // [rows]
  const int32_t* cache_indir;  // [rows, max_seq] or null
  // QKV preparation inside the decode attention kernel; requires token_slot = row_slot (or
  // iota), token_pos = lengths - 1 and cache_indir[r, token_pos[r]] = the row's slot.
  bool fused_prep;
  const float* rotary_inv_freq;  // [rotary_dim / 2] (kernels::launch_rotary_inv_freq) or null
  float* workspace;              // split-KV scratch (also the cross-attention's)
  size_t workspace_bytes;
  // A decoder block's cross-attention (LayerSpec::cross_attention): token t's query attends to
  // the first lengths[t] positions of slot row_slot[t] of this layer's memory, [num_slots, heads,
  // max_seq, head_dim] K and V (the encoder output's projections, written once per call).
  struct Cross {
    const void* k;
    const void* v;
    int num_slots;
    int max_seq;
    const int32_t* row_slot;  // [tokens]
    const int32_t* lengths;   // [tokens]
  } cross;
};

// Self-attention of `tokens` rows (causal, or bidirectional: AttentionInputs::bidirectional):
// q, k, v prepared (bias, rotary) with k and v written to the cache, then attention over each
// row's cached positions.
void self_attention(const LayerContext& lc, const AttentionIO& io, int64_t tokens,
                    const AttentionInputs& ai);

// Cross-attention of `tokens` queries q [tokens, q_width] (already projected) into out, over the
// memory ai.cross describes; uses ai.workspace.
void cross_attention(const LayerContext& lc, const void* q, void* out, int64_t tokens,
                     const AttentionInputs& ai);

// Writes the memory of one layer's cross-attention: kv [tokens, 2 * heads * head_dim] (the
// encoder output's K then V projection, bias not yet added) into the caches k/v [num_slots,
// heads, max_seq, head_dim] at (token_slot[t], token_pos[t]).
void write_cross_memory(const LayerContext& lc, const void* kv, const void* kv_bias, void* k,
                        void* v, int num_slots, int max_seq, const int32_t* token_slot,
                        const int32_t* token_pos, int64_t tokens);

// The split-KV workspace self_attention needs at decode for `rows` rows and `max_seq` positions.
size_t self_attention_workspace_bytes(const LayerSpec& spec, int64_t rows, int64_t max_seq);

}  // namespace layers
}  // namespace warpformer
