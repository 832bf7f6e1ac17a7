"""CPU-side checks of the attention ops: registration, mutation annotations, fake shapes, the
argument validation messages (dtype/shape are checked before the device, so CPU tensors reach
them), and the ALiBi slopes against HF BLOOM's build_alibi_tensor."""

from __future__ import annotations

import pytest
import torch

import warpformer  # noqa: F401
import warpformer._ops_attention  # noqa: E402,F401  (fake implementations)

ops = torch.ops.warpformer
I32 = torch.int32


def cache(slots=3, heads=4, max_seq=16, hd=64, dtype=torch.float16) -> torch.Tensor:
    return torch.zeros(slots, heads, max_seq, hd, dtype=dtype)


@pytest.mark.parametrize("name", ["qkv_rotary_cache", "kv_cache_write", "context_attention",
                                  "decode_attention", "decode_attention_fused", "alibi_slopes"])
def test_registered(name: str) -> None:
    assert getattr(ops, name).default._schema.name == f"warpformer::{name}"


def test_mutation_annotations() -> None:
    for name in ("qkv_rotary_cache", "kv_cache_write", "decode_attention_fused"):
        schema = getattr(ops, name).default._schema
        writes = {a.name for a in schema.arguments
                  if a.alias_info is not None and a.alias_info.is_write}
        assert writes == {"k_cache", "v_cache"}
    for name in ("context_attention", "decode_attention"):
        assert not [a for a in getattr(ops, name).default._schema.arguments if a.alias_info]


def test_fake_shapes() -> None:
    def meta(*shape, dtype=torch.float16):
        return torch.empty(*shape, dtype=dtype, device="meta")

    kc = meta(3, 4, 16, 80)
    q = ops.qkv_rotary_cache(meta(5, 3, 4, 80), None, kc, meta(3, 4, 16, 80), meta(5, dtype=I32),
                             meta(5, dtype=I32), 20, "half", 10000.0)
    assert q.shape == (5, 4, 80) and q.dtype == torch.float16
    out = ops.context_attention(meta(5, 4, 80), kc, kc, meta(3, dtype=I32), meta(2, dtype=I32),
                                None, 0.1, 4)
    assert out.shape == (5, 4, 80)
    out = ops.decode_attention(meta(2, 4, 80, dtype=torch.bfloat16), kc, kc, None,
                               meta(2, dtype=I32), None, None, 0.1)
    assert out.shape == (2, 4, 80) and out.dtype == torch.bfloat16
    out = ops.decode_attention_fused(meta(2, 3, 4, 80), None, kc, kc, None, meta(2, dtype=I32),
                                     None, None, 0.1, 20, "half", 10000.0)
    assert out.shape == (2, 4, 80) and out.dtype == torch.float16


def test_context_attention_seq_past_schema() -> None:
    """seq_past is an optional tensor after window (the T5 arguments follow it: see
    test_relative_bias_schemas), so calls without it keep their meaning."""
    args = ops.context_attention.default._schema.arguments
    assert [a.name for a in args[8:10]] == ["window", "seq_past"]
    assert str(args[9].type) == "Optional[Tensor]" and args[9].default_value is None
    assert args[9].alias_info is None


def test_context_attention_seq_past_fake_shape() -> None:
    def meta(*shape, dtype=torch.float16):
        return torch.empty(*shape, dtype=dtype, device="meta")

    kc = meta(3, 4, 16, 80)
    out = ops.context_attention(meta(5, 4, 80), kc, kc, meta(3, dtype=I32), meta(2, dtype=I32),
                                None, 0.1, 4, seq_past=meta(2, dtype=I32))
    assert out.shape == (5, 4, 80) and out.dtype == torch.float16


@pytest.mark.parametrize("heads", range(1, 25))
def test_alibi_slopes_match_hf(heads: int) -> None:
    bloom = pytest.importorskip("transformers.models.bloom.modeling_bloom")
    mask = torch.ones(1, 2, dtype=torch.long)
    # alibi[h, 0, k] = slope[h] * k for an all-ones mask; k = 1 gives the slopes.
    hf = bloom.build_alibi_tensor(mask, heads, torch.float32)[:, 0, 1]
    ours = ops.alibi_slopes(heads)
    assert ours.dtype == torch.float32 and ours.shape == (heads,)
    torch.testing.assert_close(ours, hf, rtol=2.5e-7, atol=0.0)


def test_alibi_slopes_rejects_zero_heads() -> None:
    with pytest.raises(RuntimeError, match="num_heads must be in"):
        ops.alibi_slopes(0)


# ---- argument validation (each message names the op, the argument and the rule) ----------------
def qkv_args(**over):
    args = dict(qkv=torch.zeros(5, 3, 4, 64, dtype=torch.float16), bias=None, k_cache=cache(),
                v_cache=cache(), token_slot=torch.zeros(5, dtype=I32),
                token_pos=torch.arange(5, dtype=I32), rotary_dim=32, rotary_style="half",
                rotary_base=10000.0)
    args.update(over)
    return list(args.values())


@pytest.mark.parametrize("over,msg", [
    (dict(qkv=torch.zeros(5, 3, 4, 72, dtype=torch.float16)),
     r"head_dim must be one of 32, 48, 64, 80, 96, 112, 128, 144, 160, 192, 224, 256, got 72"),
    (dict(qkv=torch.zeros(5, 3, 4, 64, dtype=torch.float64)), r"qkv must be float32, float16"),
    (dict(qkv=torch.zeros(5, 2, 4, 64, dtype=torch.float16)), r"qkv.shape\[1\] must be 3"),
    (dict(bias=torch.zeros(3, 4, 32, dtype=torch.float16)), r"bias must have shape \[3, 4, 64\]"),
    (dict(bias=torch.zeros(3, 4, 64)), r"bias must have dtype Half"),
    (dict(k_cache=cache(dtype=torch.float32)), r"k_cache must have dtype Half"),
    (dict(v_cache=cache(max_seq=8)), r"v_cache must have k_cache's shape"),
    (dict(k_cache=cache(heads=2), v_cache=cache(heads=2)), r"writes caches of its heads \(4\)"),
    (dict(k_cache=cache(heads=3), v_cache=cache(heads=3)), r"must divide the query heads \(4\)"),
    (dict(token_slot=torch.zeros(5)), r"token_slot must have dtype Int"),
    (dict(token_pos=torch.zeros(4, dtype=I32)), r"token_pos.shape\[0\] must be 5"),
    (dict(rotary_style="neox"), r"rotary_style must be one of 'none', 'interleaved'"),
    (dict(rotary_dim=31), r"rotary_dim must be even and in \[0, head_dim = 64\]"),
    (dict(rotary_dim=66), r"rotary_dim must be even"),
    (dict(rotary_style="none"), r"rotary_dim must be 0 when rotary_style is 'none'"),
    (dict(rotary_base=0.0), r"rotary_base must be > 0"),
    (dict(), r"qkv must be a CUDA tensor"),
])
def test_qkv_rotary_cache_validation(over, msg) -> None:
    with pytest.raises(RuntimeError, match=r"warpformer.qkv_rotary_cache: .*" + msg):
        ops.qkv_rotary_cache(*qkv_args(**over))


def test_noncontiguous_cache_rejected() -> None:
    kc = cache(hd=128)[..., ::2]
    with pytest.raises(RuntimeError, match="k_cache must be contiguous"):
        ops.qkv_rotary_cache(*qkv_args(k_cache=kc, v_cache=kc))


def ctx_args(**over):
    args = dict(q=torch.zeros(5, 4, 64, dtype=torch.float16), k_cache=cache(), v_cache=cache(),
                cu_seqlens=torch.tensor([0, 2, 5], dtype=I32),
                seq_slot=torch.tensor([1, 0], dtype=I32), alibi_slopes=None, scale=0.125,
                max_seqlen=3)
    args.update(over)
    return list(args.values())


@pytest.mark.parametrize("over,msg", [
    (dict(q=torch.zeros(5, 4, 100, dtype=torch.float16)), r"head_dim must be one of 32, 48, 64"),
    (dict(q=torch.zeros(5, 64, dtype=torch.float16)), r"q must be 3-dimensional"),
    (dict(v_cache=cache(dtype=torch.bfloat16)), r"v_cache must have dtype Half"),
    (dict(cu_seqlens=torch.tensor([0, 2, 5])), r"cu_seqlens must have dtype Int"),
    (dict(seq_slot=torch.tensor([1, 0, 2], dtype=I32)), r"seq_slot.shape\[0\] must be 2"),
    (dict(alibi_slopes=torch.zeros(4, dtype=torch.float16)), r"alibi_slopes must have dtype Float"),
    (dict(alibi_slopes=torch.zeros(3)), r"alibi_slopes.shape\[0\] must be 4"),
    (dict(max_seqlen=-1), r"max_seqlen must be in"),
    (dict(), r"q must be a CUDA tensor"),
])
def test_context_attention_validation(over, msg) -> None:
    with pytest.raises(RuntimeError, match=r"warpformer.context_attention: " + msg):
        ops.context_attention(*ctx_args(**over))


# seq_past by keyword (after window=0): dtype and shape are checked before the device; its device
# and values (negative, past + length over max_seq) need a GPU (tests/gpu/test_attention_past.py).
@pytest.mark.parametrize("past,msg", [
    (torch.zeros(2), r"seq_past must have dtype Int"),
    (torch.zeros(2, dtype=torch.int64), r"seq_past must have dtype Int"),
    (torch.zeros(2, 1, dtype=I32), r"seq_past must be 1-dimensional"),
    (torch.zeros(3, dtype=I32), r"seq_past.shape\[0\] must be 2 \(batch = cu_seqlens"),
    (torch.zeros(2, dtype=I32), r"q must be a CUDA tensor"),
])
def test_context_attention_seq_past_validation(past, msg) -> None:
    with pytest.raises(RuntimeError, match=r"warpformer.context_attention: " + msg):
        ops.context_attention(*ctx_args(), seq_past=past)


def dec_args(**over):
    args = dict(q=torch.zeros(2, 4, 64, dtype=torch.float16), k_cache=cache(), v_cache=cache(),
                row_slot=torch.tensor([2, 0], dtype=I32), lengths=torch.tensor([3, 16], dtype=I32),
                cache_indir=None, alibi_slopes=None, scale=0.125)
    args.update(over)
    return list(args.values())


@pytest.mark.parametrize("over,msg", [
    (dict(q=torch.zeros(2, 4, 40, dtype=torch.float16)), r"head_dim must be one of 32, 48, 64"),
    (dict(k_cache=cache(hd=128), v_cache=cache(hd=128)), r"k_cache.shape\[3\] must be 64"),
    (dict(row_slot=torch.tensor([0], dtype=I32)), r"row_slot.shape\[0\] must be 2"),
    (dict(lengths=torch.tensor([3.0, 4.0])), r"lengths must have dtype Int"),
    (dict(cache_indir=torch.zeros(2, 15, dtype=I32)),
     r"cache_indir must have shape \[rows, max_seq\]"),
    (dict(cache_indir=torch.zeros(2, 16)), r"cache_indir must have dtype Int"),
    (dict(), r"q must be a CUDA tensor"),
])
def test_decode_attention_validation(over, msg) -> None:
    with pytest.raises(RuntimeError, match=r"warpformer.decode_attention: " + msg):
        ops.decode_attention(*dec_args(**over))


def fused_args(**over):
    args = dict(qkv=torch.zeros(2, 3, 4, 64, dtype=torch.float16), bias=None, k_cache=cache(),
                v_cache=cache(), row_slot=torch.tensor([2, 0], dtype=I32),
                lengths=torch.tensor([3, 16], dtype=I32), cache_indir=None, alibi_slopes=None,
                scale=0.125, rotary_dim=32, rotary_style="interleaved", rotary_base=10000.0)
    args.update(over)
    return list(args.values())


@pytest.mark.parametrize("over,msg", [
    # 3-D is the grouped layout [rows, heads + 2 kv_heads, head_dim]: 4 - 2 x 4 leaves no heads
    (dict(qkv=torch.zeros(2, 4, 64, dtype=torch.float16)), r"qkv must have at least one head"),
    (dict(qkv=torch.zeros(2, 3, 4, 64, 1, dtype=torch.float16)), r"qkv must be 4-dimensional"),
    (dict(qkv=torch.zeros(2, 2, 4, 64, dtype=torch.float16)), r"qkv.shape\[1\] must be 3"),
    (dict(qkv=torch.zeros(2, 3, 4, 40, dtype=torch.float16)), r"head_dim must be one of 32, 48"),
    (dict(bias=torch.zeros(3, 4, 64)), r"bias must have dtype Half"),
    (dict(bias=torch.zeros(3, 2, 64, dtype=torch.float16)), r"bias must have shape \[3, 4, 64\]"),
    (dict(rotary_style="neox"), r"rotary_style must be one of 'none', 'interleaved'"),
    (dict(rotary_dim=66), r"rotary_dim must be even and in \[0, head_dim = 64\]"),
    (dict(rotary_style="none"), r"rotary_dim must be 0 when rotary_style is 'none'"),
    (dict(rotary_base=0.0), r"rotary_base must be > 0"),
    (dict(k_cache=cache(dtype=torch.float32)), r"k_cache must have dtype Half"),
    (dict(k_cache=cache(hd=128), v_cache=cache(hd=128)), r"k_cache.shape\[3\] must be 64"),
    (dict(row_slot=torch.tensor([0], dtype=I32)), r"row_slot.shape\[0\] must be 2 \(rows of qkv"),
    (dict(lengths=torch.tensor([3, 4, 5], dtype=I32)), r"lengths.shape\[0\] must be 2"),
    (dict(cache_indir=torch.zeros(2, 15, dtype=I32)),
     r"cache_indir must have shape \[rows, max_seq\]"),
    (dict(alibi_slopes=torch.zeros(3)), r"alibi_slopes.shape\[0\] must be 4"),
    (dict(), r"qkv must be a CUDA tensor"),
])
def test_decode_attention_fused_validation(over, msg) -> None:
    with pytest.raises(RuntimeError, match=r"warpformer.decode_attention_fused: " + msg):
        ops.decode_attention_fused(*fused_args(**over))


# ---- relative position bias, bidirectional attention, kv_cache_write (T5) ----------------------
def test_relative_bias_schemas() -> None:
    """The new arguments trail the old ones with defaults, so existing calls keep their meaning."""
    def tail(name, n):
        return [(a.name, str(a.type), a.default_value)
                for a in getattr(ops, name).default._schema.arguments[-n:]]

    assert tail("context_attention", 4) == [
        ("seq_past", "Optional[Tensor]", None), ("position_bias", "Optional[Tensor]", None),
        ("bias_max_distance", "int", 0), ("causal", "bool", True)]
    for name in ("decode_attention", "decode_attention_fused"):
        assert tail(name, 3) == [("window", "int", 0), ("position_bias", "Optional[Tensor]", None),
                                 ("bias_max_distance", "int", 0)]
    schema = ops.kv_cache_write.default._schema
    assert [a.name for a in schema.arguments] == ["kv", "k_cache", "v_cache", "token_slot",
                                                  "token_pos", "bias"]
    assert schema.arguments[-1].default_value is None and not schema.returns


def test_relative_bias_fake_shapes() -> None:
    def meta(*shape, dtype=torch.float16):
        return torch.empty(*shape, dtype=dtype, device="meta")

    kc = meta(3, 2, 16, 64)
    table = meta(4, 9, dtype=torch.float32)
    out = ops.context_attention(meta(5, 4, 64), kc, kc, meta(3, dtype=I32), meta(2, dtype=I32),
                                None, 1.0, 4, position_bias=table, bias_max_distance=4,
                                causal=False)
    assert out.shape == (5, 4, 64) and out.dtype == torch.float16
    out = ops.decode_attention(meta(2, 4, 64), kc, kc, None, meta(2, dtype=I32), None, None, 1.0,
                               0, table, 4)
    assert out.shape == (2, 4, 64)
    out = ops.decode_attention_fused(meta(2, 8, 64), None, kc, kc, None, meta(2, dtype=I32), None,
                                     None, 1.0, 0, "none", 10000.0, 0, table, 4)
    assert out.shape == (2, 4, 64)
    assert ops.kv_cache_write(meta(5, 2, 2, 64), kc, kc, meta(5, dtype=I32),
                              meta(5, dtype=I32)) is None


REL_TABLE = torch.zeros(4, 9)  # heads 4, bias_max_distance 4


@pytest.mark.parametrize("over,msg", [
    (dict(position_bias=torch.zeros(4, 9, dtype=torch.float16)),
     r"position_bias must have dtype Float"),
    (dict(position_bias=torch.zeros(36)), r"position_bias must be 2-dimensional"),
    (dict(position_bias=torch.zeros(4, 8)),
     r"position_bias must have shape \[heads, 2 \* bias_max_distance \+ 1\] = \[4, 9\], "
     r"got \[4, 8\]"),
    (dict(position_bias=torch.zeros(2, 9)), r"position_bias must have shape .* = \[4, 9\]"),
    (dict(bias_max_distance=-1), r"bias_max_distance must be in \[0, 65535\]"),
    (dict(bias_max_distance=65536, position_bias=None),
     r"bias_max_distance must be in \[0, 65535\]"),
    (dict(causal=False, window=3), r"window must be 0 when causal is False"),
    (dict(causal=False, position_bias=None), r"q must be a CUDA tensor"),
    (dict(), r"q must be a CUDA tensor"),
])
def test_context_attention_relative_validation(over, msg) -> None:
    kw = dict(window=0, seq_past=None, position_bias=REL_TABLE, bias_max_distance=4, causal=True)
    kw.update(over)
    with pytest.raises(RuntimeError, match=r"warpformer.context_attention: " + msg):
        ops.context_attention(*ctx_args(), **kw)


@pytest.mark.parametrize("over,msg", [
    (dict(position_bias=torch.zeros(4, 9, dtype=torch.float64)),
     r"position_bias must have dtype Float"),
    (dict(position_bias=torch.zeros(4, 9, 1)), r"position_bias must be 2-dimensional"),
    (dict(position_bias=torch.zeros(4, 7)), r"position_bias must have shape .* = \[4, 9\]"),
    (dict(bias_max_distance=70000), r"bias_max_distance must be in \[0, 65535\]"),
    (dict(), r"q must be a CUDA tensor"),
])
def test_decode_attention_relative_validation(over, msg) -> None:
    kw = dict(window=0, position_bias=REL_TABLE, bias_max_distance=4)
    kw.update(over)
    with pytest.raises(RuntimeError, match=r"warpformer.decode_attention: " + msg):
        ops.decode_attention(*dec_args(), **kw)


@pytest.mark.parametrize("over,msg", [
    (dict(position_bias=torch.zeros(4, 9, dtype=torch.float16)),
     r"position_bias must have dtype Float"),
    (dict(position_bias=torch.zeros(3, 9)), r"position_bias must have shape .* = \[4, 9\]"),
    (dict(bias_max_distance=-2), r"bias_max_distance must be in \[0, 65535\]"),
    (dict(), r"qkv must be a CUDA tensor"),
])
def test_decode_attention_fused_relative_validation(over, msg) -> None:
    kw = dict(window=0, position_bias=REL_TABLE, bias_max_distance=4)
    kw.update(over)
    with pytest.raises(RuntimeError, match=r"warpformer.decode_attention_fused: " + msg):
        ops.decode_attention_fused(*fused_args(), **kw)


def kv_args(**over):
    args = dict(kv=torch.zeros(5, 2, 4, 64, dtype=torch.float16), k_cache=cache(),
                v_cache=cache(), token_slot=torch.zeros(5, dtype=I32),
                token_pos=torch.arange(5, dtype=I32), bias=None)
    args.update(over)
    return list(args.values())


@pytest.mark.parametrize("over,msg", [
    (dict(kv=torch.zeros(5, 512, dtype=torch.float16)), r"kv must be 3 or 4-dimensional"),
    (dict(kv=torch.zeros(5, 2, 4, 64, dtype=torch.float64)), r"kv must be float32, float16"),
    (dict(kv=torch.zeros(5, 3, 4, 64, dtype=torch.float16)),
     r"kv.shape\[1\] must be 2 \(\[tokens, 2, kv_heads, head_dim\]: k, v\)"),
    (dict(kv=torch.zeros(5, 2, 2, 64, dtype=torch.float16)),
     r"kv.shape\[2\] must be 4 \(the heads of k_cache\)"),
    (dict(kv=torch.zeros(5, 4, 64, dtype=torch.float16)),
     r"kv.shape\[1\] must be 8 \(\[tokens, 2 kv_heads, head_dim\]"),
    (dict(kv=torch.zeros(5, 2, 4, 72, dtype=torch.float16)),
     r"head_dim must be one of 32, 48, 64"),
    (dict(k_cache=cache(heads=0), v_cache=cache(heads=0)), r"k_cache must have at least one head"),
    (dict(k_cache=torch.zeros(3, 4, 16, 64, 1, dtype=torch.float16)),
     r"k_cache must be 4-dimensional"),
    (dict(k_cache=cache(dtype=torch.float32)), r"k_cache must have dtype Half \(the dtype of kv\)"),
    (dict(v_cache=cache(max_seq=8)), r"v_cache must have k_cache's shape"),
    (dict(k_cache=cache(hd=128), v_cache=cache(hd=128)), r"k_cache.shape\[3\] must be 64"),
    (dict(bias=torch.zeros(2, 4, 64)), r"bias must have dtype Half"),
    (dict(bias=torch.zeros(8, 64, dtype=torch.float16)),
     r"bias must have shape \[2, 4, 64\] \(kv's shape without the tokens\)"),
    (dict(token_slot=torch.zeros(5)), r"token_slot must have dtype Int"),
    (dict(token_pos=torch.zeros(4, dtype=I32)), r"token_pos.shape\[0\] must be 5"),
    (dict(bias=torch.zeros(2, 4, 64, dtype=torch.float16)), r"kv must be a CUDA tensor"),
    (dict(kv=torch.zeros(5, 8, 64, dtype=torch.float16), bias=torch.zeros(8, 64,
                                                                          dtype=torch.float16)),
     r"kv must be a CUDA tensor"),
])
def test_kv_cache_write_validation(over, msg) -> None:
    with pytest.raises(RuntimeError, match=r"warpformer.kv_cache_write: " + msg):
        ops.kv_cache_write(*kv_args(**over))
