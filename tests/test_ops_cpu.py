"""CPU-side checks of the extension: registration, schemas, fake (meta) implementations,
TorchScript, and argument validation. The ops validate dtype/shape before the device, so every
error message can be checked here with CPU tensors."""

from __future__ import annotations

import pytest
import torch

import warpformer  # noqa: F401

OPS = ["layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm", "bias_act", "gated_act",
       "embedding", "norm_gemm", "norm_gemm_pair", "gemm_sum", "gemm_quant", "dequantize_weight",
       "scatter_rows_to_columns"]


@pytest.mark.parametrize("name", OPS)
def test_op_registered(name: str) -> None:
    op = getattr(torch.ops.warpformer, name)
    assert op.default._schema.name == f"warpformer::{name}"


def test_mutation_annotations() -> None:
    for name in ("add_layer_norm", "add_rms_norm"):
        schema = getattr(torch.ops.warpformer, name).default._schema
        residual = [a for a in schema.arguments if a.name == "residual"][0]
        assert residual.alias_info is not None and residual.alias_info.is_write
        others = [a for a in schema.arguments if a.name != "residual" and a.alias_info]
        assert not others


def meta(*shape: int, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


def test_fake_shapes() -> None:
    x, w = meta(3, 5, 64), meta(64)
    assert torch.ops.warpformer.layer_norm(x, w, w, 1e-5).shape == (3, 5, 64)
    assert torch.ops.warpformer.rms_norm(x, w, 1e-6).shape == (3, 5, 64)
    assert torch.ops.warpformer.add_layer_norm(x, meta(3, 5, 64), None, w, None, 1e-5).shape == (
        3, 5, 64)
    assert torch.ops.warpformer.add_rms_norm(x, meta(3, 5, 64), w, w, 1e-5).shape == (3, 5, 64)
    assert torch.ops.warpformer.bias_act(x, w, "gelu").shape == (3, 5, 64)
    out = torch.ops.warpformer.gated_act(x, None, "silu")
    assert out.shape == (3, 5, 32) and out.dtype == torch.float16
    ids = torch.empty(2, 7, dtype=torch.int32, device="meta")
    emb = torch.ops.warpformer.embedding(ids, meta(100, 48, dtype=torch.bfloat16))
    assert emb.shape == (2, 7, 48) and emb.dtype == torch.bfloat16


def test_fake_tensor_mode_trace() -> None:
    """torch.compile's tracer runs ops under FakeTensorMode; the fakes must cover a whole chain."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(4, 128, dtype=torch.float16)
        w = torch.empty(128, dtype=torch.float16)
        h = torch.ops.warpformer.layer_norm(x, w, w, 1e-5)
        g = torch.ops.warpformer.gated_act(torch.cat([h, h], -1), None, "gelu_tanh")
        assert g.shape == (4, 128)


def test_torchscript_can_call_ops() -> None:
    @torch.jit.script
    def block(x: torch.Tensor, res: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        h = torch.ops.warpformer.add_layer_norm(x, res, None, w, b, 1e-5)
        return torch.ops.warpformer.bias_act(h, b, "gelu_tanh")

    assert "warpformer::add_layer_norm" in str(block.graph)
    # Without a GPU the scripted function fails with the op's own clear message.
    x = torch.randn(2, 8)
    with pytest.raises(RuntimeError, match="must be a CUDA tensor"):
        block(x, x.clone(), torch.ones(8), torch.zeros(8))


# ---- argument validation (each message names the argument and the rule) ----------------------

def f32(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def i32(*shape: int) -> torch.Tensor:
    return torch.zeros(*shape, dtype=torch.int32)


@pytest.mark.parametrize(
    "call, pattern",
    [
        (lambda: torch.ops.warpformer.layer_norm(f32(4, 8).int(), f32(8), None, 1e-5),
         r"layer_norm: input must be float32, float16 or bfloat16, got Int"),
        (lambda: torch.ops.warpformer.layer_norm(f32(4, 8), f32(8).half(), None, 1e-5),
         r"layer_norm: weight must have dtype Float \(the dtype of input\), got Half"),
        (lambda: torch.ops.warpformer.layer_norm(f32(4, 8), f32(2, 8), None, 1e-5),
         r"layer_norm: weight must be 1-dimensional, got shape \[2, 8\]"),
        (lambda: torch.ops.warpformer.layer_norm(f32(4, 8), f32(7), None, 1e-5),
         r"layer_norm: weight.shape\[0\] must be 8 \(input's last dimension\)"),
        (lambda: torch.ops.warpformer.layer_norm(f32(4, 8), f32(8), f32(9), 1e-5),
         r"layer_norm: bias.shape\[0\] must be 8"),
        (lambda: torch.ops.warpformer.layer_norm(f32(4, 8), f32(8), None, -1.0),
         r"layer_norm: eps must be >= 0"),
        (lambda: torch.ops.warpformer.layer_norm(torch.tensor(1.0), f32(1), None, 1e-5),
         r"layer_norm: input must have at least 1 dimension"),
        (lambda: torch.ops.warpformer.rms_norm(f32(4, 8), f32(8), 1e-5),
         r"rms_norm: input must be a CUDA tensor, got device cpu"),
        (lambda: torch.ops.warpformer.add_layer_norm(f32(4, 8), f32(4, 9), None, f32(8), None,
                                                     1e-5),
         r"add_layer_norm: residual must have input's shape \[4, 8\], got \[4, 9\]"),
        (lambda: torch.ops.warpformer.add_layer_norm(f32(4, 8), f32(8, 4).t(), None, f32(8), None,
                                                     1e-5),
         r"add_layer_norm: residual must be contiguous"),
        (lambda: torch.ops.warpformer.add_rms_norm(f32(4, 8), f32(4, 8).half(), None, f32(8),
                                                   1e-5),
         r"add_rms_norm: residual must have dtype Float"),
        (lambda: torch.ops.warpformer.add_rms_norm(f32(4, 8), f32(4, 8), f32(3), f32(8), 1e-5),
         r"add_rms_norm: input_bias.shape\[0\] must be 8"),
        (lambda: torch.ops.warpformer.bias_act(f32(4, 8), None, "gelu_fancy"),
         r"activation must be one of identity, gelu, gelu_tanh, relu, silu \(got 'gelu_fancy'\)"),
        (lambda: torch.ops.warpformer.bias_act(f32(4, 8), f32(4), "relu"),
         r"bias_act: bias.shape\[0\] must be 8"),
        (lambda: torch.ops.warpformer.gated_act(f32(4, 7), None, "silu"),
         r"gated_act: input's last dimension must be even"),
        (lambda: torch.ops.warpformer.gated_act(f32(4, 8), f32(4), "silu"),
         r"gated_act: bias.shape\[0\] must be 8"),
        (lambda: torch.ops.warpformer.embedding(torch.zeros(2, 3, dtype=torch.long), f32(10, 4)),
         r"embedding: input_ids must have dtype Int, got Long"),
        (lambda: torch.ops.warpformer.embedding(torch.zeros(2, 3, 4, dtype=torch.int32),
                                                f32(10, 4)),
         r"embedding: input_ids must be 1 or 2-dimensional"),
        (lambda: torch.ops.warpformer.embedding(torch.zeros(3, dtype=torch.int32), f32(10, 4),
                                                f32(5, 6)),
         r"embedding: wpe.shape\[1\] must be 4 \(the hidden size of wte\)"),
        (lambda: torch.ops.warpformer.embedding(torch.zeros(3, dtype=torch.int32), f32(10, 4),
                                                None, torch.zeros(3, dtype=torch.int32)),
         r"embedding: position_ids given but wpe is None"),
        (lambda: torch.ops.warpformer.embedding(torch.zeros(3, dtype=torch.int32), f32(10, 4),
                                                f32(5, 4), torch.zeros(4, dtype=torch.int32)),
         r"embedding: position_ids must have input_ids's shape"),
        (lambda: torch.ops.warpformer.embedding(torch.zeros(3, dtype=torch.int32), f32(10, 4)),
         r"embedding: input_ids must be a CUDA tensor"),
        (lambda: torch.ops.warpformer.scatter_rows_to_columns(f32(3, 4, 8), f32(3, 9), i32(3)),
         r"scatter_rows_to_columns: dst must be \[rows, columns, \.\.\.\] and src \[rows, \.\.\.\] "
         r"with the same trailing shape, got dst \[3, 4, 8\] and src \[3, 9\]"),
        (lambda: torch.ops.warpformer.scatter_rows_to_columns(f32(3, 4, 8), f32(3, 8).half(),
                                                              i32(3)),
         r"scatter_rows_to_columns: src must have dtype Float \(the dtype of dst\), got Half"),
        (lambda: torch.ops.warpformer.scatter_rows_to_columns(f32(3, 4, 8), f32(3, 8),
                                                              i32(3).long()),
         r"scatter_rows_to_columns: index must have dtype Int, got Long"),
        (lambda: torch.ops.warpformer.scatter_rows_to_columns(f32(3, 4, 8), f32(3, 8), i32(3),
                                                              None, i32(2)),
         r"scatter_rows_to_columns: skip.shape\[0\] must be 3 \(rows of src\), got shape \[2\]"),
        (lambda: torch.ops.warpformer.scatter_rows_to_columns(f32(3, 4, 8), f32(3, 8), i32(3)),
         r"scatter_rows_to_columns: dst must be a CUDA tensor"),
    ],
)
def test_bad_arguments(call, pattern: str) -> None:
    with pytest.raises(RuntimeError, match=pattern):
        call()


def test_no_gpu_message_is_clear() -> None:
    """On a machine without a GPU, calling an op is a RuntimeError that says what to do."""
    with pytest.raises(RuntimeError, match="warpformer ops run on NVIDIA GPUs only"):
        torch.ops.warpformer.layer_norm(f32(2, 4), f32(4), None, 1e-5)


def _norm_product_args() -> dict:
    """The arguments norm_gemm and norm_gemm_pair share, valid but for the CPU device."""
    return dict(input=f32(2, 16), residual=None, input_bias=None, norm_weight=f32(16),
                norm_bias=None, norm="layer_norm", eps=1e-5, weight=f32(16, 24), bias=None,
                activation="identity")


def norm_gemm_args(**over):
    return list({**_norm_product_args(), "backend": "fused", **over}.values())


@pytest.mark.parametrize("over, pattern", [
    (dict(norm="batch_norm"), r"norm must be one of layer_norm, rms_norm; got 'batch_norm'"),
    (dict(backend="gemv"), r"backend must be one of fused, unfused; got 'gemv'"),
    (dict(norm="rms_norm", norm_bias=f32(16)), r"norm_bias is for layer_norm only"),
    (dict(eps=-1.0), r"eps must be >= 0 and finite in float32, got -1"),
    (dict(eps=1e39), r"eps must be >= 0 and finite in float32"),
    (dict(activation="tanh"), r"activation must be one of identity, gelu"),
    (dict(input=f32(2, 16).int()), r"input must be float32, float16 or bfloat16"),
    (dict(input=f32(2, 4, 16)), r"input must be 2-dimensional"),
    (dict(residual=f32(2, 15)), r"residual must have input's shape \[2, 16\], got \[2, 15\]"),
    (dict(input_bias=f32(16).half()), r"input_bias must have dtype Float"),
    (dict(norm_weight=f32(15)), r"norm_weight.shape\[0\] must be 16 \(input.shape\[1\]\)"),
    (dict(norm_bias=f32(2, 16)), r"norm_bias must be 1-dimensional"),
    (dict(weight=f32(15, 24)), r"weight.shape\[0\] must be 16 \(input.shape\[1\]\)"),
    (dict(bias=f32(23)), r"bias.shape\[0\] must be 24 \(weight.shape\[1\]\)"),
    (dict(input=f32(0, 16)), r"empty matrices \(m=0, n=24, k=16\)"),
    (dict(), r"input must be a CUDA tensor"),
])
def test_norm_gemm_bad_arguments(over, pattern: str) -> None:
    with pytest.raises(RuntimeError, match=r"warpformer.norm_gemm: " + pattern):
        torch.ops.warpformer.norm_gemm(*norm_gemm_args(**over))


def norm_gemm_pair_args(**over):
    second = dict(weight2=f32(16, 40), bias2=None, activation2="gelu", norm_weight2=None,
                  norm_bias2=None, backend="joined")
    return list({**_norm_product_args(), **second, **over}.values())


@pytest.mark.parametrize("over, pattern", [
    (dict(backend="fused"), r"backend must be one of joined, separate; got 'fused'"),
    (dict(norm="batch_norm"), r"norm must be one of layer_norm, rms_norm; got 'batch_norm'"),
    (dict(weight=f32(15, 24)), r"weight.shape\[0\] must be 16 \(input.shape\[1\]\)"),
    (dict(activation2="tanh"), r"activation2 must be one of identity, gelu"),
    (dict(weight2=f32(15, 40)), r"weight2.shape\[0\] must be 16 \(input.shape\[1\]\)"),
    (dict(weight2=f32(16, 40).half()), r"weight2 must have dtype Float"),
    (dict(weight2=f32(16)), r"weight2 must be 2-dimensional"),
    (dict(bias2=f32(24)), r"bias2.shape\[0\] must be 40 \(weight2.shape\[1\]\)"),
    (dict(norm_bias2=f32(16)), r"norm_bias2 needs norm_weight2"),
    (dict(norm="rms_norm", norm_weight2=f32(16), norm_bias2=f32(16)),
     r"norm_bias2 is for layer_norm only"),
    (dict(norm_weight2=f32(15)), r"norm_weight2.shape\[0\] must be 16 \(input.shape\[1\]\)"),
    (dict(weight2=f32(16, 0)), r"empty matrix weight2 \(n2=0\)"),
    (dict(), r"input must be a CUDA tensor"),
])
def test_norm_gemm_pair_bad_arguments(over, pattern: str) -> None:
    with pytest.raises(RuntimeError, match=r"warpformer.norm_gemm_pair: " + pattern):
        torch.ops.warpformer.norm_gemm_pair(*norm_gemm_pair_args(**over))


def test_norm_gemm_pair_fake_shapes() -> None:
    out, out2, x = torch.ops.warpformer.norm_gemm_pair(*norm_gemm_pair_args(
        input=meta(3, 64), norm_weight=meta(64), weight=meta(64, 40), weight2=meta(64, 24)))
    assert out.shape == (3, 40) and out2.shape == (3, 24) and x.shape == (3, 64)
    assert out.dtype == torch.float16


@pytest.mark.parametrize("over, pattern", [
    (dict(backend="fused"), r"backend must be one of joined, joined_ready, separate; got "
                            r"'fused'"),
    (dict(input2=f32(3, 8)), r"input2.shape\[0\] must be 2 \(input.shape\[0\]\)"),
    (dict(input2=f32(2, 8).half()), r"input2 must have dtype Float"),
    (dict(weight=f32(15, 24)), r"weight.shape\[0\] must be 16 \(input.shape\[1\]\)"),
    (dict(weight2=f32(9, 24)), r"weight2.shape\[0\] must be 8 \(input2.shape\[1\]\)"),
    (dict(weight2=f32(8, 23)), r"weight2.shape\[1\] must be 24 \(weight.shape\[1\]\)"),
    (dict(weight2=f32(8)), r"weight2 must be 2-dimensional"),
    (dict(input2=f32(2, 0), weight2=f32(0, 24)), r"empty matrices \(m=2, n=24, k=16, k2=0\)"),
    (dict(), r"input must be a CUDA tensor"),
])
def test_gemm_sum_bad_arguments(over, pattern: str) -> None:
    args = dict(input=f32(2, 16), weight=f32(16, 24), input2=f32(2, 8), weight2=f32(8, 24),
                backend="joined")
    args.update(over)
    with pytest.raises(RuntimeError, match=r"warpformer.gemm_sum: " + pattern):
        torch.ops.warpformer.gemm_sum(*args.values())


def test_gemm_sum_fake_shapes() -> None:
    s = torch.ops.warpformer.gemm_sum(meta(3, 64), meta(64, 40), meta(3, 32), meta(32, 40))
    assert s.shape == (3, 40) and s.dtype == torch.float16


def test_norm_gemm_fake_shapes() -> None:
    out, x, n = torch.ops.warpformer.norm_gemm(*norm_gemm_args(
        input=meta(3, 64), norm_weight=meta(64), weight=meta(64, 40)))
    assert out.shape == (3, 40) and x.shape == (3, 64) and n.shape == (3, 64)


def _quant_args(**over):
    """Valid gemm_quant arguments on the CPU (int4, group 32): the checks run before the device."""
    args = {"input": torch.zeros(2, 64, dtype=torch.float16),
            "weight": torch.zeros(32, 48, dtype=torch.uint8),
            "scale": torch.zeros(2, 48, dtype=torch.float16), "zero": None, "bias": None,
            "group_size": 32, "epilogue": "none", "backend": "auto"}
    args.update(over)
    return args


@pytest.mark.parametrize("over,message", [
    ({"weight": torch.zeros(32, 48, dtype=torch.int16)}, "weight must be int8 .* or uint8"),
    ({"scale": torch.zeros(2, 48)}, "scale must be float16 or bfloat16"),
    ({"weight": torch.zeros(32, 40, dtype=torch.uint8)}, "positive multiple of 16, got 40"),
    ({"group_size": 48}, "group_size must be a positive even number that divides"),
    ({"group_size": 0}, "group_size must be a positive even number"),
    ({"group_size": 7}, "group_size must be a positive even number"),
    ({"scale": torch.zeros(4, 48, dtype=torch.float16)}, r"scale.shape\[0\] must be 2"),
    ({"zero": torch.zeros(2, 48, dtype=torch.int8)}, "zero must be uint8"),
    ({"input": torch.zeros(2, 64, dtype=torch.bfloat16)}, "input must have dtype Half"),
    ({"input": torch.zeros(2, 32, dtype=torch.float16)}, r"input.shape\[1\] must be 64"),
    ({"epilogue": "bias"}, "needs a bias"),
    ({"bias": torch.zeros(48, dtype=torch.float16)}, "takes no bias"),
    ({"backend": "cublas"}, "backend must be one of auto, gemv, dequant"),
    ({"input": torch.zeros(9, 64, dtype=torch.float16), "backend": "gemv"}, "<= 8, got 9"),
    ({"weight": torch.zeros(32, 48, dtype=torch.int8),
      "scale": torch.zeros(48, dtype=torch.float16),
      "zero": torch.zeros(1, 48, dtype=torch.uint8)}, "zero must be None"),
    ({"weight": torch.zeros(64, 48, dtype=torch.int8),
      "scale": torch.zeros(2, 48, dtype=torch.float16)}, "scale must be 1-dimensional"),
])
def test_gemm_quant_argument_errors(over, message) -> None:
    with pytest.raises(RuntimeError, match=message):
        torch.ops.warpformer.gemm_quant(**_quant_args(**over))


def test_gemm_quant_valid_arguments_reach_the_device_check() -> None:
    """Everything valid on the CPU: the op's last check asks for CUDA tensors."""
    with pytest.raises(RuntimeError, match="weight must be a CUDA tensor"):
        torch.ops.warpformer.gemm_quant(**_quant_args())
    with pytest.raises(RuntimeError, match="group_size must be"):
        torch.ops.warpformer.dequantize_weight(torch.zeros(32, 48, dtype=torch.uint8),
                                               torch.zeros(2, 48, dtype=torch.float16), None, 7)


def test_gemm_quant_fakes() -> None:
    out = torch.ops.warpformer.gemm_quant(meta(3, 64), meta(32, 48, dtype=torch.uint8),
                                          meta(2, 48), None, None, 32)
    assert out.shape == (3, 48)
    dense = torch.ops.warpformer.dequantize_weight(meta(32, 48, dtype=torch.uint8), meta(2, 48),
                                                   None, 32)
    assert dense.shape == (64, 48) and dense.dtype == torch.float16
    dense8 = torch.ops.warpformer.dequantize_weight(meta(64, 48, dtype=torch.int8), meta(48))
    assert dense8.shape == (64, 48)
