"""Fake (meta) implementations of the attention ops (``csrc/torch/ops_attention.cpp``).

They give output shapes and dtypes without touching data so that ``torch.compile`` can trace
graphs that call the CUDA ops. The real argument checks live in C++; these repeat only what
decides the output shape.
"""

from __future__ import annotations

import torch
from torch.library import register_fake


@register_fake("warpformer::qkv_rotary_cache")
def _qkv_rotary_cache_fake(qkv, bias, k_cache, v_cache, token_slot, token_pos, rotary_dim,
                           rotary_style, rotary_base):
    if qkv.dim() == 3:  # grouped-query: [tokens, heads + 2 kv_heads, head_dim], kv from the cache
        heads = qkv.shape[1] - 2 * k_cache.shape[1]
        torch._check(heads > 0, lambda: "warpformer.qkv_rotary_cache: qkv leaves no query heads")
        return qkv.new_empty((qkv.shape[0], heads, qkv.shape[2]))
    torch._check(qkv.dim() == 4,
                 lambda: "warpformer.qkv_rotary_cache: qkv must be 3- or 4-dimensional")
    torch._check(qkv.shape[1] == 3, lambda: "warpformer.qkv_rotary_cache: qkv.shape[1] must be 3")
    return qkv.new_empty((qkv.shape[0], qkv.shape[2], qkv.shape[3]))


@register_fake("warpformer::kv_cache_write")
def _kv_cache_write_fake(kv, k_cache, v_cache, token_slot, token_pos, bias=None):
    # Writes the caches in place and returns nothing.
    torch._check(kv.dim() in (3, 4), lambda: "warpformer.kv_cache_write: kv must be 3- or "
                 "4-dimensional")


@register_fake("warpformer::context_attention")
def _context_attention_fake(q, k_cache, v_cache, cu_seqlens, seq_slot, alibi_slopes, scale,
                            max_seqlen, window=0, seq_past=None, position_bias=None,
                            bias_max_distance=0, causal=True):
    # seq_past (positions already cached), the relative bias and causal change the values only.
    torch._check(q.dim() == 3, lambda: "warpformer.context_attention: q must be 3-dimensional")
    return q.new_empty(q.shape)


@register_fake("warpformer::decode_attention")
def _decode_attention_fake(q, k_cache, v_cache, row_slot, lengths, cache_indir, alibi_slopes,
                           scale, window=0, position_bias=None, bias_max_distance=0):
    torch._check(q.dim() == 3, lambda: "warpformer.decode_attention: q must be 3-dimensional")
    return q.new_empty(q.shape)


@register_fake("warpformer::decode_attention_fused")
def _decode_attention_fused_fake(qkv, bias, k_cache, v_cache, row_slot, lengths, cache_indir,
                                 alibi_slopes, scale, rotary_dim, rotary_style, rotary_base,
                                 window=0, position_bias=None, bias_max_distance=0):
    if qkv.dim() == 3:  # grouped-query: [rows, heads + 2 kv_heads, head_dim], kv from the cache
        heads = qkv.shape[1] - 2 * k_cache.shape[1]
        torch._check(heads > 0,
                     lambda: "warpformer.decode_attention_fused: qkv leaves no query heads")
        return qkv.new_empty((qkv.shape[0], heads, qkv.shape[2]))
    torch._check(qkv.dim() == 4,
                 lambda: "warpformer.decode_attention_fused: qkv must be 3- or 4-dimensional")
    return qkv.new_empty((qkv.shape[0], qkv.shape[2], qkv.shape[3]))


@register_fake("warpformer::alibi_slopes")
def _alibi_slopes_fake(num_heads):
    return torch.empty(num_heads, dtype=torch.float32)
