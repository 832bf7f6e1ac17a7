"""Weight-only quantized checkpoints (issue 52): from files to dense weights, and back.

:func:`warpformer.weights.stored_specs` is the file table of a quantized folder and
:mod:`warpformer.converters.quantize` the quantizer; this module joins them per tensor, for the
converter (:func:`quantize_kernel` on each full kernel before the TP split), the loader
(:func:`dequantize_weights`: the reference backend runs on the dequantized weights, the oracle
the engine's quantized kernels are checked against) and ``GPT.from_pretrained(...,
weight_quant=...)`` (:func:`resolve_request`; :func:`quantize_weights` for the engine, which
takes the stored tensors, :func:`quantize_at_load` for the reference).
"""

from __future__ import annotations

import os

import torch

from warpformer.converters.quantize import Quantized, dequantize, quantize

from .config import ConfigError, GptConfig, QuantScheme
from .weights import DTYPES, SCALE_SUFFIX, ZERO_SUFFIX, quantized_kernels, stored_specs

__all__ = ["quantize_kernel", "dequantize_weights", "quantize_at_load", "quantize_weights",
           "resolve_request"]


def quantize_kernel(config: GptConfig, name: str, tensor: torch.Tensor, input_axis: int
                    ) -> dict[str, torch.Tensor]:
    """The stored tensors of kernel ``name`` (full shape, any floating dtype; ``input_axis`` 0 for
    ``[in, *out]``, 1 for ``lm_head`` ``[V, e]``) under ``config``'s scheme: ``{name: data,
    name_scale: scale, name_zero: zero points}`` (no zero points when symmetric), full shapes of
    :func:`~warpformer.weights.stored_specs`, scales in ``config.weight_data_type``."""
    scheme = config.quant
    if scheme is None:
        raise ValueError(f"internal: {name} quantized for an unquantized config")
    kernel = tensor.movedim(input_axis, 0)
    q = quantize(kernel, scheme.mode, scheme.group_size, DTYPES[config.weight_data_type],
                 scheme.asymmetric, name)
    out = {name: q.data, name + SCALE_SUFFIX: q.scale}
    if q.zero is not None:
        out[name + ZERO_SUFFIX] = q.zero
    # Back to the tensor's own layout; int8 scales have no input axis.
    return {key: value if key == name + SCALE_SUFFIX and scheme.mode == "int8"
            else value.movedim(0, input_axis).contiguous() for key, value in out.items()}


def _dequantize_kernel(stored: dict[str, torch.Tensor], name: str, input_axis: int,
                       int8: bool, dtype: torch.dtype) -> torch.Tensor:
    def back(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.movedim(input_axis, 0)

    scale = stored[name + SCALE_SUFFIX]
    q = Quantized(back(stored[name]), scale if int8 else back(scale),
                  back(stored.get(name + ZERO_SUFFIX)))
    return dequantize(q, dtype).movedim(0, input_axis)


def dequantize_weights(config: GptConfig, stored: dict[str, torch.Tensor], dtype: torch.dtype
                       ) -> dict[str, torch.Tensor]:
    """Full stored tensors (:func:`~warpformer.weights.stored_specs` names and shapes) -> the
    dense weights of :func:`~warpformer.weights.weight_specs`, each quantized kernel as
    ``(q - zero) * scale`` computed in fp32 and cast to ``dtype``; other tensors as given."""
    kernels = quantized_kernels(config)
    int8 = config.weight_quant == "int8"
    dense = {}
    for name, tensor in stored.items():
        base = name.removesuffix(SCALE_SUFFIX).removesuffix(ZERO_SUFFIX)
        if base != name and base in kernels:
            continue
        dense[name] = (_dequantize_kernel(stored, name, kernels[name], int8, dtype)
                       if name in kernels else tensor)
    return dense


def quantize_at_load(config: GptConfig, weights: dict[str, torch.Tensor], scheme: QuantScheme,
                     dtype: torch.dtype) -> tuple[GptConfig, dict[str, torch.Tensor]]:
    """Quantize a dense fp16/bf16 folder's full weights (``load_merged_weights``, file dtype) as
    ``warpformer convert --weight-quant`` would and return ``(config with the scheme, dequantized
    weights in dtype)``: the reference backend's weights."""
    quantized, stored = quantize_weights(config, weights, scheme)
    dense = dequantize_weights(quantized, stored, dtype)
    return quantized, {name: t.to(dtype) for name, t in dense.items()}


def quantize_weights(config: GptConfig, weights: dict[str, torch.Tensor], scheme: QuantScheme,
                     device: torch.device | str | None = None
                     ) -> tuple[GptConfig, dict[str, torch.Tensor]]:
    """``(config with the scheme, the stored tensors)`` of full dense weights quantized as the
    converter would (:func:`~warpformer.weights.stored_specs` names and shapes; the engine's input
    at one rank), each tensor moved to ``device`` first when given (quantizing on the GPU from a
    CPU copy holds one dense tensor there at a time). A tied head quantized (``scheme.lm_head``)
    becomes its own ``lm_head.weight``, as the converter writes it."""
    quantized = config.with_quant(scheme)
    stored_specs(quantized)  # the group-size rule, naming the tensor
    weights = dict(weights)
    if scheme.lm_head and "lm_head.weight" not in weights:
        weights["lm_head.weight"] = weights["wte"]
    stored: dict[str, torch.Tensor] = {}
    kernels = quantized_kernels(quantized)
    for name, tensor in weights.items():
        if device is not None:
            tensor = tensor.to(device)
        if name in kernels:
            stored.update(quantize_kernel(quantized, name, tensor, kernels[name]))
        else:
            stored[name] = tensor
    return quantized, stored


def resolve_request(path: os.PathLike[str] | str, config: GptConfig,
                    weight_quant: str | QuantScheme | None) -> QuantScheme | None:
    """What ``from_pretrained(weight_quant=...)`` asks of the folder at ``path``: the scheme to
    quantize with at load, or ``None`` (load as stored). ``ValueError`` for an unknown value, a
    request that disagrees with a quantized folder (a mode string compares the mode only, a
    :class:`QuantScheme` every field), or quantizing an fp32 folder."""
    try:
        scheme = QuantScheme.parse(weight_quant)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    stored = config.quant
    if scheme is None:
        return None
    if stored is not None:
        same = (scheme.mode == stored.mode if isinstance(weight_quant, str) else scheme == stored)
        if not same:
            raise ValueError(
                f"weight_quant={weight_quant!r} but {path} holds {_describe(stored)} weights "
                f"(config.ini weight_quant = {config.weight_quant}); pass weight_quant=None to "
                "load them as stored, or convert the fp16/bf16 checkpoint again with the scheme "
                "you want")
        return None
    if config.weight_data_type not in ("fp16", "bf16"):
        raise ValueError(
            f"weight_quant={weight_quant!r} quantizes an fp16 or bf16 folder (its scales are in "
            f"that compute dtype); {path} holds {config.weight_data_type} weights: convert with "
            "--data-type fp16 or bf16 (optionally with --weight-quant)")
    try:
        stored_specs(config.with_quant(scheme))
    except ConfigError as exc:
        raise ValueError(f"weight_quant={weight_quant!r}: {exc}") from None
    return scheme


def _describe(scheme: QuantScheme) -> str:
    if scheme.mode == "int8":
        return "int8 (per-channel)"
    return (f"int4 (group {scheme.group_size}"
            + (", asymmetric" if scheme.asymmetric else "") + ")")
