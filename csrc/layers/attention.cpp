#include "csrc/layers/attention.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "csrc/core/check.h"
#include "kernels/attention/attention.h"

namespace warpformer {
namespace layers {
namespace {

template <typename T>
kernels::DecodeAttentionParams<T> decode_params(const AttentionIO& b, int64_t tokens, int heads,
                                                int hd, const AttentionInputs& ai, float scale) {
  kernels::DecodeAttentionParams<T> p{};
  p.out = static_cast<T*>(b.out);
  p.k_cache = static_cast<const T*>(ai.k_cache);
  p.v_cache = static_cast<const T*>(ai.v_cache);
  p.row_slot = ai.row_slot;
  p.lengths = ai.lengths;
  p.cache_indir = ai.cache_indir;
  p.alibi_slopes = ai.alibi_slopes;
  p.workspace = ai.workspace;
  p.workspace_bytes = ai.workspace_bytes;
  p.rows = static_cast<int>(tokens);
  p.heads = heads;
  p.head_dim = hd;
  p.num_slots = ai.num_slots;
  p.max_seq = ai.max_seq;
  p.scale = scale;
  p.window = ai.window;
  p.position_bias = ai.position_bias;
  p.bias_max_distance = ai.bias_max_distance;
  return p;
}

template <typename T>
void attention(const LayerContext& lc, const AttentionIO& b, int64_t tokens,
               const AttentionInputs& ai) {
  const LayerSpec& c = *lc.spec;
  const int heads = static_cast<int>(c.heads);
  const int kv_heads = static_cast<int>(c.kv_heads);  // the caches' heads (grouped-query: fewer)
  const int hd = static_cast<int>(c.head_dim);
  cudaStream_t stream = lc.ctx->stream();

  const float scale = c.score_scale();
  if (ai.decode && ai.fused_prep) {  // one kernel: QKV prep + attention
    kernels::DecodeAttentionFusedParams<T> p{};
    static_cast<kernels::DecodeAttentionParams<T>&>(p) =
        decode_params<T>(b, tokens, heads, hd, ai, scale);
    p.kv_heads = kv_heads;
    p.qkv = static_cast<const T*>(b.qkv);
    p.qkv_bias = static_cast<const T*>(b.qkv_bias);
    p.rotary_dim = static_cast<int>(c.rotary_dim);
    p.rotary_style = c.rotary_style;
    p.rotary_inv_freq = ai.rotary_inv_freq;
    p.rotary_mscale = c.rotary_mscale;
    WF_CUDA_CHECK(kernels::launch_decode_attention_fused(p, stream));
    return;
  }

  kernels::QkvPrepParams<T> qp{};
  qp.q_out = static_cast<T*>(b.q);
  qp.k_cache = static_cast<T*>(ai.k_cache);
  qp.v_cache = static_cast<T*>(ai.v_cache);
  qp.qkv = static_cast<const T*>(b.qkv);
  qp.bias = static_cast<const T*>(b.qkv_bias);
  qp.token_slot = ai.token_slot;
  qp.token_pos = ai.token_pos;
  qp.tokens = static_cast<int>(tokens);
  qp.heads = heads;
  qp.head_dim = hd;
  qp.num_slots = ai.num_slots;
  qp.max_seq = ai.max_seq;
  qp.rotary_dim = static_cast<int>(c.rotary_dim);
  qp.rotary_style = c.rotary_style;
  qp.rotary_base = c.rotary_base;
  qp.kv_heads = kv_heads;
  qp.rotary_inv_freq = ai.rotary_inv_freq;  // the model's table (scaled rotary included)
  qp.rotary_mscale = c.rotary_mscale;
  WF_CUDA_CHECK(kernels::launch_qkv_prep(qp, stream));

  if (!ai.decode) {
    kernels::ContextAttentionParams<T> p{};
    p.out = static_cast<T*>(b.out);
    p.q = static_cast<const T*>(b.q);
    p.k_cache = static_cast<const T*>(ai.k_cache);
    p.v_cache = static_cast<const T*>(ai.v_cache);
    p.cu_seqlens = ai.cu_seqlens;
    p.seq_slot = ai.seq_slot;
    p.seq_past = ai.seq_past;
    p.alibi_slopes = ai.alibi_slopes;
    p.batch = ai.batch;
    p.heads = heads;
    p.head_dim = hd;
    p.num_slots = ai.num_slots;
    p.max_seq = ai.max_seq;
    p.max_seqlen = ai.max_seqlen;
    p.scale = scale;
    p.kv_heads = kv_heads;
    p.window = ai.window;
    p.causal = !ai.bidirectional;
    p.position_bias = ai.position_bias;
    p.bias_max_distance = ai.bias_max_distance;
    WF_CUDA_CHECK(kernels::launch_context_attention(p, stream));
  } else {
    kernels::DecodeAttentionParams<T> p = decode_params<T>(b, tokens, heads, hd, ai, scale);
    p.q = static_cast<const T*>(b.q);
    p.kv_heads = kv_heads;
    WF_CUDA_CHECK(kernels::launch_decode_attention(p, stream));
  }
}

template <typename T>
void cross(const LayerContext& lc, const void* q, void* out, int64_t tokens,
           const AttentionInputs& ai) {
  const LayerSpec& c = *lc.spec;
  kernels::DecodeAttentionParams<T> p{};
  p.out = static_cast<T*>(out);
  p.q = static_cast<const T*>(q);
  p.k_cache = static_cast<const T*>(ai.cross.k);
  p.v_cache = static_cast<const T*>(ai.cross.v);
  p.row_slot = ai.cross.row_slot;
  p.lengths = ai.cross.lengths;
  p.workspace = ai.workspace;
  p.workspace_bytes = ai.workspace_bytes;
  p.rows = static_cast<int>(tokens);
  p.heads = static_cast<int>(c.heads);
  p.head_dim = static_cast<int>(c.head_dim);
  p.num_slots = ai.cross.num_slots;
  p.max_seq = ai.cross.max_seq;
  p.scale = c.score_scale();
  WF_CUDA_CHECK(kernels::launch_decode_attention(p, lc.ctx->stream()));
}

template <typename T>
void memory(const LayerContext& lc, const void* kv, const void* kv_bias, void* k, void* v,
            int num_slots, int max_seq, const int32_t* token_slot, const int32_t* token_pos,
            int64_t tokens) {
  const LayerSpec& c = *lc.spec;
  kernels::QkvPrepParams<T> qp{};
  qp.kv_only = true;
  qp.k_cache = static_cast<T*>(k);
  qp.v_cache = static_cast<T*>(v);
  qp.qkv = static_cast<const T*>(kv);
  qp.bias = static_cast<const T*>(kv_bias);
  qp.token_slot = token_slot;
  qp.token_pos = token_pos;
  qp.tokens = static_cast<int>(tokens);
  qp.heads = static_cast<int>(c.heads);
  qp.kv_heads = static_cast<int>(c.heads);
  qp.head_dim = static_cast<int>(c.head_dim);
  qp.num_slots = num_slots;
  qp.max_seq = max_seq;
  WF_CUDA_CHECK(kernels::launch_qkv_prep(qp, lc.ctx->stream()));
}

}  // namespace

void cross_attention(const LayerContext& lc, const void* q, void* out, int64_t tokens,
                     const AttentionInputs& ai) {
  if (tokens == 0) return;
  WF_DISPATCH_FLOATING(lc.dtype, "cross_attention",
                       [&] { cross<scalar_t>(lc, q, out, tokens, ai); });
}

void write_cross_memory(const LayerContext& lc, const void* kv, const void* kv_bias, void* k,
                        void* v, int num_slots, int max_seq, const int32_t* token_slot,
                        const int32_t* token_pos, int64_t tokens) {
  if (tokens == 0) return;
  WF_DISPATCH_FLOATING(lc.dtype, "write_cross_memory", [&] {
    memory<scalar_t>(lc, kv, kv_bias, k, v, num_slots, max_seq, token_slot, token_pos, tokens);
  });
}

void self_attention(const LayerContext& lc, const AttentionIO& io, int64_t tokens,
                    const AttentionInputs& ai) {
  if (tokens == 0) return;
  WF_DISPATCH_FLOATING(lc.dtype, "self_attention",
                       [&] { attention<scalar_t>(lc, io, tokens, ai); });
}

size_t self_attention_workspace_bytes(const LayerSpec& spec, int64_t rows, int64_t max_seq) {
  return kernels::decode_attention_workspace_bytes(
      static_cast<int>(rows), static_cast<int>(spec.heads), static_cast<int>(spec.head_dim),
      static_cast<int>(max_seq));
}

}  // namespace layers
}  // namespace warpformer
