"""GPU tests of context_attention's seq_past (an interactive session's next turn: sequence b runs
only its new rows, at positions seq_past[b] .., over the keys its cache slot already holds):
against the float64 reference of tests/gpu/test_attention.py (windows, ALiBi and grouped caches
included), past = 0 bit for bit against the call without seq_past, the new rows against the last
rows of one context attention over the whole history, and the op's refusals."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from tests.gpu.test_attention import (
    DEV,
    attention_ref,
    cache_rows,
    check_attention,
    exactly_equal,
    fill_cache,
    nan_cache,
    ops,
    poison,
    rand,
    slopes_for,
)
from tests.gpu.test_attention_gqa_window import _expand_kv
from tests.tolerances import DTYPES, TOLERANCES

pytestmark = pytest.mark.gpu

IDX = dict(dtype=torch.int32, device=DEV)  # index tensors
# (past, new length) per sequence: no history, one position, histories that end inside, at and
# past a key tile (32 or 64 keys), new rows within one query tile and across two; one sequence
# without new rows.
SEQS = [(0, 33), (1, 5), (17, 70), (64, 1), (100, 33), (100, 70), (64, 5), (1, 70), (17, 1),
        (0, 1), (17, 0)]
MAX_SEQ = 192  # >= every past + length (170); the positions past them stay NaN


def _packed(seqs: list[tuple[int, int]]):
    """cu_seqlens, seq_past and the new lengths of the sequences, as device int32 tensors."""
    lens = [n for _, n in seqs]
    cu = [0, *itertools.accumulate(lens)]
    return (cu, torch.tensor(cu, **IDX), torch.tensor([p for p, _ in seqs], **IDX), lens)


@pytest.mark.parametrize("window", [0, 7, 45])
@pytest.mark.parametrize("kv_heads", [8, 2])
@pytest.mark.parametrize("hd", [64, 128, 256])
@pytest.mark.parametrize("dtype", DTYPES)
def test_context_attention_past(dtype, hd, kv_heads, window, seed) -> None:
    """Each new row at position past + i attends to keys 0 .. past + i of its slot (the window's
    last `window` of them), with and without ALiBi; multi-head and grouped caches. Positions past
    each sequence's history are NaN in the cache, so a read beyond it shows; so does a row left
    unwritten (poisoned output)."""
    heads = 8
    seq_slot = list(range(len(SEQS), 0, -1))  # distinct, not in order, slot 0 unused
    cu, cu_t, past_t, lens = _packed(SEQS)
    kc, vc = nan_cache(len(SEQS) + 1, kv_heads, MAX_SEQ, hd, dtype)
    fill_cache(kc, vc, seq_slot, [p + n for p, n in SEQS])
    q = rand(cu[-1], heads, hd, dtype=dtype, scale=2.0)
    slot_t = torch.tensor(seq_slot, **IDX)
    scale = 1.0 / math.sqrt(hd)
    group = heads // kv_heads
    kx, vx = _expand_kv(kc, group), _expand_kv(vc, group)
    for slopes in (None, slopes_for(heads)):
        poison((cu[-1], heads, hd), dtype)
        out = ops.context_attention(q, kc, vc, cu_t, slot_t, slopes, scale, max(lens), window,
                                    past_t)
        ref64, ref_lp = [], []
        for b, (p, n) in enumerate(SEQS):
            if n == 0:
                continue
            # attention_ref puts q's rows at the last positions of the keys: p .. p + n - 1.
            qb = q[cu[b]:cu[b + 1]]
            kb, vb = cache_rows(kx, seq_slot[b], p + n), cache_rows(vx, seq_slot[b], p + n)
            ref64.append(attention_ref(qb.double(), kb.double(), vb.double(), scale, slopes,
                                       window))
            ref_lp.append(attention_ref(qb, kb, vb, scale, slopes, window))
        check_attention(out, torch.cat(ref64), torch.cat(ref_lp), dtype,
                        f"context_attention past window={window} alibi={slopes is not None}")


@pytest.mark.parametrize("window", [0, 5, 100])
@pytest.mark.parametrize("hd", [64, 128, 256])
@pytest.mark.parametrize("dtype", DTYPES)
def test_context_attention_zero_past_is_no_past(dtype, hd, window, seed) -> None:
    """seq_past of zeros gives the call without seq_past bit for bit (same tiles, same
    arithmetic), ALiBi and grouped caches included."""
    heads, kv_heads = 8, 2
    lens, seq_slot = [1, 7, 97, 300], [3, 0, 4, 1]
    cu = [0, *itertools.accumulate(lens)]
    kc, vc = nan_cache(5, kv_heads, 320, hd, dtype)
    fill_cache(kc, vc, seq_slot, lens)
    q = rand(cu[-1], heads, hd, dtype=dtype, scale=2.0)
    cu_t, slot_t = torch.tensor(cu, **IDX), torch.tensor(seq_slot, **IDX)
    zeros = torch.zeros(len(lens), **IDX)
    scale = 1.0 / math.sqrt(hd)
    for slopes in (None, slopes_for(heads)):
        ref = ops.context_attention(q, kc, vc, cu_t, slot_t, slopes, scale, max(lens), window)
        poison((cu[-1], heads, hd), dtype)
        out = ops.context_attention(q, kc, vc, cu_t, slot_t, slopes, scale, max(lens), window,
                                    zeros)
        exactly_equal(out, ref, f"zero seq_past window={window} alibi={slopes is not None}")


@pytest.mark.parametrize("window", [0, 45])
@pytest.mark.parametrize("alibi", [False, True])
@pytest.mark.parametrize("kv_heads", [8, 2])
@pytest.mark.parametrize("hd", [64, 128])
def test_context_attention_past_matches_full_prefill(hd, kv_heads, alibi, window, seed) -> None:
    """What a session relies on: sequence b's new rows with past p equal the last rows of one
    context attention over all p + len positions of the same cache (fp16; the query tiles differ,
    so within the fp16 tolerance rather than bit for bit)."""
    dtype, heads = torch.float16, 8
    seqs = [(p, n) for p, n in SEQS if n > 0]
    seq_slot = list(range(1, len(seqs) + 1))
    cu, cu_t, past_t, lens = _packed(seqs)
    kc, vc = nan_cache(len(seqs) + 1, kv_heads, MAX_SEQ, hd, dtype)
    fill_cache(kc, vc, seq_slot, [p + n for p, n in seqs])
    slot_t = torch.tensor(seq_slot, **IDX)
    # The whole histories' queries; the new rows are the last n of each.
    full_lens = [p + n for p, n in seqs]
    full_cu = [0, *itertools.accumulate(full_lens)]
    q_full = rand(full_cu[-1], heads, hd, dtype=dtype, scale=2.0)
    ends = full_cu[1:]
    q_new = torch.cat([q_full[e - n:e] for e, (_, n) in zip(ends, seqs, strict=True)])
    slopes = slopes_for(heads) if alibi else None
    scale = 1.0 / math.sqrt(hd)
    full = ops.context_attention(q_full, kc, vc, torch.tensor(full_cu, **IDX), slot_t, slopes,
                                 scale, max(full_lens), window)
    poison(tuple(q_new.shape), dtype)
    out = ops.context_attention(q_new, kc, vc, cu_t, slot_t, slopes, scale, max(lens), window,
                                past_t)
    want = torch.cat([full[e - n:e] for e, (_, n) in zip(ends, seqs, strict=True)])
    torch.testing.assert_close(out, want, **TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_two_turns_match_one_prefill(dtype, seed) -> None:
    """A session's second turn end to end: turn 1 writes its prompt (positions 0 ..) and attends;
    turn 2 writes only its new tokens (rotary at positions past ..) and attends with seq_past.
    Its rows match one prefill over both turns' tokens; the caches are bit-identical."""
    heads, hd, slots, max_seq = 8, 128, 4, 256
    turn1, turn2, seq_slot = [17, 64, 100], [33, 1, 70], [2, 0, 3]
    full = [a + b for a, b in zip(turn1, turn2, strict=True)]
    qkv = [rand(n, 3, heads, hd, dtype=dtype) for n in full]  # each sequence's tokens
    slopes = slopes_for(heads)
    scale = 1.0 / math.sqrt(hd)
    slot_t = torch.tensor(seq_slot, **IDX)

    def prep(kc, vc, parts: list[tuple[int, int]]):  # (first, count) tokens of each sequence
        x = torch.cat([qkv[b][f:f + n] for b, (f, n) in enumerate(parts)])
        tok_slot = slot_t.repeat_interleave(torch.tensor([n for _, n in parts], device=DEV))
        tok_pos = torch.cat([torch.arange(f, f + n, **IDX) for f, n in parts])
        q = ops.qkv_rotary_cache(x, None, kc, vc, tok_slot, tok_pos, hd, "half", 10000.0)
        return q, torch.tensor([0, *itertools.accumulate(n for _, n in parts)], **IDX)

    # One prefill over both turns.
    kc1, vc1 = nan_cache(slots, heads, max_seq, hd, dtype)
    q1, cu1 = prep(kc1, vc1, [(0, n) for n in full])
    one = ops.context_attention(q1, kc1, vc1, cu1, slot_t, slopes, scale, max(full))
    # Two turns.
    kc2, vc2 = nan_cache(slots, heads, max_seq, hd, dtype)
    qa, cua = prep(kc2, vc2, [(0, n) for n in turn1])
    ops.context_attention(qa, kc2, vc2, cua, slot_t, slopes, scale, max(turn1))
    qb, cub = prep(kc2, vc2, list(zip(turn1, turn2, strict=True)))
    poison(tuple(qb.shape), dtype)
    out = ops.context_attention(qb, kc2, vc2, cub, slot_t, slopes, scale, max(turn2), 0,
                                torch.tensor(turn1, **IDX))
    exactly_equal(kc2, kc1, "k_cache after two turns")
    exactly_equal(vc2, vc1, "v_cache after two turns")
    cu_full = [0, *itertools.accumulate(full)]
    want = torch.cat([one[cu_full[b] + p:cu_full[b + 1]] for b, p in enumerate(turn1)])
    torch.testing.assert_close(out.double(), want.double(), **TOLERANCES[dtype])


def test_context_attention_past_refusals(seed) -> None:
    """seq_past's device and values are checked on the host, naming the argument."""
    kc, vc = nan_cache(3, 4, 16, 64, torch.float16)
    q = rand(5, 4, 64, dtype=torch.float16)
    cu, slot = torch.tensor([0, 2, 5], **IDX), torch.tensor([1, 0], **IDX)

    def call(past):
        return ops.context_attention(q, kc, vc, cu, slot, None, 0.125, 3, 0, past)

    with pytest.raises(RuntimeError, match=r"context_attention: seq_past must be a CUDA tensor"):
        call(torch.tensor([0, 1], dtype=torch.int32))
    with pytest.raises(RuntimeError, match=r"context_attention: seq_past\[1\] = -1 is negative"):
        call(torch.tensor([0, -1], **IDX))
    with pytest.raises(RuntimeError, match=r"context_attention: sequence 1 has seq_past\[1\] = 14 "
                                           r"cached \+ 3 new positions, more than the cache's "
                                           r"max_seq = 16"):
        call(torch.tensor([0, 14], **IDX))
    with pytest.raises(RuntimeError, match=r"context_attention: seq_past.shape\[0\] must be 2"):
        call(torch.tensor([0, 1, 2], **IDX))
    # A history that fills the cache is fine (past + len == max_seq).
    kc.zero_()
    vc.zero_()
    assert not call(torch.tensor([14, 13], **IDX)).isnan().any()


def test_opcheck_past(seed) -> None:
    import warpformer._ops_attention  # noqa: F401  (fake implementations)

    dtype, heads, hd, slots, max_seq = torch.float16, 4, 64, 3, 32
    kc = torch.zeros(slots, heads, max_seq, hd, device=DEV, dtype=dtype)
    vc = torch.zeros_like(kc)
    q = rand(5, heads, hd, dtype=dtype)
    torch.library.opcheck(ops.context_attention.default,
                          (q, kc, vc, torch.tensor([0, 3, 5], **IDX), torch.tensor([0, 2], **IDX),
                           None, 0.125, 3, 0, torch.tensor([4, 29], **IDX)),
                          test_utils=("test_schema", "test_faketensor"))
