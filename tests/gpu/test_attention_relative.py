"""GPU tests of the attention ops' encoder-decoder extensions (T5 and BART): bidirectional context
attention (causal=False), T5's relative position bias (position_bias [heads, 2M + 1] per clamped
key - query distance, M = bias_max_distance) in context, decode and fused decode attention, and
kv_cache_write (a cross-attention's memory written into the caches).

References are plain PyTorch with the [q, k] bias built from the clamp rule; the tolerance rule is
tests/gpu/test_attention.py's (check_attention: a float64 reference, and for fp16/bf16 at most 2x
the error of the same reference run by PyTorch in the dtype). The caches hold NaN wherever no key
is, so a read past a sequence shows; outputs are poisoned, so a row left unwritten shows too.
"""

from __future__ import annotations

import itertools
import math
import re

import pytest
import torch

from tests.gpu.test_attention import (
    DEV,
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
from tests.tolerances import DTYPES, assert_close

pytestmark = pytest.mark.gpu

IDX = dict(dtype=torch.int32, device=DEV)


# ---- references ---------------------------------------------------------------------------------
def rel_table(heads: int, m: int) -> torch.Tensor:
    """A random T5-like table [heads, 2m + 1] (fp32), values of a few units."""
    return (torch.randn(heads, 2 * m + 1, device=DEV) * 2.0).float()


def relative_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                 table: torch.Tensor | None = None, m: int = 0, causal: bool = True,
                 slopes: torch.Tensor | None = None, window: int = 0) -> torch.Tensor:
    """q [S, H, D] at positions L-S .. L-1 against k/v [L, H, D] (K/V heads already repeated
    for grouped-query attention): scores and p @ v in q's dtype, biases and softmax in fp32
    (float64 for float64). The relative bias of query P and key k is table[h, clamp(k - P, -m,
    m) + m]; causal masks k > P, window > 0 masks k <= P - window."""
    S, L = q.shape[0], k.shape[0]
    qh, kh, vh = (t.transpose(0, 1) for t in (q, k, v))
    s = torch.matmul(qh, kh.transpose(1, 2)) * scale
    s = s if s.dtype == torch.float64 else s.float()
    qpos = torch.arange(L - S, L, device=q.device)
    kpos = torch.arange(L, device=q.device)
    dist = kpos[None, :] - qpos[:, None]  # [S, L], key - query
    if slopes is not None:
        s = s + slopes.to(s.dtype)[:, None, None] * dist.to(s.dtype)[None]
    if table is not None:
        s = s + table.to(s.dtype)[:, dist.clamp(-m, m) + m]  # [H, S, L]
    if causal:
        s = s.masked_fill(dist[None] > 0, float("-inf"))
    if window > 0:
        s = s.masked_fill(dist[None] <= -window, float("-inf"))
    p = torch.softmax(s, dim=-1).to(q.dtype)
    return torch.matmul(p, vh).transpose(0, 1)


def _packed(seqs: list[tuple[int, int]]):
    lens = [n for _, n in seqs]
    cu = [0, *itertools.accumulate(lens)]
    return cu, torch.tensor(cu, **IDX), torch.tensor([p for p, _ in seqs], **IDX), lens


def run_context(dtype, hd, seqs, *, heads=8, kv_heads=2, causal=True, m=None, slopes=False,
                window=0, with_past=True, what=""):
    """Context attention of sequences (past, new length) in distinct slots against the
    reference; returns the output."""
    seq_slot = list(range(len(seqs), 0, -1))  # distinct, out of order, slot 0 unused
    max_seq = max(p + n for p, n in seqs) + 3  # the positions past every sequence stay NaN
    cu, cu_t, past_t, lens = _packed(seqs)
    kc, vc = nan_cache(len(seqs) + 1, kv_heads, max_seq, hd, dtype)
    fill_cache(kc, vc, seq_slot, [p + n for p, n in seqs])
    q = rand(cu[-1], heads, hd, dtype=dtype, scale=2.0)
    table = rel_table(heads, m) if m is not None else None
    sl = slopes_for(heads) if slopes else None
    scale = 1.0 / math.sqrt(hd)
    group = heads // kv_heads
    kx, vx = _expand_kv(kc, group), _expand_kv(vc, group)
    poison((cu[-1], heads, hd), dtype)
    out = ops.context_attention(q, kc, vc, cu_t, torch.tensor(seq_slot, **IDX), sl, scale,
                                max(lens), window, past_t if with_past else None, table,
                                m if m is not None else 0, causal)
    ref64, ref_lp = [], []
    for b, (p, n) in enumerate(seqs):
        if n == 0:
            continue
        qb = q[cu[b]:cu[b + 1]]
        kb, vb = cache_rows(kx, seq_slot[b], p + n), cache_rows(vx, seq_slot[b], p + n)
        kw = dict(table=table, m=m or 0, causal=causal, slopes=sl, window=window)
        ref64.append(relative_ref(qb.double(), kb.double(), vb.double(), scale, **kw))
        ref_lp.append(relative_ref(qb, kb, vb, scale, **kw))
    check_attention(out, torch.cat(ref64), torch.cat(ref_lp), dtype, what)
    return out


# (past, new length): no history, one position, histories ending inside and at a key tile (32 or
# 64 keys), new rows within one query tile (32 or 64) and across several; an empty sequence.
SEQS_PAST = [(0, 1), (0, 37), (5, 64), (64, 70), (0, 130), (17, 300), (3, 0)]
SEQS = [(0, n) for _, n in SEQS_PAST]  # the T5 encoder's case: whole prompts, no history
HDS = [64, 96, 128, 256]  # 96: accumulator columns of no power of two; 256: 32-key mma tiles


# ---- context attention --------------------------------------------------------------------------
@pytest.mark.parametrize("m", [None, 0, 3, 100, 2000])  # None: no table; 2000 > every distance
@pytest.mark.parametrize("past", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hd", HDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_context_attention_relative(dtype, hd, causal, past, m, seed) -> None:
    """Bidirectional and causal attention with and without the relative bias, ragged sequences
    (cu_seqlens) over grouped caches (8 query heads, 2 K/V heads), with and without cached
    history (seq_past); M small (most distances clamp), 0 (one value a head), and larger than
    every sequence. fp16/bf16 run on tensor cores, fp32 on CUDA cores."""
    run_context(dtype, hd, SEQS_PAST if past else SEQS, causal=causal, m=m, with_past=past,
                what=f"causal={causal} past={past} M={m}")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_context_attention_relative_multi_head_and_alibi(dtype, causal, seed) -> None:
    """Multi-head caches (kv_heads = heads), and ALiBi and the relative bias together (no model
    sets both, but they compose)."""
    for slopes in (False, True):
        run_context(dtype, 64, SEQS_PAST, heads=6, kv_heads=6, causal=causal, m=20,
                    slopes=slopes, what=f"causal={causal} alibi={slopes}")


@pytest.mark.parametrize("window", [5, 64, 100])
@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("dtype", DTYPES)
def test_context_attention_relative_window(dtype, hd, window, seed) -> None:
    """Causal attention with the relative bias and a sliding window, with history."""
    run_context(dtype, hd, SEQS_PAST, causal=True, m=16, window=window, what=f"window={window}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_context_attention_defaults_unchanged(dtype, seed) -> None:
    """causal=True without a table is the old call bit for bit; a table of zeros changes no bit
    (its term adds +0), so the table's path takes the same scores."""
    seqs = SEQS_PAST
    seq_slot = list(range(len(seqs), 0, -1))
    cu, cu_t, past_t, lens = _packed(seqs)
    kc, vc = nan_cache(len(seqs) + 1, 2, 400, 64, dtype)
    fill_cache(kc, vc, seq_slot, [p + n for p, n in seqs])
    q = rand(cu[-1], 8, 64, dtype=dtype, scale=2.0)
    slot_t = torch.tensor(seq_slot, **IDX)
    old = ops.context_attention(q, kc, vc, cu_t, slot_t, None, 0.125, max(lens), 0, past_t)
    new = ops.context_attention(q, kc, vc, cu_t, slot_t, None, 0.125, max(lens), 0, past_t, None,
                                0, True)
    exactly_equal(new, old, "defaults")
    zeros = torch.zeros(8, 2 * 7 + 1, device=DEV)
    exactly_equal(ops.context_attention(q, kc, vc, cu_t, slot_t, None, 0.125, max(lens), 0, past_t,
                                        zeros, 7, True), old, "zero table")


def test_context_attention_relative_refusals(seed) -> None:
    kc, vc = nan_cache(2, 4, 16, 64, torch.float16)
    q = rand(5, 4, 64, dtype=torch.float16)
    cu = torch.tensor([0, 2, 5], **IDX)
    slot = torch.tensor([1, 0], **IDX)
    with pytest.raises(RuntimeError, match=r"window must be 0 when causal is False"):
        ops.context_attention(q, kc, vc, cu, slot, None, 0.125, 3, 4, None, None, 0, False)
    with pytest.raises(RuntimeError, match=r"position_bias must have shape .* = \[4, 9\]"):
        ops.context_attention(q, kc, vc, cu, slot, None, 0.125, 3, 0, None,
                              torch.zeros(4, 7, device=DEV), 4, False)
    with pytest.raises(RuntimeError, match=r"position_bias must be a CUDA tensor"):
        ops.context_attention(q, kc, vc, cu, slot, None, 0.125, 3, 0, None, torch.zeros(4, 9), 4,
                              False)
    with pytest.raises(RuntimeError, match=r"bias_max_distance must be in \[0, 65535\]"):
        ops.context_attention(q, kc, vc, cu, slot, None, 0.125, 3, 0, None, None, 65536, False)


# ---- decode attention ---------------------------------------------------------------------------
def decode_ref_rows(q, kx, vx, lengths, per_pos, scale, table, m):
    ref64, ref_lp = [], []
    for r, n in enumerate(lengths):
        pos = torch.arange(n, device=DEV)
        kr, vr = kx[per_pos[r], :, pos], vx[per_pos[r], :, pos]  # [n, H, D]
        qr = q[r:r + 1]
        ref64.append(relative_ref(qr.double(), kr.double(), vr.double(), scale, table, m))
        ref_lp.append(relative_ref(qr, kr, vr, scale, table, m))
    return torch.cat(ref64), torch.cat(ref_lp)


# Short caches (max_seq 600 < 2048: one block per (row, head)) and long ones (max_seq 4200 with
# few (row, head) pairs: key chunks of 512 and the combine kernel, decode_attention_num_splits).
DECODE_CASES = {False: ([1, 9, 130, 513], 600), True: ([1, 9, 2049, 4100], 4200)}


@pytest.mark.parametrize("m", [0, 5, 300, 5000])
@pytest.mark.parametrize("long", [False, True])
@pytest.mark.parametrize("hd", HDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_attention_relative(dtype, hd, long, m, seed) -> None:
    """The newest token of each row (position lengths[r] - 1) over grouped caches with the
    relative bias, single-block and split-KV."""
    heads, kv_heads = 8, 2
    lengths, max_seq = DECODE_CASES[long]
    row_slot = [3, 0, 4, 1]
    kc, vc = nan_cache(5, kv_heads, max_seq, hd, dtype)
    fill_cache(kc, vc, row_slot, lengths)
    q = rand(len(lengths), heads, hd, dtype=dtype, scale=2.0)
    table = rel_table(heads, m)
    scale = 1.0 / math.sqrt(hd)
    poison((len(lengths), heads, hd), dtype)
    out = ops.decode_attention(q, kc, vc, torch.tensor(row_slot, **IDX),
                               torch.tensor(lengths, **IDX), None, None, scale, 0, table, m)
    per_pos = [torch.full((n,), s, device=DEV) for s, n in zip(row_slot, lengths, strict=True)]
    group = heads // kv_heads
    ref64, ref_lp = decode_ref_rows(q, _expand_kv(kc, group), _expand_kv(vc, group), lengths,
                                    per_pos, scale, table, m)
    check_attention(out, ref64, ref_lp, dtype, f"decode long={long} M={m}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_attention_relative_beams(dtype, seed) -> None:
    """Beam search (cache_indir): 2 entries x 3 beams reading older positions from a random beam
    of their entry, long caches (split-KV), with the relative bias."""
    heads, hd, beams, m = 8, 64, 3, 40
    lengths, max_seq = [4100] * beams + [700] * beams, 4200
    rows = len(lengths)
    kc, vc = nan_cache(rows, heads, max_seq, hd, dtype)
    fill_cache(kc, vc, list(range(rows)), lengths)
    indir = torch.full((rows, max_seq), -1, dtype=torch.int32)
    per_pos = []
    for r, n in enumerate(lengths):
        src = r // beams * beams + torch.randint(0, beams, (n,))
        src[n - 1] = r
        indir[r, :n] = src.int()
        per_pos.append(src.to(DEV))
    q = rand(rows, heads, hd, dtype=dtype, scale=2.0)
    table = rel_table(heads, m)
    scale = 1.0 / math.sqrt(hd)
    poison((rows, heads, hd), dtype)
    out = ops.decode_attention(q, kc, vc, None, torch.tensor(lengths, **IDX), indir.to(DEV), None,
                               scale, 0, table, m)
    ref64, ref_lp = decode_ref_rows(q, kc, vc, lengths, per_pos, scale, table, m)
    check_attention(out, ref64, ref_lp, dtype, "decode beams")


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_attention_relative_defaults_unchanged(dtype, seed) -> None:
    """No table is the old call bit for bit; a zero table changes no bit."""
    lengths, max_seq = DECODE_CASES[True]
    kc, vc = nan_cache(4, 2, max_seq, 128, dtype)
    fill_cache(kc, vc, [0, 1, 2, 3], lengths)
    q = rand(4, 8, 128, dtype=dtype)
    len_t = torch.tensor(lengths, **IDX)
    old = ops.decode_attention(q, kc, vc, None, len_t, None, None, 0.1)
    exactly_equal(ops.decode_attention(q, kc, vc, None, len_t, None, None, 0.1, 0, None, 0), old,
                  "defaults")
    zeros = torch.zeros(8, 2 * 9 + 1, device=DEV)
    exactly_equal(ops.decode_attention(q, kc, vc, None, len_t, None, None, 0.1, 0, zeros, 9), old,
                  "zero table")


# Fused: rows (1-2 rows take the early-start kernel, more the plain fused one; 4100 splits the
# keys), and a cache layout: multi-head (qkv [rows, 3, heads, hd]) or grouped ([rows, heads + 2
# kv_heads, hd]).
FUSED_LENS = [[1], [5], [129, 128], [4100, 1], [1, 7, 97, 300], [4100, 1, 2049, 513]]


@pytest.mark.parametrize("lens", FUSED_LENS)
@pytest.mark.parametrize("kv_heads", [8, 2])
@pytest.mark.parametrize("style", ["none", "half"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_attention_fused_relative(dtype, style, kv_heads, lens, seed) -> None:
    """decode_attention_fused with the relative bias equals qkv_rotary_cache + decode_attention
    with it (reference-tested above) bit for bit: outputs and both caches."""
    heads, hd, m = 8, 64, 30
    rows = len(lens)
    max_seq = 4200 if max(lens) > 512 else 512
    row_slot = list(range(1, rows + 1))
    kc, vc = nan_cache(rows + 1, kv_heads, max_seq, hd, dtype)
    fill_cache(kc, vc, row_slot, [n - 1 for n in lens])  # the new token's position stays NaN
    kc2, vc2 = kc.clone(), vc.clone()
    width = (rows, 3, heads, hd) if kv_heads == heads else (rows, heads + 2 * kv_heads, hd)
    qkv = rand(*width, dtype=dtype, scale=2.0)
    bias = rand(*width[1:], dtype=dtype, scale=0.5)
    rd = hd if style != "none" else 0
    slot_t = torch.tensor(row_slot, **IDX)
    len_t = torch.tensor(lens, **IDX)
    table = rel_table(heads, m)
    q = ops.qkv_rotary_cache(qkv, bias, kc, vc, slot_t, len_t - 1, rd, style, 10000.0)
    ref = ops.decode_attention(q, kc, vc, slot_t, len_t, None, None, 0.125, 0, table, m)
    poison((rows, heads, hd), dtype)
    out = ops.decode_attention_fused(qkv, bias, kc2, vc2, slot_t, len_t, None, None, 0.125, rd,
                                     style, 10000.0, 0, table, m)
    assert not out.isnan().any(), "fused output has unwritten elements"
    exactly_equal(out, ref, "fused relative output")
    exactly_equal(kc2, kc, "fused relative k_cache")
    exactly_equal(vc2, vc, "fused relative v_cache")


def test_decode_attention_relative_refusals(seed) -> None:
    kc, vc = nan_cache(2, 4, 16, 64, torch.float16)
    q = rand(2, 4, 64, dtype=torch.float16)
    lens = torch.tensor([3, 4], **IDX)
    with pytest.raises(RuntimeError, match=r"decode_attention: position_bias must have dtype"):
        ops.decode_attention(q, kc, vc, None, lens, None, None, 0.125, 0,
                             torch.zeros(4, 9, device=DEV, dtype=torch.float16), 4)
    with pytest.raises(RuntimeError, match=r"decode_attention: position_bias must be a CUDA"):
        ops.decode_attention(q, kc, vc, None, lens, None, None, 0.125, 0, torch.zeros(4, 9), 4)


# ---- kv_cache_write (a cross-attention's memory) ------------------------------------------------
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("layout", ["4d", "3d"])
@pytest.mark.parametrize("hd", [32, 64, 96, 128, 256])
@pytest.mark.parametrize("dtype", DTYPES)
def test_kv_cache_write(dtype, hd, layout, with_bias, seed) -> None:
    """kv [tokens, 2, kv_heads, hd] (or [tokens, 2 kv_heads, hd]) + bias scattered into the
    caches at (token_slot, token_pos), computed in fp32 and rounded once; nothing else written."""
    kv_heads, slots, max_seq = 4, 5, 40
    token_slot = [3] * 11 + [0] * 6 + [4]
    token_pos = list(range(11)) + list(range(34, 40)) + [17]
    T = len(token_slot)
    kv = rand(T, 2, kv_heads, hd, dtype=dtype)
    bias = rand(2, kv_heads, hd, dtype=dtype, scale=0.5) if with_bias else None
    kc, vc = nan_cache(slots, kv_heads, max_seq, hd, dtype)
    slot_t, pos_t = torch.tensor(token_slot, **IDX), torch.tensor(token_pos, **IDX)
    if layout == "4d":
        ops.kv_cache_write(kv, kc, vc, slot_t, pos_t, bias)
    else:
        ops.kv_cache_write(kv.reshape(T, 2 * kv_heads, hd), kc, vc, slot_t, pos_t,
                           bias.reshape(2 * kv_heads, hd) if bias is not None else None)
    x = kv.double() + (bias.double() if bias is not None else 0.0)
    si, pi = slot_t.long(), pos_t.long()
    assert_close(kc[si, :, pi], x[:, 0], dtype)
    assert_close(vc[si, :, pi], x[:, 1], dtype)
    written = torch.zeros(slots, max_seq, dtype=torch.bool, device=DEV)
    written[si, pi] = True
    for c in (kc, vc):
        assert c.permute(0, 2, 1, 3)[~written].isnan().all(), "wrote outside its positions"


@pytest.mark.parametrize("dtype", DTYPES)
def test_kv_cache_write_vector_and_element_paths(dtype, seed) -> None:
    """16-byte aligned kv takes the vector kernel, the same values one element off alignment the
    element-by-element one (both of qkv prep's kv_only form); both write the same bits, and the
    same as qkv_rotary_cache's K/V of a qkv whose Q heads are anything."""
    kv_heads, hd, slots, max_seq = 3, 128, 3, 48
    token_slot, token_pos = [2] * 9 + [0] * 5, list(range(9)) + list(range(40, 45))
    T = len(token_slot)
    slot_t, pos_t = torch.tensor(token_slot, **IDX), torch.tensor(token_pos, **IDX)
    kv = rand(T, 2 * kv_heads, hd, dtype=dtype)
    bias = rand(2 * kv_heads, hd, dtype=dtype, scale=0.5)
    shifted = torch.empty(kv.numel() + 1, dtype=dtype, device=DEV)[1:].view_as(kv)
    shifted.copy_(kv)
    assert shifted.data_ptr() % 16 != 0
    caches, kernels = [], []
    for x in (kv, shifted):
        kc, vc = nan_cache(slots, kv_heads, max_seq, hd, dtype)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            ops.kv_cache_write(x, kc, vc, slot_t, pos_t, bias)
            torch.cuda.synchronize()
        kernels.append({int(m.group(1)) for e in prof.events()
                        if (m := re.search(r"qkv_prep_kernel<[^,<>]+, (\d+)>", e.name))})
        caches.append((kc, vc))
    assert kernels == [{16 // kv.element_size()}, {1}], kernels
    exactly_equal(caches[1][0], caches[0][0], "k_cache: vector vs element path")
    exactly_equal(caches[1][1], caches[0][1], "v_cache: vector vs element path")
    # The grouped qkv_rotary_cache without rotary writes the same K/V (one query head per group).
    qkv = torch.cat([rand(T, kv_heads, hd, dtype=dtype), kv], dim=1)
    qkv_bias = torch.cat([torch.zeros(kv_heads, hd, device=DEV, dtype=dtype), bias])
    kc, vc = nan_cache(slots, kv_heads, max_seq, hd, dtype)
    ops.qkv_rotary_cache(qkv, qkv_bias, kc, vc, slot_t, pos_t, 0, "none", 10000.0)
    exactly_equal(caches[0][0], kc, "k_cache: kv_cache_write vs qkv_rotary_cache")
    exactly_equal(caches[0][1], vc, "v_cache: kv_cache_write vs qkv_rotary_cache")


@pytest.mark.parametrize("dtype", DTYPES)
def test_t5_encoder_then_cross_attention(dtype, seed) -> None:
    """A T5 layer's two uses of the memory: the encoder attends bidirectionally with the
    relative bias over its own K/V (kv_cache_write writes them), and the decoder's queries
    attend to the whole memory through decode_attention (lengths = the encoder lengths)."""
    heads, hd, m = 6, 64, 128
    enc_lens = [11, 200, 1]
    slots, max_seq = len(enc_lens), 256
    cu = [0, *itertools.accumulate(enc_lens)]
    T = cu[-1]
    token_slot = torch.tensor([b for b, n in enumerate(enc_lens) for _ in range(n)], **IDX)
    token_pos = torch.cat([torch.arange(n, **IDX) for n in enc_lens])
    kc, vc = nan_cache(slots, heads, max_seq, hd, dtype)
    ops.kv_cache_write(rand(T, 2, heads, hd, dtype=dtype), kc, vc, token_slot, token_pos)
    q = rand(T, heads, hd, dtype=dtype, scale=0.25)  # T5 folds the score scale into its weights
    table = rel_table(heads, m)
    slot_t = torch.arange(slots, **IDX)
    poison((T, heads, hd), dtype)
    out = ops.context_attention(q, kc, vc, torch.tensor(cu, **IDX), slot_t, None, 1.0,
                                max(enc_lens), 0, None, table, m, False)
    ref64, ref_lp = [], []
    for b, n in enumerate(enc_lens):
        qb = q[cu[b]:cu[b + 1]]
        kb, vb = cache_rows(kc, b, n), cache_rows(vc, b, n)
        ref64.append(relative_ref(qb.double(), kb.double(), vb.double(), 1.0, table, m, False))
        ref_lp.append(relative_ref(qb, kb, vb, 1.0, table, m, False))
    check_attention(out, torch.cat(ref64), torch.cat(ref_lp), dtype, "T5 encoder")
    # Cross-attention: one decoder query per entry over the entry's whole memory, no bias.
    qd = rand(slots, heads, hd, dtype=dtype)
    poison((slots, heads, hd), dtype)
    dec = ops.decode_attention(qd, kc, vc, slot_t, torch.tensor(enc_lens, **IDX), None, None, 1.0)
    per_pos = [torch.full((n,), b, device=DEV) for b, n in enumerate(enc_lens)]
    ref64, ref_lp = decode_ref_rows(qd, kc, vc, enc_lens, per_pos, 1.0, None, 0)
    check_attention(dec, ref64, ref_lp, dtype, "T5 cross-attention")


def test_opcheck_relative(seed) -> None:
    import warpformer._ops_attention  # noqa: F401  (fake implementations)

    dtype, heads, hd, slots, max_seq = torch.float16, 4, 64, 3, 32
    kc = torch.zeros(slots, heads, max_seq, hd, device=DEV, dtype=dtype)
    vc = torch.zeros_like(kc)
    table = rel_table(heads, 5)
    utils = ("test_schema", "test_faketensor")
    q = rand(5, heads, hd, dtype=dtype)
    torch.library.opcheck(ops.kv_cache_write.default,
                          (rand(5, 2, heads, hd, dtype=dtype), kc, vc,
                           torch.tensor([0, 0, 0, 2, 2], **IDX),
                           torch.tensor([0, 1, 2, 0, 1], **IDX), None), test_utils=utils)
    torch.library.opcheck(ops.context_attention.default,
                          (q, kc, vc, torch.tensor([0, 3, 5], **IDX), torch.tensor([0, 2], **IDX),
                           None, 0.125, 3, 0, None, table, 5, False), test_utils=utils)
    torch.library.opcheck(ops.decode_attention.default,
                          (q[:2], kc, vc, torch.tensor([0, 2], **IDX), torch.tensor([3, 2], **IDX),
                           None, None, 0.125, 0, table, 5), test_utils=utils)
