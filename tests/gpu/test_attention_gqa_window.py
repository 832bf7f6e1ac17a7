"""GPU tests of the attention ops' grouped-query attention (kv_heads < heads: query head h reads
key/value head h / group) and sliding window (a query sees its last `window` positions): the
grouped ops bit for bit against the multi-head ops over repeated K/V heads, the windowed ones
against tests/gpu/test_attention.py's references with the window, the fused decode against the
unfused ops bit for bit."""

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
from tests.tolerances import DTYPES

pytestmark = pytest.mark.gpu


# ---- grouped-query attention (kv_heads < heads: query head h reads key/value head h / group) ----
def _expand_kv(c: torch.Tensor, group: int) -> torch.Tensor:
    """A [slots, kv_heads, max_seq, D] cache as the [slots, heads, ...] one multi-head attention
    would hold (each K/V head repeated for its group of query heads)."""
    return c.repeat_interleave(group, dim=1)


@pytest.mark.parametrize("style,rd", [("half", None), ("interleaved", None), ("half", 20)])
@pytest.mark.parametrize("kv_heads", [1, 2, 4])
@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("dtype", DTYPES)
def test_grouped_query_prep_and_attention(dtype, hd, kv_heads, style, rd, seed) -> None:
    """qkv [tokens, heads + 2 kv_heads, hd] writes the kv_heads caches and rotates q and k as
    the multi-head op does head for head (rotary on the whole head, vector path; or a half split
    of 20 dims, which takes the element-by-element path); context and decode attention over the
    grouped caches equal the multi-head ops over the caches with each K/V head repeated, ALiBi
    slopes per query head."""
    rd = hd if rd is None else rd
    heads, slots, max_seq = 8, 4, 96
    group = heads // kv_heads
    tokens_per_seq = [17, 5, 33]
    seq_slot = [2, 0, 3]
    T = sum(tokens_per_seq)
    qkv = rand(T, heads + 2 * kv_heads, hd, dtype=dtype)
    bias = rand(heads + 2 * kv_heads, hd, dtype=dtype, scale=0.1)
    tok_slot = torch.tensor([s for s, n in zip(seq_slot, tokens_per_seq, strict=True)
                             for _ in range(n)], dtype=torch.int32, device=DEV)
    tok_pos = torch.cat([torch.arange(n, dtype=torch.int32, device=DEV) for n in tokens_per_seq])
    kc, vc = nan_cache(slots, kv_heads, max_seq, hd, dtype)
    q = ops.qkv_rotary_cache(qkv, bias, kc, vc, tok_slot, tok_pos, rd, style, 500000.0)
    assert q.shape == (T, heads, hd)
    # The same tokens as multi-head qkv (K/V heads repeated) through the multi-head op.
    def as_mha(t: torch.Tensor) -> torch.Tensor:  # [..., heads + 2 kv, hd] -> [..., 3, heads, hd]
        tq, tk = t[..., :heads, :], t[..., heads:heads + kv_heads, :]
        tv = t[..., heads + kv_heads:, :]
        return torch.stack((tq, tk.repeat_interleave(group, -2), tv.repeat_interleave(group, -2)),
                           -3).contiguous()

    kc_m, vc_m = nan_cache(slots, heads, max_seq, hd, dtype)
    q_m = ops.qkv_rotary_cache(as_mha(qkv), as_mha(bias), kc_m, vc_m, tok_slot, tok_pos, rd,
                               style, 500000.0)
    torch.testing.assert_close(q, q_m, rtol=0, atol=0)
    for s, n in zip(seq_slot, tokens_per_seq, strict=True):
        torch.testing.assert_close(_expand_kv(kc, group)[s, :, :n], kc_m[s, :, :n], rtol=0,
                                   atol=0)
        torch.testing.assert_close(_expand_kv(vc, group)[s, :, :n], vc_m[s, :, :n], rtol=0,
                                   atol=0)
    scale = 1.0 / math.sqrt(hd)
    cu = torch.tensor([0] + list(itertools.accumulate(tokens_per_seq)), dtype=torch.int32,
                      device=DEV)
    slot_t = torch.tensor(seq_slot, dtype=torch.int32, device=DEV)
    slopes = slopes_for(heads)
    for sl in (None, slopes):
        out = ops.context_attention(q, kc, vc, cu, slot_t, sl, scale, max(tokens_per_seq))
        out_m = ops.context_attention(q_m, kc_m, vc_m, cu, slot_t, sl, scale,
                                      max(tokens_per_seq))
        torch.testing.assert_close(out, out_m, rtol=0, atol=0)
    # Decode: each sequence's newest token (long caches: the next test).
    last = torch.tensor([c - 1 for c in cu.tolist()[1:]], device=DEV)
    lens = torch.tensor(tokens_per_seq, dtype=torch.int32, device=DEV)
    for sl in (None, slopes):
        dec = ops.decode_attention(q[last], kc, vc, slot_t, lens, None, sl, scale)
        dec_m = ops.decode_attention(q_m[last], kc_m, vc_m, slot_t, lens, None, sl, scale)
        torch.testing.assert_close(dec, dec_m, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_grouped_query_decode_split_kv_and_beams(dtype, seed) -> None:
    """Long caches (split over blocks) and a beam indirection over grouped caches equal the
    multi-head op over the repeated caches."""
    heads, kv_heads, hd, slots, max_seq = 8, 2, 128, 6, 2048
    lengths, row_slot = [2000, 1500, 7, 900], [1, 4, 0, 5]
    kc, vc = nan_cache(slots, kv_heads, max_seq, hd, dtype)
    fill_cache(kc, vc, list(range(slots)), [max_seq] * slots)
    q = rand(len(lengths), heads, hd, dtype=dtype, scale=2.0)
    slot_t = torch.tensor(row_slot, dtype=torch.int32, device=DEV)
    len_t = torch.tensor(lengths, dtype=torch.int32, device=DEV)
    indir = torch.randint(0, slots, (len(lengths), max_seq), dtype=torch.int32, device=DEV)
    scale = 1.0 / math.sqrt(hd)
    kc_m, vc_m = _expand_kv(kc, heads // kv_heads), _expand_kv(vc, heads // kv_heads)
    for ind in (None, indir):
        out = ops.decode_attention(q, kc, vc, slot_t, len_t, ind, None, scale)
        ref = ops.decode_attention(q, kc_m.contiguous(), vc_m.contiguous(), slot_t, len_t, ind,
                                   None, scale)
        torch.testing.assert_close(out, ref, rtol=0, atol=0)


@pytest.mark.parametrize("lens", [[5], [3, 9], [1, 7, 97, 300], [4100, 1, 2049, 513]])
@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize("dtype", DTYPES)
def test_grouped_query_decode_fused(dtype, kv_heads, lens, seed) -> None:
    """The fused decode attention over grouped caches (qkv [rows, heads + 2 kv_heads, hd]: every
    block of a group writes the same new key and value and reads back its own write) equals
    qkv_rotary_cache + decode_attention bit for bit: outputs and both caches; 1-2 rows take the
    early-start kernel, long rows the split-KV one."""
    heads, hd = 8, 128
    rows = len(lens)
    max_seq = 4200 if max(lens) > 512 else 512
    row_slot = list(range(1, rows + 1))
    kc, vc = nan_cache(rows + 1, kv_heads, max_seq, hd, dtype)
    fill_cache(kc, vc, row_slot, [n - 1 for n in lens])  # the new token's position stays NaN
    kc2, vc2 = kc.clone(), vc.clone()
    qkv = rand(rows, heads + 2 * kv_heads, hd, dtype=dtype, scale=2.0)
    bias = rand(heads + 2 * kv_heads, hd, dtype=dtype, scale=0.5)
    slot_t = torch.tensor(row_slot, dtype=torch.int32, device=DEV)
    len_t = torch.tensor(lens, dtype=torch.int32, device=DEV)
    scale = 1.0 / math.sqrt(hd)
    q = ops.qkv_rotary_cache(qkv, bias, kc, vc, slot_t, len_t - 1, hd, "half", 10000.0)
    ref = ops.decode_attention(q, kc, vc, slot_t, len_t, None, None, scale)
    poison((rows, heads, hd), dtype)
    out = ops.decode_attention_fused(qkv, bias, kc2, vc2, slot_t, len_t, None, None, scale, hd,
                                     "half", 10000.0)
    assert not out.isnan().any(), "fused grouped output has unwritten elements"
    exactly_equal(out, ref, "fused grouped output")
    exactly_equal(kc2, kc, "fused grouped k_cache")
    exactly_equal(vc2, vc, "fused grouped v_cache")


def test_grouped_query_refusals(seed) -> None:
    heads, kv_heads, hd = 8, 3, 64
    kc, vc = nan_cache(2, kv_heads, 16, hd, torch.float16)
    q = rand(2, heads, hd, dtype=torch.float16)
    lens = torch.tensor([3, 4], dtype=torch.int32, device=DEV)
    with pytest.raises(RuntimeError, match=r"must divide the query heads \(8\)"):
        ops.decode_attention(q, kc, vc, None, lens, None, None, 0.125)
    kc2, vc2 = nan_cache(2, 2, 16, hd, torch.float16)
    qkv = rand(2, 3, heads, hd, dtype=torch.float16)
    with pytest.raises(RuntimeError, match=r"a \[rows, 3, heads, head_dim\] qkv writes caches of "
                                           r"its heads \(8\)"):
        ops.decode_attention_fused(qkv, None, kc2, vc2, None, lens, None, None, 0.125, 0, "none",
                                   10000.0)
    with pytest.raises(RuntimeError, match="writes caches of its heads"):
        ops.qkv_rotary_cache(qkv, None, kc2, vc2, torch.zeros(2, dtype=torch.int32, device=DEV),
                             torch.zeros(2, dtype=torch.int32, device=DEV), 0, "none", 10000.0)


# ---- sliding window (window > 0: a query sees its last `window` positions) ----------------------
@pytest.mark.parametrize("window", [1, 5, 64, 100, 5000])
@pytest.mark.parametrize("hd", [64, 128, 256])
@pytest.mark.parametrize("dtype", DTYPES)
def test_context_attention_window(dtype, hd, window, seed) -> None:
    """Against the windowed reference, grouped caches and ALiBi included: windows shorter than a
    key tile, one tile, across tiles, longer than every sequence (= no window)."""
    heads, kv_heads, slots, max_seq = 8, 2, 6, 1100
    seq_slot, lens = [5, 0, 3, 2], [1, 70, 300, 1025]
    cu = [0, *itertools.accumulate(lens)]
    kc = torch.zeros(slots, kv_heads, max_seq, hd, device=DEV, dtype=dtype)
    vc = torch.zeros_like(kc)
    fill_cache(kc, vc, seq_slot, lens)
    q = rand(cu[-1], heads, hd, dtype=dtype, scale=2.0)
    scale = 1.0 / math.sqrt(hd)
    cu_t = torch.tensor(cu, dtype=torch.int32, device=DEV)
    slot_t = torch.tensor(seq_slot, dtype=torch.int32, device=DEV)
    group = heads // kv_heads
    for slopes in (None, slopes_for(heads)):
        poison((cu[-1], heads, hd), dtype)
        out = ops.context_attention(q, kc, vc, cu_t, slot_t, slopes, scale, max(lens), window)
        ref64, ref_lp = [], []
        for b, n in enumerate(lens):
            qb = q[cu[b]:cu[b + 1]]
            kb = cache_rows(_expand_kv(kc, group), seq_slot[b], n)
            vb = cache_rows(_expand_kv(vc, group), seq_slot[b], n)
            ref64.append(attention_ref(qb.double(), kb.double(), vb.double(), scale, slopes,
                                       window))
            ref_lp.append(attention_ref(qb, kb, vb, scale, slopes, window))
        check_attention(out, torch.cat(ref64), torch.cat(ref_lp), dtype,
                        f"context_attention window={window} alibi={slopes is not None}")
    if window >= max(lens):  # a window past every sequence is no window, bit for bit
        torch.testing.assert_close(
            out, ops.context_attention(q, kc, vc, cu_t, slot_t, slopes, scale, max(lens)),
            rtol=0, atol=0)


@pytest.mark.parametrize("window", [1, 7, 100, 3000])
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_attention_window(dtype, window, seed) -> None:
    """Short and split-KV rows (chunks wholly before the window attend to nothing), grouped caches
    and a beam indirection, against the windowed reference; the fused op equals the unfused ones
    with the same window, bit for bit."""
    heads, kv_heads, hd, slots, max_seq = 8, 2, 128, 5, 4200
    lengths, row_slot = [1, 9, 4100, 2049, 513], [3, 0, 4, 1, 2]
    kc = torch.zeros(slots, kv_heads, max_seq, hd, device=DEV, dtype=dtype)
    vc = torch.zeros_like(kc)
    fill_cache(kc, vc, list(range(slots)), [max_seq] * slots)
    q = rand(len(lengths), heads, hd, dtype=dtype, scale=2.0)
    scale = 1.0 / math.sqrt(hd)
    slot_t = torch.tensor(row_slot, dtype=torch.int32, device=DEV)
    len_t = torch.tensor(lengths, dtype=torch.int32, device=DEV)
    indir = torch.randint(0, slots, (len(lengths), max_seq), dtype=torch.int32, device=DEV)
    group = heads // kv_heads
    kx, vx = _expand_kv(kc, group), _expand_kv(vc, group)
    for ind in (None, indir):
        out = ops.decode_attention(q, kc, vc, slot_t, len_t, ind, None, scale, window)
        ref64, ref_lp = [], []
        for r, n in enumerate(lengths):
            src = ind[r, :n].long() if ind is not None else torch.full((n,), row_slot[r],
                                                                       device=DEV)
            pos = torch.arange(n, device=DEV)
            kr, vr = kx[src, :, pos], vx[src, :, pos]
            ref64.append(attention_ref(q[r:r + 1].double(), kr.double(), vr.double(), scale,
                                       None, window))
            ref_lp.append(attention_ref(q[r:r + 1], kr, vr, scale, None, window))
        check_attention(out, torch.cat(ref64), torch.cat(ref_lp), dtype,
                        f"decode_attention window={window} indir={ind is not None}")
    # Fused (multi-head caches) against the unfused ops with the same window.
    kc_m, vc_m = kx.contiguous(), vx.contiguous()
    kc2, vc2 = kc_m.clone(), vc_m.clone()
    qkv = rand(len(lengths), 3, heads, hd, dtype=dtype, scale=2.0)
    q_m = ops.qkv_rotary_cache(qkv, None, kc_m, vc_m, slot_t, len_t - 1, hd, "half", 10000.0)
    ref = ops.decode_attention(q_m, kc_m, vc_m, slot_t, len_t, None, None, scale, window)
    out = ops.decode_attention_fused(qkv, None, kc2, vc2, slot_t, len_t, None, None, scale, hd,
                                     "half", 10000.0, window)
    exactly_equal(out, ref, f"fused window={window}")
    exactly_equal(kc2, kc_m, "fused window k_cache")


def test_attention_window_refused_when_negative(seed) -> None:
    kc, vc = nan_cache(2, 4, 16, 64, torch.float16)
    q = rand(2, 4, 64, dtype=torch.float16)
    lens = torch.tensor([3, 4], dtype=torch.int32, device=DEV)
    with pytest.raises(RuntimeError, match=r"decode_attention: window must be 0 \(no window\)"):
        ops.decode_attention(q, kc, vc, None, lens, None, None, 0.125, -1)
