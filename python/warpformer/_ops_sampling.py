"""Fake (meta) implementations of the sampling ops (``csrc/torch/ops_sampling.cpp``).

They give output shapes and dtypes without touching data so that ``torch.compile`` and
``torch.library.opcheck`` can trace graphs that call the CUDA ops. The real argument checks live
in C++; these repeat only what decides the output shape. An op missing from the loaded
extension (an older build) is skipped rather than failing the import.
"""

from __future__ import annotations

import torch
from torch.library import register_fake


def _has(name: str) -> bool:
    return hasattr(torch.ops.warpformer, name)


if _has("count_tokens"):

    @register_fake("warpformer::count_tokens")
    def _count_tokens_fake(ids, lengths, vocab):
        torch._check(ids.dim() == 2, lambda: "warpformer.count_tokens: ids must be 2-dimensional")
        return ids.new_empty((ids.shape[0], vocab), dtype=torch.int32)


if _has("add_token_counts"):

    @register_fake("warpformer::add_token_counts")
    def _add_token_counts_fake(counts, tokens, finished=None):
        return None


if _has("process_logits"):

    @register_fake("warpformer::process_logits")
    def _process_logits_fake(logits, token_counts=None, repetition_penalty=None,
                             presence_penalty=None, frequency_penalty=None, temperature=None,
                             min_length=None, end_ids=None, input_lengths=None, cur_pos=None,
                             output_ids=None, bad_words=None, vocab=-1, step=0):
        torch._check(logits.dim() == 2,
                     lambda: "warpformer.process_logits: logits must be 2-dimensional")
        cols = logits.shape[1] if vocab < 0 else vocab
        return logits.new_empty((logits.shape[0], cols), dtype=torch.float32)


if _has("sample_tokens"):

    @register_fake("warpformer::sample_tokens")
    def _sample_tokens_fake(logits, top_k, top_p, seeds, positions, vocab=-1):
        torch._check(logits.dim() == 2,
                     lambda: "warpformer.sample_tokens: logits must be 2-dimensional")
        rows = logits.shape[0]
        return (logits.new_empty((rows,), dtype=torch.int32),
                logits.new_empty((rows,), dtype=torch.float32))


if _has("greedy_tokens"):

    @register_fake("warpformer::greedy_tokens")
    def _greedy_tokens_fake(logits, vocab=-1, split=True):
        torch._check(logits.dim() == 2,
                     lambda: "warpformer.greedy_tokens: logits must be 2-dimensional")
        return logits.new_empty((logits.shape[0],), dtype=torch.int32)


if _has("update_tokens"):

    @register_fake("warpformer::update_tokens")
    def _update_tokens_fake(tokens, log_probs, cur_pos, attn_len, finished, output_ids,
                            seq_lengths, end_ids, stop_words=None, cum_log_probs=None,
                            output_log_probs=None, step=0, token_counts=None,
                            input_lengths=None):
        torch._check(tokens.dim() == 1,
                     lambda: "warpformer.update_tokens: tokens must be 1-dimensional")
        return tokens.new_empty(tokens.shape)
