// Attention kernels of the decoder (and of T5's encoder): QKV preparation (bias, rotary, KV-cache
// write), causal or bidirectional context (prefill) attention over packed sequences, and
// single-token decode attention over the KV cache, plus the ALiBi slopes. Launchers take raw
// pointers and a stream and return the launch status (cudaErrorInvalidValue for arguments they
// cannot handle) for the caller to check. No torch here.
//
// Layouts (one layer, one tensor-parallel rank; `heads` is this rank's head count, `kv_heads` its
// key/value heads: heads for multi-head attention, a divisor of heads for grouped-query attention,
// query head h reading key/value head h / (heads / kv_heads); kv_heads 0 in a params struct means
// heads):
//   qkv      [tokens, heads + 2 kv_heads, head_dim]   all Q heads, then all K heads, then all V
//            heads ([tokens, 3, heads, head_dim] for multi-head attention)
//   k_cache, v_cache [slots, kv_heads, max_seq, head_dim], contiguous; a slot is one sequence's row
//   q / out  [tokens or rows, heads, head_dim]
// Element types: float, __half, __nv_bfloat16; all arithmetic in fp32.
// Head sizes: kAttentionHeadDims, FasterTransformer's set (anything else returns
// cudaErrorInvalidValue).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace warpformer {
namespace kernels {

// The head sizes the attention kernels are instantiated for (WF_HEAD_DIM_SWITCH lists the same):
// every multiple of 16 up to 256 that FasterTransformer served, 32 for the small Pythia models.
constexpr int kAttentionHeadDims[] = {32, 48, 64, 80, 96, 112, 128, 144, 160, 192, 224, 256};
constexpr const char* kAttentionHeadDimsText =
    "32, 48, 64, 80, 96, 112, 128, 144, 160, 192, 224, 256";

inline bool attention_head_dim_supported(int head_dim) {
  for (int d : kAttentionHeadDims) {
    if (d == head_dim) return true;
  }
  return false;
}

// Rotary position embedding on the first rotary_dim dims of each head of q and k.
//   kInterleaved (GPT-J):  pairs (2i, 2i+1)
//   kHalf        (GPT-NeoX): pairs (i, i + rotary_dim/2)
// with angle = position * inv_freq_i, inv_freq_i = 1 / base^(2i / rotary_dim), i < rotary_dim/2,
// and (x, y) -> (x cos - y sin, y cos + x sin). The angle is formed in fp32 exactly as HF does
// (fp32 inv_freq, one fp32 multiply) so that long positions agree with HF's rounding.
enum class RotaryStyle { kNone = 0, kInterleaved = 1, kHalf = 2 };

// ---- 1. QKV preparation -----------------------------------------------------------------------
// For each token t and head h:
//   q_out[t, h]                               = rotary(qkv[t, 0, h] (+ bias[0, h]), pos)
//   k_cache[token_slot[t], h, token_pos[t]]   = rotary(qkv[t, 1, h] (+ bias[1, h]), pos)
//   v_cache[token_slot[t], h, token_pos[t]]   = qkv[t, 2, h] (+ bias[2, h])
// with pos = token_pos[t]. Tokens whose slot is outside [0, num_slots) or whose position is outside
// [0, max_seq) write no cache entry (q_out is still written, with the rotary of that position).
// kv_only (an encoder-decoder's cross-attention memory: the encoder output projected to K and V):
// qkv rows hold only the K and V heads, [tokens, 2 kv_heads, head_dim] (K heads, then V heads),
// bias (if any) is [2 kv_heads, head_dim], only the caches are written (q_out is not read and may
// be null; heads is ignored) and there is no rotary: kv_heads must be > 0 and rotary_dim 0, else
// cudaErrorInvalidValue.
template <typename T>
struct QkvPrepParams {
  T* q_out;                   // [tokens, heads, head_dim]
  T* k_cache;                 // [num_slots, kv_heads, max_seq, head_dim]
  T* v_cache;                 // [num_slots, kv_heads, max_seq, head_dim]
  const T* qkv;               // [tokens, heads + 2 kv_heads, head_dim]
  const T* bias;              // [heads + 2 kv_heads, head_dim] or null
  const int32_t* token_slot;  // [tokens]
  const int32_t* token_pos;   // [tokens]
  int tokens;
  int heads;
  int head_dim;  // one of the supported head sizes
  int num_slots;
  int max_seq;
  int rotary_dim;            // even, 0 <= rotary_dim <= head_dim; 0 = no rotary
  RotaryStyle rotary_style;  // ignored when rotary_dim == 0
  float rotary_base;         // e.g. 10000
  int kv_heads = 0;          // 0: heads; else a divisor of heads (qkv and bias [heads + 2 kv])
  const float* rotary_inv_freq = nullptr;  // [rotary_dim / 2] (scaled rotary), or null: from base
  float rotary_mscale = 1.f;  // factor on cos and sin (yarn's attention factor; 1 otherwise)
  bool kv_only = false;       // qkv [tokens, 2 kv_heads, head_dim]: write the caches only (above)
};

template <typename T>
cudaError_t launch_qkv_prep(const QkvPrepParams<T>& p, cudaStream_t stream);

// ---- 2. Context (prefill) attention -----------------------------------------------------------
// Self-attention of packed sequences (causal, or bidirectional: `causal`), each possibly
// continuing one already cached (an interactive session's next turn runs only its new tokens).
// Sequence b owns rows cu_seqlens[b] .. cu_seqlens[b+1]-1 of q and out; with past_b = seq_past[b]
// (0 without seq_past) positions of cache slot seq_slot[b] already written, row i of the sequence
// is position P = past_b + i, and it reads keys/values at positions 0 .. past_b + len_b - 1 of that
// slot (the new rows' own written beforehand by launch_qkv_prep at positions past_b ..):
//   out[t, h] = softmax_k( scale * q[t, h] . K[k] + alibi[h] * (k - P) + rel[h](k - P) ) . V
// over the keys k <= P, with, when window > 0, only the keys P - window < k <= P (a sliding
// window; Mistral's). With causal == false (a T5 encoder's bidirectional attention) the keys are
// all k < past_b + len_b, and window must be 0 (else cudaErrorInvalidValue). rel[h](d) is T5's
// relative position bias, position_bias[h * (2 M + 1) + clamp(d, -M, M) + M] with M =
// bias_max_distance (a bucket is constant past T5's max_distance, so one value per clamped
// distance is exact), or 0 without position_bias; M outside [0, 65535] returns
// cudaErrorInvalidValue.
// max_seqlen must be >= every new length len_b (it sizes the grid, which covers the rows only);
// lengths are clamped so that past_b + len_b <= max_seq (rows beyond are not written), and a
// seq_slot outside [0, num_slots) or a past_b outside [0, max_seq) leaves the sequence's rows
// unwritten. fp16/bf16 heads run on tensor cores (sm_80+, out 4-byte aligned), with the
// probabilities rounded to T before they weight V; everything else on CUDA cores in fp32.
template <typename T>
struct ContextAttentionParams {
  T* out;                     // [tokens, heads, head_dim]
  const T* q;                 // [tokens, heads, head_dim]
  const T* k_cache;           // [num_slots, kv_heads, max_seq, head_dim]
  const T* v_cache;           // [num_slots, kv_heads, max_seq, head_dim]
  const int32_t* cu_seqlens;  // [batch + 1], cu_seqlens[0] = 0, non-decreasing
  const int32_t* seq_slot;    // [batch]
  const float* alibi_slopes;  // [heads] or null
  int batch;
  int heads;
  int head_dim;
  int num_slots;
  int max_seq;       // cache capacity per slot
  int max_seqlen;    // host-known upper bound of the sequence lengths in this call
  float scale;       // normally 1/sqrt(head_dim)
  int kv_heads = 0;  // 0: heads; else a divisor of heads (the caches' head count)
  int window = 0;    // > 0: each query sees its last `window` positions (itself included)
  const int32_t* seq_past = nullptr;  // [batch] positions already cached before the packed rows
                                      // (null: 0)
  bool causal = true;  // false: each query sees every key of its sequence (window must be 0)
  const float* position_bias = nullptr;  // [heads, 2 bias_max_distance + 1] or null (see above)
  int bias_max_distance = 0;             // M of position_bias, 0 <= M <= 65535
};

template <typename T>
cudaError_t launch_context_attention(const ContextAttentionParams<T>& p, cudaStream_t stream);

// ---- 3. Decode attention ----------------------------------------------------------------------
// One query per row (the newest token, already rotated; its K/V already in the cache at position
// lengths[r] - 1 — or, in the fused form, prepared by the kernel, see below):
//   out[r, h] = softmax_p( scale * q[r, h] . K[src(r, p), h, p] + alibi[h] * (p - (len - 1))
//                          + rel[h](p - (len - 1)) ) . V
// over p < len = lengths[r] (and p >= len - window when window > 0), where src(r, p) =
// cache_indir[r, p] when given (beam search), else row_slot[r] (else r), and rel[h] is the
// relative position bias of context attention (position_bias, bias_max_distance; 0 without a
// table; with one, heads x (2 bias_max_distance + 1) must be below 2^31, else
// cudaErrorInvalidValue). Lengths are clamped to max_seq; a row whose length is < 1 or whose slot
// is invalid gets zeros; a key whose indirection slot is invalid is skipped.
//
// Long caches are split over several blocks per (row, head) (flash-decoding) and merged by a
// second kernel; the split depends only on (rows, heads, max_seq), so the launch needs no host
// synchronisation and can be captured in a CUDA graph. `workspace` must hold
// decode_attention_workspace_bytes(rows, heads, head_dim, max_seq) bytes (may be null when that
// is 0).
//
// Fused QKV preparation (DecodeAttentionFusedParams, launch_decode_attention_fused): each block
// forms its head's query from qkv (bias, rotary at position lengths[r] - 1, with the frequencies
// of rotary_inv_freq), and the block whose key chunk holds that position first writes the new
// token's key and value into slot row_slot[r] (else r) at that position (with grouped-query
// attention each block of the group writes the same bits and reads back its own), exactly as
// launch_qkv_prep with token_slot = row_slot and token_pos = lengths - 1 followed by the unfused
// kernel would (bit-identical results). No block waits for another's
// write, so no row may read a position that another row writes in the same call: reads of
// (slot, lengths[r] - 1) of a row's own slot must come from that row only. In particular the
// rows' slots must be distinct, and with cache_indir, cache_indir[r, lengths[r] - 1] must be
// row_slot[r] and no other row may point at it (beam search keeps both: the newest position of
// every beam is its own). The engine guarantees this; warpformer.decode_attention_fused checks
// all of it on the host before launching. At 1-2 rows the fused kernel reads lengths, row_slot,
// cache_indir and the first window's key and value rows (all but the new token's) before it
// waits for the kernel ahead (programmatic launch). So the kernel just ahead on the stream must
// not write them, and must start this one (griddepcontrol.launch_dependents) only after its own
// wait, so that every kernel before it has completed: in the engine that is the QKV product's
// GEMV; the op finishes its own copies of the index tensors before launching. (position_bias is
// read only after the wait.)
template <typename T>
struct DecodeAttentionParams {
  T* out;                      // [rows, heads, head_dim]
  const T* q;                  // [rows, heads, head_dim]
  const T* k_cache;            // [num_slots, kv_heads, max_seq, head_dim]
  const T* v_cache;            // [num_slots, kv_heads, max_seq, head_dim]
  const int32_t* row_slot;     // [rows] or null (row r uses slot r)
  const int32_t* lengths;      // [rows], valid cache positions per row (including the new token)
  const int32_t* cache_indir;  // [rows, max_seq] slot to read position p from, or null
  const float* alibi_slopes;   // [heads] or null
  float* workspace;            // fp32 scratch for the split-KV partial results, or null
  size_t workspace_bytes;
  int rows;
  int heads;
  int head_dim;
  int num_slots;
  int max_seq;
  float scale;
  int kv_heads = 0;  // 0: heads; else a divisor of heads (the caches' head count)
  int window = 0;    // > 0: the row sees its last `window` positions (itself included)
  const float* position_bias = nullptr;  // [heads, 2 bias_max_distance + 1] or null (see above)
  int bias_max_distance = 0;             // M of position_bias, 0 <= M <= 65535
};

// The fused decode attention's QKV inputs (the kernel takes them as their own argument).
template <typename T>
struct DecodeQkvInputs {
  const T* qkv;       // [rows, heads + 2 kv_heads, head_dim] ([rows, 3, heads, head_dim])
  const T* qkv_bias;  // [heads + 2 kv_heads, head_dim] or null
  int rotary_dim;     // as QkvPrepParams
  RotaryStyle rotary_style;
  const float* rotary_inv_freq;  // [rotary_dim / 2] from launch_rotary_inv_freq
  float rotary_mscale = 1.f;     // as QkvPrepParams
};

// Decode attention with the QKV preparation fused in (launch_decode_attention_fused; see above).
// `q` is not read; k_cache / v_cache receive the new token's row.
template <typename T>
struct DecodeAttentionFusedParams : DecodeAttentionParams<T>, DecodeQkvInputs<T> {};

// inv_freq_i of the rotary embedding (see RotaryStyle) for i < rotary_dim / 2, computed on the
// device exactly as launch_qkv_prep computes it, into out [rotary_dim / 2] (the fused decode
// attention's table, made once per model).
cudaError_t launch_rotary_inv_freq(float* out, int rotary_dim, float rotary_base,
                                   cudaStream_t stream);

// A rotary scaling of transformers' rope types (its fields per kind; the others are ignored).
struct RotaryScaling {
  enum Kind { kLinear = 1, kLlama3 = 2, kYarn = 3 };
  int kind = kLinear;
  float factor = 1.f;  // every kind
  // llama3: the frequency bands' factors and the pretraining context
  float low_freq_factor = 1.f, high_freq_factor = 4.f, original_max_position = 0.f;
  // yarn: the rotary base and the ramp over the pairs, (i - ramp_low) / ramp_span clamped to
  // [0, 1] (the correction range, computed on the host as transformers does in double)
  float base = 10000.f, ramp_low = 0.f, ramp_span = 1.f;
};

// Rescales a frequency table in place as transformers' rope types do (fp32, the same operations
// in the same order, no contraction); yarn recomputes each frequency from the base. Invalid
// fields return cudaErrorInvalidValue. (yarn's attention factor is rotary_mscale, not here.)
cudaError_t launch_rotary_scale(float* inv_freq, int rotary_dim, const RotaryScaling& r,
                                cudaStream_t stream);

// Number of key chunks each (row, head) is split into (1 = no split, no workspace).
int decode_attention_num_splits(int rows, int heads, int max_seq);
size_t decode_attention_workspace_bytes(int rows, int heads, int head_dim, int max_seq);

template <typename T>
cudaError_t launch_decode_attention(const DecodeAttentionParams<T>& p, cudaStream_t stream);
template <typename T>
cudaError_t launch_decode_attention_fused(const DecodeAttentionFusedParams<T>& p,
                                          cudaStream_t stream);

// ---- ALiBi ------------------------------------------------------------------------------------
// The per-head slopes of HF BLOOM's build_alibi_tensor for `total_heads` heads (all ranks):
// 2^(-8 k / n) for k = 1..n with n the largest power of two <= total_heads, followed, when
// total_heads is not a power of two, by the odd powers of 2^(-4 / n) for the remaining heads.
// Rank r of a tensor-parallel group takes heads [r * heads / tp, (r + 1) * heads / tp).
std::vector<float> alibi_slopes(int total_heads);

}  // namespace kernels
}  // namespace warpformer
