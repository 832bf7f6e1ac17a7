"""Fake (meta) implementations of the ``torch.ops.warpformer`` ops.

They compute output shapes and dtypes without touching data, so ``torch.compile`` and
``torch.library.opcheck`` can trace graphs that call the CUDA ops. The real argument checks live
in C++ (``csrc/torch``); these repeat only what decides the output shape.
"""

from __future__ import annotations

import torch
from torch.library import register_fake


def _check_last_dim(t: torch.Tensor, name: str, op: str) -> int:
    torch._check(t.dim() >= 1, lambda: f"{op}: {name} must have at least 1 dimension")
    return t.shape[-1]


@register_fake("warpformer::layer_norm")
def _layer_norm_fake(input, weight, bias, eps):
    _check_last_dim(input, "input", "warpformer.layer_norm")
    return torch.empty_like(input, memory_format=torch.contiguous_format)


@register_fake("warpformer::rms_norm")
def _rms_norm_fake(input, weight, eps):
    _check_last_dim(input, "input", "warpformer.rms_norm")
    return torch.empty_like(input, memory_format=torch.contiguous_format)


@register_fake("warpformer::add_layer_norm")
def _add_layer_norm_fake(input, residual, input_bias, weight, bias, eps):
    _check_last_dim(input, "input", "warpformer.add_layer_norm")
    return torch.empty_like(input, memory_format=torch.contiguous_format)


@register_fake("warpformer::add_rms_norm")
def _add_rms_norm_fake(input, residual, input_bias, weight, eps):
    _check_last_dim(input, "input", "warpformer.add_rms_norm")
    return torch.empty_like(input, memory_format=torch.contiguous_format)


@register_fake("warpformer::bias_act")
def _bias_act_fake(input, bias, activation):
    _check_last_dim(input, "input", "warpformer.bias_act")
    return torch.empty_like(input, memory_format=torch.contiguous_format)


@register_fake("warpformer::gated_act")
def _gated_act_fake(input, bias, activation):
    cols = _check_last_dim(input, "input", "warpformer.gated_act")
    torch._check(cols % 2 == 0, lambda: "warpformer.gated_act: input's last dimension must be even")
    return input.new_empty((*input.shape[:-1], cols // 2))


@register_fake("warpformer::embedding")
def _embedding_fake(input_ids, wte, wpe=None, position_ids=None, scale=1.0, extra=None):
    return wte.new_empty((*input_ids.shape, wte.shape[1]))


@register_fake("warpformer::scatter_rows_to_columns")
def _scatter_rows_to_columns_fake(dst, src, index, base=None, skip=None, offset=0):
    return None


@register_fake("warpformer::gemm_sum")
def _gemm_sum_fake(input, weight, input2, weight2, backend="joined"):
    torch._check(input.dim() == 2, lambda: "warpformer.gemm_sum: input must be 2-dimensional")
    torch._check(weight.dim() == 2, lambda: "warpformer.gemm_sum: weight must be 2-dimensional")
    return input.new_empty((input.shape[0], weight.shape[1]))


@register_fake("warpformer::norm_gemm_pair")
def _norm_gemm_pair_fake(input, residual, input_bias, norm_weight, norm_bias, norm, eps, weight,
                         bias, activation, weight2, bias2, activation2, norm_weight2=None,
                         norm_bias2=None, backend="joined"):
    op = "warpformer.norm_gemm_pair"
    torch._check(input.dim() == 2, lambda: f"{op}: input must be 2-dimensional")
    torch._check(weight.dim() == 2, lambda: f"{op}: weight must be 2-dimensional")
    torch._check(weight2.dim() == 2, lambda: f"{op}: weight2 must be 2-dimensional")
    return (input.new_empty((input.shape[0], weight.shape[1])),
            input.new_empty((input.shape[0], weight2.shape[1])),
            torch.empty_like(input, memory_format=torch.contiguous_format))


@register_fake("warpformer::norm_gemm")
def _norm_gemm_fake(input, residual, input_bias, norm_weight, norm_bias, norm, eps, weight, bias,
                    activation, backend):
    torch._check(input.dim() == 2, lambda: "warpformer.norm_gemm: input must be 2-dimensional")
    torch._check(weight.dim() == 2, lambda: "warpformer.norm_gemm: weight must be 2-dimensional")
    out = input.new_empty((input.shape[0], weight.shape[1]))
    return out, torch.empty_like(input, memory_format=torch.contiguous_format), \
        torch.empty_like(input, memory_format=torch.contiguous_format)


@register_fake("warpformer::gemm_quant")
def _gemm_quant_fake(input, weight, scale, zero=None, bias=None, group_size=0, epilogue="none",
                     backend="auto"):
    torch._check(input.dim() == 2, lambda: "warpformer.gemm_quant: input must be 2-dimensional")
    torch._check(weight.dim() == 2, lambda: "warpformer.gemm_quant: weight must be 2-dimensional")
    return input.new_empty((input.shape[0], weight.shape[1]))


@register_fake("warpformer::dequantize_weight")
def _dequantize_weight_fake(weight, scale, zero=None, group_size=0):
    op = "warpformer.dequantize_weight"
    torch._check(weight.dim() == 2, lambda: f"{op}: weight must be 2-dimensional")
    rows = weight.shape[0] if weight.dtype == torch.int8 else 2 * weight.shape[0]
    return scale.new_empty((rows, weight.shape[1]))
