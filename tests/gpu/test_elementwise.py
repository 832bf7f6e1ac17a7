"""GPU tests of the norm, activation and embedding ops against plain PyTorch fp32 references,
on awkward shapes, both the 16-byte vector path and the element-wise fallback, the long-row
path of the norms, in-place residual semantics and torch.library.opcheck; and of the row
scatter to per-row columns (the engine's hidden-state writes)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import warpformer  # noqa: F401
from tests.tolerances import DTYPES, assert_close

pytestmark = pytest.mark.gpu
ops = torch.ops.warpformer

# hidden sizes: 1, odd (769), round (1024), large (5120, 12288), and two that exceed the
# register-resident row (fp16 > 32768, fp32 > 16384) to cover the re-reading path.
HIDDEN = [1, 769, 1024, 5120, 12288, 40000]
ROWS = [1, 3, 257]


def rand(*shape: int, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, device="cuda") * scale).to(dtype)


def poison(like: torch.Tensor) -> None:
    """Fill a block of the output's size with NaN and free it: the caching allocator hands that
    block to the op's next output, so an element the kernel fails to write shows up as NaN."""
    torch.full_like(like, float("nan"))


def ref_layer_norm(x, w, b, eps):
    """float64 reference."""
    return F.layer_norm(x.double(), (x.shape[-1],), w.double(),
                        None if b is None else b.double(), eps)


def ref_rms_norm(x, w, eps):
    """float64 reference."""
    xd = x.double()
    return xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * w.double()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("rows", ROWS)
def test_layer_norm(dtype, hidden, rows, seed):
    # An offset mean checks the shifted sums (unshifted E[x^2]-E[x]^2 loses it in fp32).
    x = rand(rows, hidden, dtype=dtype) + 30.0
    w, b = rand(hidden, dtype=dtype), rand(hidden, dtype=dtype)
    poison(x)
    out = ops.layer_norm(x, w, b, 1e-5)
    assert_close(out, ref_layer_norm(x, w, b, 1e-5), dtype)
    assert_close(ops.layer_norm(x, w, None, 1e-5), ref_layer_norm(x, w, None, 1e-5), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [1024, 4096, 12288, 40000])
@pytest.mark.parametrize("col", [0, 3, 9])
def test_layer_norm_outlier_column(dtype, hidden, col, seed):
    """A feature 1,000 standard deviations out (LLM residual streams have such "massive
    activations"). In the first vector (col 0, 3) it moves the shift of the one-reduction
    statistics far from the row's mean, so the kernel must take its exact second pass; at col 9
    the shifted sums stand."""
    x = rand(4, hidden, dtype=dtype)
    x[:, col] = 1000.0
    x[1, col] = -1000.0
    x[2] += 30.0  # and an offset on top
    w, b = rand(hidden, dtype=dtype), rand(hidden, dtype=dtype)
    poison(x)
    assert_close(ops.layer_norm(x, w, b, 1e-5), ref_layer_norm(x, w, b, 1e-5), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_rms_norm(dtype, hidden, seed):
    x, w = rand(5, hidden, dtype=dtype), rand(hidden, dtype=dtype)
    poison(x)
    assert_close(ops.rms_norm(x, w, 1e-6), ref_rms_norm(x, w, 1e-6), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [1, 769, 4096, 40000])
@pytest.mark.parametrize("rms", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_add_norm_updates_residual(dtype, hidden, rms, with_bias, seed):
    x, res = rand(7, hidden, dtype=dtype), rand(7, hidden, dtype=dtype)
    # one row with a massive activation in its first vector: LayerNorm's statistics then take
    # their second pass, at 40000 on the path that re-reads the updated residual
    x[0, min(3, hidden - 1)] = 1000.0
    ib = rand(hidden, dtype=dtype) if with_bias else None
    w, b = rand(hidden, dtype=dtype), rand(hidden, dtype=dtype)
    summed = x.double() + res.double() + (ib.double() if with_bias else 0.0)
    residual = res.clone()
    if rms:
        out = ops.add_rms_norm(x, residual, ib, w, 1e-6)
        expected = ref_rms_norm(summed.to(dtype), w, 1e-6)
    else:
        out = ops.add_layer_norm(x, residual, ib, w, b, 1e-5)
        expected = ref_layer_norm(summed.to(dtype), w, b, 1e-5)
    assert_close(residual, summed, dtype)
    assert_close(out, expected, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_unaligned_and_noncontiguous(dtype, seed):
    """A storage offset of one element defeats 16-byte alignment (element-wise fallback); a
    transposed input is made contiguous by the op."""
    base = rand(9 * 1024 + 1, dtype=dtype)
    x = base[1:].view(9, 1024)
    w = rand(1024, dtype=dtype)
    assert_close(ops.layer_norm(x, w, None, 1e-5), ref_layer_norm(x, w, None, 1e-5), dtype)
    xt = rand(1024, 9, dtype=dtype).t()
    assert not xt.is_contiguous()
    assert_close(ops.rms_norm(xt, w, 1e-6), ref_rms_norm(xt, w, 1e-6), dtype)


ACTS = {
    "gelu": lambda x: F.gelu(x),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "identity": lambda x: x,
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("cols", [1, 769, 4096, 12288])
def test_bias_act(dtype, act, cols, seed):
    x, b = rand(3, 5, cols, dtype=dtype, scale=3.0), rand(cols, dtype=dtype)
    expected = ACTS[act](x.double() + b.double())
    poison(x)
    assert_close(ops.bias_act(x, b, act), expected, dtype)
    assert_close(ops.bias_act(x, None, act), ACTS[act](x.double()), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ["gelu", "gelu_tanh", "relu", "silu"])
@pytest.mark.parametrize("cols", [1, 769, 5120])
def test_gated_act(dtype, act, cols, seed):
    x, b = rand(257, 2 * cols, dtype=dtype, scale=2.0), rand(2 * cols, dtype=dtype)
    xf = x.double() + b.double()
    expected = ACTS[act](xf[:, :cols]) * xf[:, cols:]
    poison(expected.to(dtype))
    assert_close(ops.gated_act(x, b, act), expected, dtype)


def test_act_many_rows(seed):
    """More row groups than the grid's y limit (65535) exercise the row-striding loop."""
    x = rand(300000, 8, dtype=torch.float16)
    assert_close(ops.bias_act(x, None, "relu"), F.relu(x.double()), torch.float16)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [1, 769, 1024, 5120])
def test_embedding(dtype, hidden, seed):
    vocab, max_pos = 1000, 64
    wte, wpe = rand(vocab, hidden, dtype=dtype), rand(max_pos, hidden, dtype=dtype)
    ids = torch.randint(0, vocab, (3, 17), device="cuda", dtype=torch.int32)
    pos = torch.arange(17, device="cuda", dtype=torch.int32).expand(3, 17)
    expected = wte.double()[ids.long()] + wpe.double()[pos.long()]
    poison(expected.to(dtype))
    assert_close(ops.embedding(ids, wte, wpe), expected, dtype)
    custom = torch.randint(0, max_pos, (3, 17), device="cuda", dtype=torch.int32)
    expected2 = wte.double()[ids.long()] * 2.0 + wpe.double()[custom.long()]
    assert_close(ops.embedding(ids, wte, wpe, custom, 2.0), expected2, dtype)
    assert_close(ops.embedding(ids.view(-1), wte), wte.double()[ids.view(-1).long()], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_extra_rows(dtype, seed):
    """Ids vocab + j read row j of `extra` (prompt embeddings, unscaled), positions still added;
    an id past the extra rows raises naming both ranges."""
    vocab, hidden = 100, 96
    wte, wpe, extra = (rand(vocab, hidden, dtype=dtype), rand(32, hidden, dtype=dtype),
                       rand(5, hidden, dtype=dtype))
    ids = torch.randint(0, vocab + 5, (2, 11), device="cuda", dtype=torch.int32)
    ids[0, :3] = torch.tensor([vocab, vocab + 4, 7], dtype=torch.int32)
    pos = torch.arange(11, device="cuda", dtype=torch.int32).expand(2, 11)
    table = torch.cat([wte.double() * 3.0, extra.double()])
    expected = table[ids.long()] + wpe.double()[pos.long()]
    assert_close(ops.embedding(ids, wte, wpe, pos, 3.0, extra), expected, dtype)
    bad = ids.clone()
    bad[1, 4] = vocab + 5
    with pytest.raises(RuntimeError, match=rf"contains {vocab + 5} at flat index 15, outside the "
                                           rf"vocabulary \[0, {vocab}\) and the extra rows "
                                           rf"\[{vocab}, {vocab + 5}\)"):
        ops.embedding(bad, wte, wpe, pos, 1.0, extra)


def test_embedding_bad_ids_raise_and_do_not_read_out_of_bounds():
    wte = rand(50, 64, dtype=torch.float16)
    ids = torch.tensor([[1, 2, 3], [4, 50, -1]], device="cuda", dtype=torch.int32)
    with pytest.raises(RuntimeError, match=r"input_ids contains 50 at flat index 4, outside the "
                                           r"vocabulary \[0, 50\)"):
        ops.embedding(ids, wte)
    wpe = rand(2, 64, dtype=torch.float16)
    ok = torch.tensor([[1, 2, 3]], device="cuda", dtype=torch.int32)
    with pytest.raises(RuntimeError, match=r"position 2 of token at flat index 2 is outside the "
                                           r"position table \[0, 2\) \(sequence longer than wpe\)"):
        ops.embedding(ok, wte, wpe)
    # The device is still usable afterwards (no sticky error).
    out = ops.embedding(ok[:, :2], wte, wpe)
    torch.cuda.synchronize()
    assert torch.isfinite(out.float()).all()


def test_wrong_device_message():
    x = rand(4, 8, dtype=torch.float16)
    with pytest.raises(RuntimeError, match=r"layer_norm: weight must be a CUDA tensor"):
        ops.layer_norm(x, torch.ones(8, dtype=torch.float16), None, 1e-5)


def test_current_stream_is_used(seed):
    x, w = rand(64, 4096, dtype=torch.float16), rand(4096, dtype=torch.float16)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        out = ops.rms_norm(x, w, 1e-6)
    s.synchronize()
    assert_close(out, ref_rms_norm(x, w, 1e-6), torch.float16)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_opcheck(dtype, seed):
    """torch.library.opcheck: schema, fake implementation and dispatch consistency."""
    x, w, b = rand(4, 256, dtype=dtype), rand(256, dtype=dtype), rand(256, dtype=dtype)
    ids = torch.randint(0, 100, (2, 9), device="cuda", dtype=torch.int32)
    cases = [
        (ops.layer_norm.default, (x, w, b, 1e-5)),
        (ops.rms_norm.default, (x, w, 1e-6)),
        (ops.add_layer_norm.default, (x, x.clone(), b, w, b, 1e-5)),
        (ops.add_rms_norm.default, (x, x.clone(), None, w, 1e-6)),
        (ops.bias_act.default, (x, b, "gelu_tanh")),
        (ops.gated_act.default, (x, b, "silu")),
        (ops.embedding.default, (ids, rand(100, 256, dtype=dtype), rand(9, 256, dtype=dtype))),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor",
                                                    "test_aot_dispatch_dynamic"))


def ref_scatter_columns(dst, src, index, base, skip, offset):
    """dst with row r of src at column index[r] + offset - base[r] where that is in range and
    skip[r] == 0 (a Python loop: the rule stated once more)."""
    out = dst.clone()
    for r in range(src.shape[0]):
        c = int(index[r]) + offset - (0 if base is None else int(base[r]))
        if (skip is None or int(skip[r]) == 0) and 0 <= c < dst.shape[1]:
            out[r, c] = src[r]
    return out


# widths: 16-byte rows, 4-byte rows, 2-byte rows and odd bytes (the word fallbacks)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.uint8])
@pytest.mark.parametrize("width", [1, 3, 160, 1000])
def test_scatter_rows_to_columns(dtype, width, seed):
    rows, columns = 7, 5
    src = (torch.randn(rows, width, device="cuda") * 50).to(dtype)
    dst = torch.zeros(rows, columns, width, device="cuda", dtype=dtype)
    # columns -2 .. 6 (some outside [0, 5)), two rows skipped, a base per row
    index = torch.tensor([3, 9, 4, 0, 7, 5, 12], device="cuda", dtype=torch.int32)
    base = torch.tensor([2, 4, 6, 0, 5, 2, 10], device="cuda", dtype=torch.int32)
    skip = torch.tensor([0, 0, 1, 0, 0, 1, 0], device="cuda", dtype=torch.int32)
    for b, k, offset in ((base, skip, 1), (None, None, 0), (base, None, -1), (None, skip, 2)):
        want = ref_scatter_columns(dst, src, index, b, k, offset)
        got = dst.clone()
        ops.scatter_rows_to_columns(got, src, index, b, k, offset)
        assert torch.equal(got, want), (b is None, k is None, offset)
    # A strided src (a column slice) is read as its values.
    wide = torch.randn(rows, width + 8, device="cuda").to(dtype)
    got = dst.clone()
    ops.scatter_rows_to_columns(got, wide[:, :width], index, base, None, 1)
    assert torch.equal(got, ref_scatter_columns(dst, wide[:, :width], index, base, None, 1))


def test_scatter_rows_to_columns_opcheck(seed):
    dst = torch.zeros(4, 3, 16, device="cuda", dtype=torch.float16)
    src = torch.randn(4, 16, device="cuda").half()
    idx = torch.tensor([0, 1, 2, 3], device="cuda", dtype=torch.int32)
    torch.library.opcheck(ops.scatter_rows_to_columns.default, (dst, src, idx, None, None, 0),
                          test_utils=("test_schema", "test_faketensor"))
