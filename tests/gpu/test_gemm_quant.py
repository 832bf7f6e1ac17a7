"""Weight-only int8/int4 products (warpformer.gemm_quant, layers::linear_forward) against the
input times the dequantized weight in float64, and the dequantizing kernel against the Python
quantizer's dequantize, bit for bit."""

from __future__ import annotations

import pytest
import torch

import warpformer  # noqa: F401
from warpformer.converters.quantize import dequantize, quantize

pytestmark = pytest.mark.gpu
ops = torch.ops.warpformer

# fp32 accumulation over the dequantized weight, one rounding of the output.
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
FORMATS = [("int8", 0, False), ("int4", 128, False), ("int4", 64, True), ("int4", 32, False)]


def _weight(k: int, n: int, mode: str, group: int, asym: bool, dtype: torch.dtype, seed: int = 0):
    """A random [k, n] kernel quantized on the GPU: (Quantized, dense dequantized in dtype)."""
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(k, n, generator=g) / k ** 0.5).cuda()
    q = quantize(w, mode, group, dtype, asym, "w")
    return q, dequantize(q, dtype)


def _ref(x: torch.Tensor, dense: torch.Tensor, bias=None, act: str = "none") -> torch.Tensor:
    y = x.double() @ dense.double()
    if bias is not None:
        y = y + bias.double()
    if act == "relu":
        y = torch.relu(y)
    elif act == "silu":
        y = torch.nn.functional.silu(y)
    return y


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("mode,group,asym", FORMATS)
@pytest.mark.parametrize("k,n", [(1024, 3072), (4096, 1024), (256, 48), (1536, 208)])
def test_dequantize_matches_python(dtype, mode, group, asym, k, n):
    q, dense = _weight(k, n, mode, group, asym, dtype)
    out = ops.dequantize_weight(q.data, q.scale, q.zero, group)
    assert out.dtype == dtype and out.shape == (k, n)
    assert torch.equal(out, dense)


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("mode,group,asym", FORMATS)
@pytest.mark.parametrize("m", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("k,n", [(1024, 3072), (4096, 1024), (256, 48)])
def test_gemv_matches_dequantized_product(dtype, mode, group, asym, m, k, n):
    q, dense = _weight(k, n, mode, group, asym, dtype, seed=m)
    x = torch.randn(m, k, device="cuda").to(dtype)
    out = ops.gemm_quant(x, q.data, q.scale, q.zero, None, group, "none", "gemv")
    assert _rel(out, _ref(x, dense)) <= TOL[dtype]


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("mode,group,asym", FORMATS[:2])
@pytest.mark.parametrize("epilogue,act", [("bias", "none"), ("bias_relu", "relu"),
                                          ("bias_silu", "silu")])
def test_epilogues(dtype, mode, group, asym, epilogue, act):
    k, n = 2048, 1536
    q, dense = _weight(k, n, mode, group, asym, dtype)
    x = torch.randn(2, k, device="cuda").to(dtype)
    bias = torch.randn(n, device="cuda").to(dtype)
    for backend in ("gemv", "dequant"):
        out = ops.gemm_quant(x, q.data, q.scale, q.zero, bias, group, epilogue, backend)
        assert _rel(out, _ref(x, dense, bias, act)) <= TOL[dtype], backend


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("mode,group,asym", FORMATS[:3])
@pytest.mark.parametrize("m", [9, 64, 300])
def test_many_rows_dequantize_then_gemm(dtype, mode, group, asym, m):
    """Past 8 rows 'auto' dequantizes into scratch and runs the GEMM: the same product."""
    k, n = 1024, 4096
    q, dense = _weight(k, n, mode, group, asym, dtype)
    x = torch.randn(m, k, device="cuda").to(dtype)
    out = ops.gemm_quant(x, q.data, q.scale, q.zero, None, group, "none", "auto")
    assert _rel(out, _ref(x, dense)) <= TOL[dtype]


def test_gemv_deterministic_and_split_invariant():
    """Run to run the same bits (fixed reduction order, k-split through cluster ranks), and a
    k-split shape (n small, k large) equals the float64 reference."""
    k, n = 16384, 512
    q, dense = _weight(k, n, "int4", 128, False, torch.float16)
    x = torch.randn(1, k, device="cuda").half()
    a = ops.gemm_quant(x, q.data, q.scale, None, None, 128, "none", "gemv")
    b = ops.gemm_quant(x, q.data, q.scale, None, None, 128, "none", "gemv")
    assert torch.equal(a, b)
    assert _rel(a, _ref(x, dense)) <= TOL[torch.float16]


def test_gemv_equals_dequant_path_closely():
    """The two paths of one product agree to the output's rounding (both accumulate in fp32)."""
    k, n = 4096, 4096
    q, _ = _weight(k, n, "int8", 0, False, torch.bfloat16)
    x = torch.randn(4, k, device="cuda").bfloat16()
    a = ops.gemm_quant(x, q.data, q.scale, None, None, 0, "none", "gemv").float()
    b = ops.gemm_quant(x, q.data, q.scale, None, None, 0, "none", "dequant").float()
    assert float((a - b).abs().max() / b.abs().max()) <= 1.6e-2


def test_misaligned_input_is_copied():
    """A contiguous view at an address the kernels cannot vector-load is copied, on every path."""
    k, n = 256, 64
    q, dense = _weight(k, n, "int8", 0, False, torch.float16)
    x = torch.randn(k + 4, device="cuda").half()[4:].view(1, k)  # contiguous, 8 bytes off
    for backend in ("gemv", "auto", "dequant"):
        out = ops.gemm_quant(x, q.data, q.scale, None, None, 0, "none", backend)
        assert _rel(out, _ref(x, dense)) <= TOL[torch.float16], backend
    dense_out = ops.gemm(x, dense, None, False, "none", "cublaslt")
    assert _rel(dense_out, _ref(x, dense)) <= TOL[torch.float16]


@pytest.mark.parametrize("group", [8, 24])
def test_group_the_gemv_cannot_step_falls_back(group):
    """An int4 group that is not a multiple of 16 input rows (a valid format) is refused by the
    'gemv' backend, and 'auto' runs it dequantized."""
    k, n = 96 if group == 24 else 64, 32
    q, dense = _weight(k, n, "int4", group, False, torch.bfloat16)
    x = torch.randn(2, k, device="cuda").bfloat16()
    with pytest.raises(RuntimeError, match="backend 'gemv' cannot run this product"):
        ops.gemm_quant(x, q.data, q.scale, None, None, group, "none", "gemv")
    out = ops.gemm_quant(x, q.data, q.scale, None, None, group, "none", "auto")
    assert _rel(out, _ref(x, dense)) <= TOL[torch.bfloat16]


def test_torch_compile_traces_gemm_quant():
    k, n = 512, 256
    q, dense = _weight(k, n, "int4", 64, True, torch.float16)

    def f(x):
        return ops.gemm_quant(x, q.data, q.scale, q.zero, None, 64, "none", "auto") * 2

    x = torch.randn(3, k, device="cuda").half()
    out = torch.compile(f, fullgraph=True, backend="eager")(x)
    assert _rel(out / 2, _ref(x, dense)) <= TOL[torch.float16]
