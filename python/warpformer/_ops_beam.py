"""Fake (meta) implementations of the beam-search ops (``csrc/torch/ops_beam.cpp``).

They give output shapes and dtypes without touching data so that ``torch.compile`` can trace
graphs that call the CUDA ops. The real argument checks live in C++; these repeat only what
decides the output shapes. Rows are ``B * W`` (row ``b * W + k`` is beam ``k`` of entry ``b``).
"""

from __future__ import annotations

import torch
from torch.library import register_fake

_OP = "warpformer.beam_search"


@register_fake("warpformer::beam_log_softmax")
def _beam_log_softmax_fake(logits):
    torch._check(logits.dim() == 2, lambda: "warpformer.beam_log_softmax: logits must be 2-D")
    return logits.new_empty(logits.shape, dtype=torch.float32)


@register_fake("warpformer::beam_search_init")
def _beam_search_init_fake(input_ids, input_lengths, end_ids, beam_width, output_len, max_seq,
                           shared_prompt_slot=False):
    torch._check(input_ids.dim() == 2, lambda: f"{_OP}_init: input_ids must be 2-D")
    torch._check(1 <= beam_width <= 16, lambda: f"{_OP}_init: beam_width must be in [1, 16]")
    b, s = input_ids.shape
    w, rows, stride = beam_width, input_ids.shape[0] * beam_width, s + output_len
    i32 = dict(dtype=torch.int32)
    f32 = dict(dtype=torch.float32)
    return (
        input_ids.new_empty((rows, stride), **i32),        # output_ids
        input_ids.new_empty((rows, max_seq), **i32),       # cache_indir
        input_ids.new_empty((b, w), **f32),                # cum_log_probs
        input_ids.new_empty((rows,), **i32),               # cur_pos
        input_ids.new_empty((rows,), **i32),               # attn_len
        input_ids.new_empty((b,), **i32),                  # gen_len
        input_ids.new_empty((b,), **i32),                  # done
        input_ids.new_empty((b,), **i32),                  # hyp_count
        input_ids.new_empty((b, w), **f32),                # hyp_score
        input_ids.new_empty((b, w), **f32),                # hyp_cum
        input_ids.new_empty((b, w), **i32),                # hyp_len
        input_ids.new_empty((b, w, stride), **i32),        # hyp_ids
        input_ids.new_empty((rows, output_len), **f32),    # run_log_probs
        input_ids.new_empty((b, w, output_len), **f32),    # hyp_log_probs
    )


@register_fake("warpformer::beam_search_step")
def _beam_search_step_fake(log_probs, input_lengths, end_ids, output_ids, run_log_probs, gen_len,
                           cum_log_probs, done, hyp_count, hyp_score, hyp_cum, hyp_len, hyp_ids,
                           hyp_log_probs, length_penalty=1.0, diversity_rate=0.0):
    torch._check(cum_log_probs.dim() == 2, lambda: f"{_OP}_step: cum_log_probs must be [B, W]")
    shape = cum_log_probs.shape
    return (cum_log_probs.new_empty(shape, dtype=torch.int32),
            cum_log_probs.new_empty(shape, dtype=torch.int32),
            cum_log_probs.new_empty(shape, dtype=torch.float32))


@register_fake("warpformer::beam_search_update")
def _beam_search_update_fake(parents, tokens, token_log_probs, input_lengths, gen_len,
                             output_ids, cache_indir, run_log_probs, cur_pos, attn_len):
    return None


@register_fake("warpformer::beam_search_finalize")
def _beam_search_finalize_fake(input_lengths, end_ids, output_ids, run_log_probs, cum_log_probs,
                               gen_len, done, hyp_count, hyp_score, hyp_cum, hyp_len, hyp_ids,
                               hyp_log_probs, length_penalty=1.0, out_stride=-1):
    torch._check(cum_log_probs.dim() == 2,
                 lambda: f"{_OP}_finalize: cum_log_probs must be [B, W]")
    b, w = cum_log_probs.shape
    cols = output_ids.shape[1] if out_stride < 0 else out_stride
    return (output_ids.new_empty((b, w, cols)),
            output_ids.new_empty((b, w)),
            cum_log_probs.new_empty((b, w)),
            cum_log_probs.new_empty((b, w)),
            cum_log_probs.new_empty((b, w, run_log_probs.shape[1])))
