"""GPU tests of the attention ops (qkv_rotary_cache, context_attention, decode_attention and
decode_attention_fused) against plain PyTorch references (the fused op against the two unfused
ops, bit for bit).

Tolerance rule (one table, FLOOR below): the reference is computed in float64 from the very
inputs the kernel sees. fp32 kernels must be within 1e-4 of the reference's largest magnitude.
For fp16/bf16 the kernel's max error must be at most 2x the max error of the same reference run
by PyTorch in that dtype (scores and p @ v in the dtype, softmax in fp32, as HF does), plus a
floor of one unit in the last place at magnitude 1 of the dtype (2^-10 for fp16, 2^-7 for bf16):
it covers cases where PyTorch's low-precision path is exact by luck (a length-1 sequence, where
the output is v itself) while the kernel still rounds its fp32 result once.
qkv_rotary_cache computes in fp32 and rounds once, so it uses the element-wise table of
tests/tolerances.py.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

import warpformer  # noqa: F401
from tests.tolerances import DTYPES, assert_close

pytestmark = pytest.mark.gpu
ops = torch.ops.warpformer
DEV = "cuda"
HEAD_DIMS = [32, 48, 64, 80, 96, 112, 128, 144, 160, 192, 224, 256]  # kAttentionHeadDims
FLOOR = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}
LENS = [1, 7, 97, 300, 1025]


# ---- references ---------------------------------------------------------------------------------
def inv_freq_ref(rotary_dim: int, base: float) -> torch.Tensor:
    """HF's fp32 inv_freq = 1 / base^(arange(0, d, 2) / d), with the power rounded once."""
    expo = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    return 1.0 / (base ** expo.double()).float()


def rotary_ref(x: torch.Tensor, pos: torch.Tensor, rotary_dim: int, style: str,
               base: float = 10000.0) -> torch.Tensor:
    """x [T, H, D] (any float dtype, computed in it), pos [T]: GPT-J (interleaved) or GPT-NeoX
    (half) rotary on the first rotary_dim dims; angles in fp32 like HF."""
    if style == "none" or rotary_dim == 0:
        return x.clone()
    ang = pos.to(x.device).float()[:, None] * inv_freq_ref(rotary_dim, base).to(x.device)[None]
    cos = ang.cos().to(x.dtype)[:, None, :]
    sin = ang.sin().to(x.dtype)[:, None, :]
    out = x.clone()
    if style == "interleaved":
        a, b = x[..., 0:rotary_dim:2], x[..., 1:rotary_dim:2]
        out[..., 0:rotary_dim:2] = a * cos - b * sin
        out[..., 1:rotary_dim:2] = b * cos + a * sin
    else:
        h = rotary_dim // 2
        a, b = x[..., :h], x[..., h:rotary_dim]
        out[..., :h] = a * cos - b * sin
        out[..., h:rotary_dim] = b * cos + a * sin
    return out


def attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                  slopes: torch.Tensor | None = None, window: int = 0) -> torch.Tensor:
    """Causal attention of the S newest positions: q [S, H, D] at positions L-S .. L-1, k/v
    [L, H, D]; window > 0: only the last `window` positions of each query. Scores and p @ v in
    q's dtype, ALiBi and softmax in fp32 (float64 for float64)."""
    S, L = q.shape[0], k.shape[0]
    qh, kh, vh = (t.transpose(0, 1) for t in (q, k, v))
    s = torch.matmul(qh, kh.transpose(1, 2)) * scale
    s = s if s.dtype == torch.float64 else s.float()
    qpos = torch.arange(L - S, L, device=q.device)
    kpos = torch.arange(L, device=q.device)
    rel = (kpos[None, :] - qpos[:, None]).to(s.dtype)
    if slopes is not None:
        s = s + slopes.to(s.dtype)[:, None, None] * rel[None]
    s = s.masked_fill(rel[None] > 0, float("-inf"))
    if window > 0:
        s = s.masked_fill(rel[None] <= -window, float("-inf"))
    p = torch.softmax(s, dim=-1).to(q.dtype)
    return torch.matmul(p, vh).transpose(0, 1)


def check_attention(out: torch.Tensor, ref64: torch.Tensor, ref_lp: torch.Tensor | None,
                    dtype: torch.dtype, what: str) -> None:
    assert out.dtype == dtype and out.shape == ref64.shape, (out.dtype, out.shape, ref64.shape)
    err = (out.double() - ref64).abs().max().item()
    if dtype == torch.float32:
        bound = 1e-4 * max(ref64.abs().max().item(), 1e-3)
    else:
        torch_err = (ref_lp.double() - ref64).abs().max().item()
        bound = 2.0 * torch_err + FLOOR[dtype]
    assert err <= bound, f"{what}: max error {err:.3e} > bound {bound:.3e} (NaN = unwritten)"


# ---- helpers ------------------------------------------------------------------------------------
def rand(*shape: int, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, device=DEV) * scale).to(dtype)


def poison(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    """Fill a block of the output's size with NaN and free it: the caching allocator hands it to
    the op's next output, so an element the kernel fails to write shows up as NaN."""
    torch.full(shape, float("nan"), device=DEV, dtype=dtype)


def nan_cache(slots: int, heads: int, max_seq: int, hd: int, dtype: torch.dtype):
    shape = (slots, heads, max_seq, hd)
    return (torch.full(shape, float("nan"), device=DEV, dtype=dtype),
            torch.full(shape, float("nan"), device=DEV, dtype=dtype))


def fill_cache(kc: torch.Tensor, vc: torch.Tensor, slots: list[int], lens: list[int]) -> None:
    """Random K/V at positions < len of each slot; the rest stays NaN (must never be read)."""
    for s, n in zip(slots, lens, strict=True):
        kc[s, :, :n] = torch.randn(kc.shape[1], n, kc.shape[3], device=DEV).to(kc.dtype)
        vc[s, :, :n] = torch.randn(vc.shape[1], n, vc.shape[3], device=DEV).to(vc.dtype)


def cache_rows(c: torch.Tensor, slot: int, n: int) -> torch.Tensor:
    return c[slot, :, :n].transpose(0, 1)  # [n, H, D]


def slopes_for(heads: int) -> torch.Tensor:
    return ops.alibi_slopes(heads).to(DEV)


def partial_rotary(hd: int) -> int:
    return 64 if hd == 256 else (hd // 4) // 2 * 2


# ---- qkv_rotary_cache ---------------------------------------------------------------------------
ROTARY = [("none", "none"), ("interleaved", "full"), ("half", "full"),
          ("interleaved", "partial"), ("half", "partial")]


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("style,extent", ROTARY)
@pytest.mark.parametrize("hd", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_qkv_rotary_cache(dtype, hd, style, extent, with_bias, seed) -> None:
    heads, slots, max_seq = 12, 5, 64
    rd = {"none": 0, "full": hd, "partial": partial_rotary(hd)}[extent]
    # three sequences in slots 3, 0, 4: one decode-like token at 40, a prompt 0..6, and a chunk
    # 27..63 that ends at the last cache position. Slots 1 and 2 are never written.
    token_slot = [3] + [0] * 7 + [4] * 37
    token_pos = [40] + list(range(7)) + list(range(27, 64))
    T = len(token_slot)
    slot_t = torch.tensor(token_slot, dtype=torch.int32, device=DEV)
    pos_t = torch.tensor(token_pos, dtype=torch.int32, device=DEV)
    qkv = rand(T, 3, heads, hd, dtype=dtype)
    bias = rand(3, heads, hd, dtype=dtype, scale=0.5) if with_bias else None
    kc, vc = nan_cache(slots, heads, max_seq, hd, dtype)
    poison((T, heads, hd), dtype)
    q = ops.qkv_rotary_cache(qkv, bias, kc, vc, slot_t, pos_t, rd, style, 10000.0)

    x = qkv.double() + (bias.double() if bias is not None else 0.0)
    pos = torch.tensor(token_pos, device=DEV)
    assert q.shape == (T, heads, hd) and q.dtype == dtype
    assert_close(q, rotary_ref(x[:, 0], pos, rd, style), dtype)
    si, pi = slot_t.long(), pos_t.long()
    assert_close(kc[si, :, pi], rotary_ref(x[:, 1], pos, rd, style), dtype)
    assert_close(vc[si, :, pi], x[:, 2], dtype)
    written = torch.zeros(slots, max_seq, dtype=torch.bool, device=DEV)
    written[si, pi] = True
    for c in (kc, vc):
        assert c.permute(0, 2, 1, 3)[~written].isnan().all(), "wrote outside its positions"


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("style,rd", [("none", 0), ("interleaved", 22), ("interleaved", 128),
                                      ("half", 32), ("half", 128)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_qkv_rotary_cache_vector_and_element_paths(dtype, style, rd, with_bias, seed) -> None:
    """16-byte aligned tensors take the vector kernel (rd=22 interleaved: a vector straddles the
    rotary end for every dtype); the same values one element off alignment take the
    element-by-element kernel. Both must write the same bits into q and both caches."""
    heads, hd, slots, max_seq = 6, 128, 3, 48
    token_slot = [2] * 9 + [0] * 5
    token_pos = list(range(9)) + list(range(40, 45))
    T = len(token_slot)
    slot_t = torch.tensor(token_slot, dtype=torch.int32, device=DEV)
    pos_t = torch.tensor(token_pos, dtype=torch.int32, device=DEV)
    qkv = rand(T, 3, heads, hd, dtype=dtype)
    bias = rand(3, heads, hd, dtype=dtype, scale=0.5) if with_bias else None
    shifted = torch.empty(qkv.numel() + 1, dtype=dtype, device=DEV)[1:].view_as(qkv)
    shifted.copy_(qkv)
    assert shifted.data_ptr() % 16 != 0
    outs, kernels = [], []
    for x in (qkv, shifted):
        kc, vc = nan_cache(slots, heads, max_seq, hd, dtype)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            q = ops.qkv_rotary_cache(x, bias, kc, vc, slot_t, pos_t, rd, style, 10000.0)
            torch.cuda.synchronize()
        # the kernel's VEC template argument, from names like "qkv_prep_kernel<__half, 8>(...)"
        kernels.append({int(m.group(1)) for e in prof.events()
                        if (m := re.search(r"qkv_prep_kernel<[^,<>]+, (\d+)>", e.name))})
        outs.append((q, kc, vc))
    assert kernels == [{16 // qkv.element_size()}, {1}], kernels
    for what, a, b in zip(("q", "k_cache", "v_cache"), *outs, strict=True):
        exactly_equal(a, b, f"{style} rd={rd} {what}: vector vs element path")
    x = qkv.double() + (bias.double() if bias is not None else 0.0)
    assert_close(outs[0][0], rotary_ref(x[:, 0], pos_t.long(), rd, style), dtype)


def test_qkv_rotary_long_positions(seed) -> None:
    """Positions in the thousands: the fp32 angle must be formed like HF's (exact same rounding)."""
    heads, hd, max_seq = 2, 128, 8192
    pos_list = [0, 1, 1000, 2047, 4099, 8191]
    T = len(pos_list)
    qkv = rand(T, 3, heads, hd, dtype=torch.float32)
    kc, vc = nan_cache(1, heads, max_seq, hd, torch.float32)
    slot_t = torch.zeros(T, dtype=torch.int32, device=DEV)
    pos_t = torch.tensor(pos_list, dtype=torch.int32, device=DEV)
    for style in ("interleaved", "half"):
        q = ops.qkv_rotary_cache(qkv, None, kc, vc, slot_t, pos_t, hd, style, 10000.0)
        ref = rotary_ref(qkv[:, 0].double(), pos_t.long(), hd, style)
        torch.testing.assert_close(q.double(), ref, atol=2e-5, rtol=2e-5)


# ---- context attention --------------------------------------------------------------------------
@pytest.mark.parametrize("alibi", [False, True])
@pytest.mark.parametrize("hd", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_context_attention(dtype, hd, alibi, seed) -> None:
    heads, slots, max_seq = 12, 7, 1100
    seq_slot = [5, 0, 3, 6, 2]
    cu = [0]
    for n in LENS:
        cu.append(cu[-1] + n)
    T = cu[-1]
    kc, vc = nan_cache(slots, heads, max_seq, hd, dtype)
    fill_cache(kc, vc, seq_slot, LENS)
    q = rand(T, heads, hd, dtype=dtype, scale=2.0)
    slopes = slopes_for(heads) if alibi else None
    scale = 1.0 / math.sqrt(hd)
    cu_t = torch.tensor(cu, dtype=torch.int32, device=DEV)
    slot_t = torch.tensor(seq_slot, dtype=torch.int32, device=DEV)
    poison((T, heads, hd), dtype)  # last allocation before the op's output
    out = ops.context_attention(q, kc, vc, cu_t, slot_t, slopes, scale, max(LENS))
    ref64, ref_lp = [], []
    for b, n in enumerate(LENS):
        qb = q[cu[b]:cu[b + 1]]
        kb, vb = cache_rows(kc, seq_slot[b], n), cache_rows(vc, seq_slot[b], n)
        ref64.append(attention_ref(qb.double(), kb.double(), vb.double(), scale, slopes))
        ref_lp.append(attention_ref(qb, kb, vb, scale, slopes))
    check_attention(out, torch.cat(ref64), torch.cat(ref_lp), dtype, "context_attention")


# fp16/bf16 heads run on tensor cores on sm_80+ (tiles of 32 keys for heads over 128, 64
# otherwise); fp32 runs the CUDA-core kernel, which test_context_attention covers in fp32.
def _context_kernels(dtype: torch.dtype, hd: int) -> set[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        test_context_attention(dtype, hd, False, 0)
        torch.cuda.synchronize()
    return {e.name for e in prof.events() if "context_attention" in e.name}


def test_context_attention_kernel_choice() -> None:
    tensor_cores = torch.cuda.get_device_capability()[0] >= 8
    for hd in (32, 64, 160, 256):
        names = _context_kernels(torch.float16, hd)
        assert names and all(("mma" in n) == tensor_cores for n in names), (hd, names)
    names = _context_kernels(torch.float32, 64)
    assert names and not any("mma" in n for n in names), names


# ---- decode attention ---------------------------------------------------------------------------
def decode_refs(q, kc, vc, lengths, slots_per_pos, scale, slopes):
    """slots_per_pos[r]: LongTensor [len] of the slot each position of row r is read from."""
    ref64, ref_lp = [], []
    for r, n in enumerate(lengths):
        src = slots_per_pos[r]
        pos = torch.arange(n, device=DEV)
        kr, vr = kc[src, :, pos], vc[src, :, pos]  # [n, H, D]
        qr = q[r:r + 1]
        ref64.append(attention_ref(qr.double(), kr.double(), vr.double(), scale, slopes))
        ref_lp.append(attention_ref(qr, kr, vr, scale, slopes))
    return torch.cat(ref64), torch.cat(ref_lp)


def run_decode(dtype, hd, heads, lengths, max_seq, row_slot, slots, alibi, what):
    kc, vc = nan_cache(slots, heads, max_seq, hd, dtype)
    fill_cache(kc, vc, row_slot, lengths)
    rows = len(lengths)
    q = rand(rows, heads, hd, dtype=dtype, scale=2.0)
    slopes = slopes_for(heads) if alibi else None
    scale = 1.0 / math.sqrt(hd)
    slot_t = torch.tensor(row_slot, dtype=torch.int32, device=DEV)
    len_t = torch.tensor(lengths, dtype=torch.int32, device=DEV)
    poison((rows, heads, hd), dtype)
    out = ops.decode_attention(q, kc, vc, slot_t, len_t, None, slopes, scale)
    per_pos = [torch.full((n,), s, dtype=torch.long, device=DEV)
               for s, n in zip(row_slot, lengths, strict=True)]
    ref64, ref_lp = decode_refs(q, kc, vc, lengths, per_pos, scale, slopes)
    check_attention(out, ref64, ref_lp, dtype, what)


@pytest.mark.parametrize("alibi", [False, True])
@pytest.mark.parametrize("hd", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_attention(dtype, hd, alibi, seed) -> None:
    # max_seq 1100 < 2048: the single-kernel path.
    run_decode(dtype, hd, 12, LENS, 1100, [5, 0, 3, 6, 2], 7, alibi, "decode_attention")


@pytest.mark.parametrize("alibi", [False, True])
@pytest.mark.parametrize("hd", [32, 64, 80, 128, 160, 256])
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_attention_split_kv(dtype, hd, alibi, seed) -> None:
    # max_seq 4200 with 5 rows x 20 heads: split into chunks of 512 keys plus the combine kernel.
    run_decode(dtype, hd, 20, [4100, 1, 2048, 513, 4200], 4200, [2, 5, 0, 4, 1], 6, alibi,
               "decode_attention split-KV")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_decode_attention_split_kv_many_rows(dtype, seed) -> None:
    # 64 rows x 16 heads = 1024 (row, head) pairs: chunks of 4096 keys, two chunks for 4200.
    g = torch.Generator().manual_seed(7)
    lengths = [4200, 4096, 4097, 1, 2] + torch.randint(1, 4201, (59,), generator=g).tolist()
    row_slot = torch.randperm(64, generator=g).tolist()
    run_decode(dtype, 64, 16, lengths, 4200, row_slot, 64, False, "decode many rows")


@pytest.mark.parametrize("long", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_attention_running_max(dtype, long, seed) -> None:
    """The decode attention folds each window of keys into running maxima and sums as it goes
    (online softmax) and weights its key groups by their maxima at the end. Keys aligned with
    the query make logits up to 25 above the rest (~N(0, 1)), so a window whose maximum is not
    rescaled when a later one raises it, or a group weighted wrongly, puts its values in the
    output at up to e^16 times their weight. Rows: the dominant key (25) in a late window, in
    the first window, aligned keys every 37 positions with logits rising 0-15 over the context
    (in a different group each, so the block's weights decide), two dominant keys (18) far
    apart, and 5 keys with one at 16 (most groups meet none).
    `long`: a cache of 4,200 positions, split into key chunks and combined."""
    heads, hd = 4, 64
    max_seq = 4200 if long else 1100
    lengths = [1000, 1000, 1000, 1000, 5]
    row_slot = [3, 0, 4, 1, 2]
    kc, vc = nan_cache(5, heads, max_seq, hd, dtype)
    fill_cache(kc, vc, row_slot, lengths)
    q = rand(5, heads, hd, dtype=dtype)
    scale = 1.0 / math.sqrt(hd)
    # q / (scale |q|^2): the key of q's direction whose logit is 1 (the others' are ~N(0, 1)).
    unit = q.float() / (scale * q.float().pow(2).sum(dim=-1, keepdim=True))

    def align(r: int, pos: int, logit: float) -> None:
        kc[row_slot[r], :, pos] = (unit[r] * logit).to(dtype)

    align(0, 900, 25.0)  # late window; the windows before it had small maxima
    align(1, 3, 25.0)  # first window; every later window is far below it
    for pos in range(0, 1000, 37):  # the maximum moves up in every window
        align(2, pos, 15.0 * pos / 999)
    align(3, 10, 18.0)
    align(3, 990, 18.0)
    align(4, 2, 16.0)
    slot_t = torch.tensor(row_slot, dtype=torch.int32, device=DEV)
    len_t = torch.tensor(lengths, dtype=torch.int32, device=DEV)
    poison((5, heads, hd), dtype)
    out = ops.decode_attention(q, kc, vc, slot_t, len_t, None, None, scale)
    per_pos = [torch.full((n,), s, dtype=torch.long, device=DEV)
               for s, n in zip(row_slot, lengths, strict=True)]
    ref64, ref_lp = decode_refs(q, kc, vc, lengths, per_pos, scale, None)
    check_attention(out, ref64, ref_lp, dtype, "decode_attention running max")


@pytest.mark.parametrize("long", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_attention_cache_indir(dtype, long, seed) -> None:
    """Beam search: 2 batch entries x 3 beams; each row reads every position but its newest from
    a random beam of its batch entry (row_slot None: row r owns slot r)."""
    heads, hd, beams = 12, 128, 3
    max_seq = 4200 if long else 300
    lengths = ([4100] * beams + [1000] * beams) if long else ([200] * beams + [57] * beams)
    rows = len(lengths)
    kc, vc = nan_cache(rows, heads, max_seq, hd, dtype)
    fill_cache(kc, vc, list(range(rows)), lengths)
    indir = torch.full((rows, max_seq), -1, dtype=torch.int32)  # past the length: never read
    per_pos = []
    for r, n in enumerate(lengths):
        b = r // beams
        src = b * beams + torch.randint(0, beams, (n,))
        src[n - 1] = r
        indir[r, :n] = src.int()
        per_pos.append(src.to(DEV))
    q = rand(rows, heads, hd, dtype=dtype, scale=2.0)
    scale = 1.0 / math.sqrt(hd)
    len_t = torch.tensor(lengths, dtype=torch.int32, device=DEV)
    indir_t = indir.to(DEV)
    poison((rows, heads, hd), dtype)
    out = ops.decode_attention(q, kc, vc, None, len_t, indir_t, None, scale)
    ref64, ref_lp = decode_refs(q, kc, vc, lengths, per_pos, scale, None)
    check_attention(out, ref64, ref_lp, dtype, "decode_attention cache_indir")


# ---- prefill then one decode step, as a decoder layer runs them ---------------------------------
ARCHS = {  # heads, head_dim, rotary_dim, rotary_style, bias, alibi
    "gptj": (4, 256, 64, "interleaved", False, False),
    "neox": (8, 80, 20, "half", True, False),
    "neox128": (6, 128, 128, "half", True, False),
    "bloom": (20, 64, 0, "none", True, True),
    "gpt2": (12, 64, 0, "none", True, False),
}


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_prefill_then_decode(dtype, arch, seed) -> None:
    heads, hd, rd, style, with_bias, alibi = ARCHS[arch]
    lens, seq_slot, slots, max_seq = [1, 7, 97, 300], [4, 1, 5, 0], 6, 512
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    T = cu[-1]
    kc, vc = nan_cache(slots, heads, max_seq, hd, dtype)
    qkv = rand(T, 3, heads, hd, dtype=dtype)
    bias = rand(3, heads, hd, dtype=dtype, scale=0.5) if with_bias else None
    token_slot = torch.tensor([s for s, n in zip(seq_slot, lens, strict=True)
                               for _ in range(n)],
                              dtype=torch.int32, device=DEV)
    token_pos = torch.cat([torch.arange(n) for n in lens]).int().to(DEV)
    slopes = slopes_for(heads) if alibi else None
    scale = 1.0 / math.sqrt(hd)
    slot_t = torch.tensor(seq_slot, dtype=torch.int32, device=DEV)

    cu_t = torch.tensor(cu, dtype=torch.int32, device=DEV)
    q = ops.qkv_rotary_cache(qkv, bias, kc, vc, token_slot, token_pos, rd, style, 10000.0)
    poison((T, heads, hd), dtype)
    out = ops.context_attention(q, kc, vc, cu_t, slot_t, slopes, scale, max(lens))

    # decode step: one new token per sequence at position len
    qkv2 = rand(len(lens), 3, heads, hd, dtype=dtype)
    pos2 = torch.tensor(lens, dtype=torch.int32, device=DEV)
    len2 = pos2 + 1
    q2 = ops.qkv_rotary_cache(qkv2, bias, kc, vc, slot_t, pos2, rd, style, 10000.0)
    poison((len(lens), heads, hd), dtype)
    out2 = ops.decode_attention(q2, kc, vc, slot_t, len2, None, slopes, scale)

    def prepared(x, pos):  # x [N, 3, H, D] in the compute dtype (bias added in it)
        if bias is not None:
            x = x + bias.to(x.dtype)
        return (rotary_ref(x[:, 0], pos, rd, style), rotary_ref(x[:, 1], pos, rd, style), x[:, 2])

    refs = {}
    for name, cdt in (("64", torch.float64), ("lp", dtype)):
        qr, kr, vr = prepared(qkv.to(cdt), token_pos.long())
        q2r, k2r, v2r = prepared(qkv2.to(cdt), pos2.long())
        ctx, dec = [], []
        for b in range(len(lens)):
            sl = slice(cu[b], cu[b + 1])
            ctx.append(attention_ref(qr[sl], kr[sl], vr[sl], scale, slopes))
            kb = torch.cat([kr[sl], k2r[b:b + 1]])
            vb = torch.cat([vr[sl], v2r[b:b + 1]])
            dec.append(attention_ref(q2r[b:b + 1], kb, vb, scale, slopes))
        refs[name] = (torch.cat(ctx), torch.cat(dec))
    check_attention(out, refs["64"][0], refs["lp"][0], dtype, f"{arch} prefill")
    check_attention(out2, refs["64"][1], refs["lp"][1], dtype, f"{arch} decode")


# ---- decode attention with the QKV preparation fused in -----------------------------------------
def exactly_equal(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"{what}: {m}")


def fused_vs_unfused(dtype, arch, lens, max_seq, row_slot, slots, indir=None) -> None:
    """qkv_rotary_cache + decode_attention (each reference-tested above) against
    decode_attention_fused on copies of one cache: outputs and both caches bit-identical."""
    heads, hd, rd, style, with_bias, alibi = ARCHS[arch]
    rows = len(lens)
    kc, vc = nan_cache(slots, heads, max_seq, hd, dtype)
    own = row_slot if row_slot is not None else list(range(rows))
    fill_cache(kc, vc, own, [n - 1 for n in lens])  # the new token's position stays NaN
    kc2, vc2 = kc.clone(), vc.clone()
    qkv = rand(rows, 3, heads, hd, dtype=dtype, scale=2.0)
    bias = rand(3, heads, hd, dtype=dtype, scale=0.5) if with_bias else None
    slopes = slopes_for(heads) if alibi else None
    scale = 1.0 / math.sqrt(hd)
    len_t = torch.tensor(lens, dtype=torch.int32, device=DEV)
    own_t = torch.tensor(own, dtype=torch.int32, device=DEV)
    slot_t = own_t if row_slot is not None else None
    q = ops.qkv_rotary_cache(qkv, bias, kc, vc, own_t, len_t - 1, rd, style, 10000.0)
    ref = ops.decode_attention(q, kc, vc, slot_t, len_t, indir, slopes, scale)
    poison((rows, heads, hd), dtype)
    out = ops.decode_attention_fused(qkv, bias, kc2, vc2, slot_t, len_t, indir, slopes, scale, rd,
                                     style, 10000.0)
    assert not out.isnan().any(), f"{arch}: fused output has unwritten elements"
    exactly_equal(out, ref, f"{arch} fused output")
    exactly_equal(kc2, kc, f"{arch} k_cache")
    exactly_equal(vc2, vc, f"{arch} v_cache")


@pytest.mark.parametrize("long", [False, True])
@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_attention_fused(dtype, arch, long, seed) -> None:
    """Every architecture's rotary/bias/ALiBi combination; long=True splits the keys over
    several blocks (only the block whose chunk holds the new position writes it)."""
    lens, max_seq = ([4100, 1, 2049, 513], 4200) if long else ([1, 7, 97, 300], 512)
    fused_vs_unfused(dtype, arch, lens, max_seq, [4, 1, 5, 0], 6)


@pytest.mark.parametrize("long", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_attention_fused_beams(dtype, long, seed) -> None:
    """Beam search: 2 entries x 3 beams reading older positions from a random beam of their entry
    through cache_indir, the newest from their own slot."""
    beams = 3
    lens = ([4100] * beams + [1000] * beams) if long else ([200] * beams + [57] * beams)
    max_seq = 4200 if long else 300
    indir = torch.full((len(lens), max_seq), -1, dtype=torch.int32)
    for r, n in enumerate(lens):
        indir[r, :n] = (r // beams * beams + torch.randint(0, beams, (n,))).int()
        indir[r, n - 1] = r
    fused_vs_unfused(dtype, "gptj", lens, max_seq, None, len(lens), indir.to(DEV))


@pytest.mark.parametrize("lens", [[1], [2], [16], [17], [32], [33], [64], [65], [128], [129],
                                  [300], [4100], [4100, 1], [129, 128], [1, 300]])
@pytest.mark.parametrize("arch", ["gpt2", "gptj", "bloom"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_attention_fused_early_window(dtype, arch, lens, seed) -> None:
    """At 1-2 rows the fused kernel loads its first window of cache rows before waiting for the
    kernel ahead, leaves the new token's row out and takes it from its own copy afterwards.
    Lengths put the new token first, inside and just past the first window (NGROUPS x UNROLL
    keys in decode_attention.cu: 16 for fp32 256-wide heads, 32 for 16-bit ones, 64 / 128 for
    64-wide fp32 / 16-bit heads), in a later key chunk (4,100 splits the keys over several
    blocks) and at different windows of two rows; the cache's new positions hold NaN before the
    call, so a row read before it was written shows up."""
    max_seq = 4200 if max(lens) > 512 else 512
    row_slot = [1, 0][:len(lens)]
    fused_vs_unfused(dtype, arch, lens, max_seq, row_slot, 2)


@pytest.mark.parametrize("n", [70, 300, 4100])
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_attention_fused_early_window_beams(dtype, n, seed) -> None:
    """Two beams of one entry (the 2-row early path) reading older positions from either beam's
    slot through cache_indir, the newest from their own."""
    max_seq = 4200 if n > 512 else 512
    indir = torch.randint(0, 2, (2, max_seq), dtype=torch.int32)
    indir[0, n - 1], indir[1, n - 1] = 0, 1
    fused_vs_unfused(dtype, "gpt2", [n, n], max_seq, None, 2, indir.to(DEV))


def test_decode_attention_fused_refuses_foreign_new_slot(seed) -> None:
    kc, vc = nan_cache(2, 4, 16, 64, torch.float16)
    indir = torch.zeros(2, 16, dtype=torch.int32, device=DEV)  # row 1's new position -> slot 0
    lens = torch.tensor([3, 5], dtype=torch.int32, device=DEV)
    with pytest.raises(RuntimeError, match=r"cache_indir\[1, lengths\[1\] - 1\] must be the "
                                           r"row's own slot 1"):
        ops.decode_attention_fused(rand(2, 3, 4, 64, dtype=torch.float16), None, kc, vc, None,
                                   lens, indir, None, 0.125, 0, "none", 10000.0)


def test_decode_attention_fused_refuses_shared_slot(seed) -> None:
    """Two rows writing their new token into one slot would race in the fused kernel."""
    kc, vc = nan_cache(3, 4, 16, 64, torch.float16)
    slot = torch.tensor([2, 0, 2], dtype=torch.int32, device=DEV)
    lens = torch.tensor([3, 5, 3], dtype=torch.int32, device=DEV)
    with pytest.raises(RuntimeError, match=r"rows 0 and 2 both write their new token into slot 2"):
        ops.decode_attention_fused(rand(3, 3, 4, 64, dtype=torch.float16), None, kc, vc, slot,
                                   lens, None, None, 0.125, 0, "none", 10000.0)


def test_decode_attention_fused_refuses_reading_another_rows_new_token(seed) -> None:
    """Row 1 reading (slot 0, position 2) through cache_indir while row 0 writes its new token
    there would race; the same read of an older position of slot 0 is fine."""
    kc, vc = nan_cache(2, 4, 16, 64, torch.float16)
    fill_cache(kc, vc, [0, 1], [3, 5])
    lens = torch.tensor([3, 6], dtype=torch.int32, device=DEV)
    qkv = rand(2, 3, 4, 64, dtype=torch.float16)
    indir = torch.tensor([[0] * 16, [1] * 16], dtype=torch.int32, device=DEV)
    indir[1, 1] = 0  # an older position of row 0's slot: allowed
    ops.decode_attention_fused(qkv, None, kc, vc, None, lens, indir, None, 0.125, 0, "none",
                               10000.0)
    indir[1, 2] = 0  # row 0's new position
    with pytest.raises(RuntimeError, match=r"cache_indir\[1, 2\] = 0 reads the position row 0 "
                                           r"writes its new token into"):
        ops.decode_attention_fused(qkv, None, kc, vc, None, lens, indir, None, 0.125, 0, "none",
                                   10000.0)


def test_opcheck(seed) -> None:
    import warpformer._ops_attention  # noqa: F401  (fake implementations)

    dtype, heads, hd, slots, max_seq = torch.float16, 4, 64, 3, 32
    kc = torch.zeros(slots, heads, max_seq, hd, device=DEV, dtype=dtype)
    vc = torch.zeros_like(kc)
    qkv = rand(5, 3, heads, hd, dtype=dtype)
    i32 = dict(dtype=torch.int32, device=DEV)
    utils = ("test_schema", "test_faketensor")
    torch.library.opcheck(ops.qkv_rotary_cache.default,
                          (qkv, None, kc, vc, torch.tensor([0, 0, 0, 2, 2], **i32),
                           torch.tensor([0, 1, 2, 0, 1], **i32), 32, "half", 10000.0),
                          test_utils=utils)
    q = rand(5, heads, hd, dtype=dtype)
    torch.library.opcheck(ops.context_attention.default,
                          (q, kc, vc, torch.tensor([0, 3, 5], **i32), torch.tensor([0, 2], **i32),
                           None, 0.125, 3), test_utils=utils)
    torch.library.opcheck(ops.decode_attention.default,
                          (q[:2], kc, vc, torch.tensor([0, 2], **i32), torch.tensor([3, 2], **i32),
                           None, None, 0.125), test_utils=utils)
    torch.library.opcheck(ops.decode_attention_fused.default,
                          (qkv[:2], None, kc, vc, torch.tensor([0, 2], **i32),
                           torch.tensor([3, 2], **i32), None, None, 0.125, 32, "half", 10000.0),
                          test_utils=utils)
