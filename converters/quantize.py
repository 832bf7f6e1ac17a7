"""Weight-only quantizer (``warpformer.converters.quantize``): plain PyTorch, any device.

Every function takes a linear kernel laid out ``[in, *out]`` (input features on axis 0, as the
on-disk format stores ``y = x @ W``; QKV's ``[h, 3, h]`` has ``out = (3, h)``). Two formats
(``docs/FORMAT.md``, "Weight-only quantized"):

* **int8**, per output channel, symmetric (FasterTransformer's ``int8_mode = 1``): one scale per
  output column, ``scale = max_k |w[k, n]| / 127``; ``q = clamp(round(w / scale), -127, 127)``
  stored as int8 ``[in, *out]``; scales ``[*out]``.
* **int4**, group-wise along the input axis (``group_size`` consecutive input rows share a scale):
  symmetric ``scale = max |w| / 7``, ``q = clamp(round(w / scale), -7, 7)``, or asymmetric over
  ``[min(w_min, 0), max(w_max, 0)]``: ``scale = (hi - lo) / 15``, integer zero point
  ``z = round(-lo / scale)`` in ``[0, 15]``, ``q = clamp(round(w / scale) + z, 0, 15)``; scales
  (and zero points, uint8) ``[in / group_size, *out]``. Two values share a byte, packed along the
  input axis: byte ``[j, n]`` holds input row ``2j`` in bits 0-3 and row ``2j + 1`` in bits 4-7,
  so the packed tensor is uint8 ``[in / 2, *out]`` (symmetric nibbles are two's complement).

Rounding is to nearest (ties to even). Scales are computed in fp32 and stored in ``scale_dtype``
(the compute dtype), rounded *up* where that dtype cannot hold the exact value, so that the
largest weight still maps inside the integer range; every weight then dequantizes within half a
step (its group's stored scale) of its value. A scale of 0 marks an all-zero column or group.
Dequantization computes ``(q - z) * scale`` in fp32 and casts once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["MODES", "Quantized", "quantize", "dequantize", "quantize_int8", "dequantize_int8",
           "quantize_int4", "dequantize_int4", "pack_int4", "unpack_int4"]

MODES = ("int8", "int4")
_INT8_MAX = 127
_INT4_MAX = 7      # symmetric: [-7, 7], as int8 uses [-127, 127]
_INT4_LEVELS = 15  # asymmetric: [0, 15]
_BITS = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


@dataclass(frozen=True)
class Quantized:
    """One quantized kernel.

    Attributes:
        data: int8 ``[in, *out]`` (int8) or uint8 ``[in / 2, *out]`` (int4, packed).
        scale: ``[*out]`` (int8) or ``[in / group_size, *out]`` (int4), in the scale dtype.
        zero: uint8 zero points shaped like ``scale`` (asymmetric int4), else ``None``.
    """

    data: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor | None = None

    @property
    def mode(self) -> str:
        """``"int8"`` or ``"int4"``."""
        return "int8" if self.data.dtype == torch.int8 else "int4"


def _check_input(w: torch.Tensor, name: str) -> torch.Tensor:
    if not w.is_floating_point() or w.dim() < 2:
        raise ValueError(f"{name}: expected a floating kernel [in, *out], got {w.dtype} "
                         f"{list(w.shape)}")
    w = w.float()
    if not bool(torch.isfinite(w).all()):
        raise ValueError(f"{name}: holds NaN or inf values; they cannot be quantized")
    return w


def _storable_scale(scale: torch.Tensor, dtype: torch.dtype, name: str) -> torch.Tensor:
    """``scale`` (fp32, >= 0) in ``dtype``, rounded up to the next representable value where the
    cast rounded it down (a positive float's successor is its bit pattern plus one)."""
    if dtype not in _BITS:
        raise ValueError(f"{name}: scale dtype must be float32, float16 or bfloat16, got {dtype}")
    stored = scale.to(dtype)
    low = stored.float() < scale
    if bool(low.any()):
        bits = stored.view(_BITS[dtype]).clone()
        bits[low] += 1
        stored = bits.view(dtype)
    if not bool(torch.isfinite(stored).all()):
        raise ValueError(f"{name}: a scale overflows {dtype} (weights up to "
                         f"{float(scale.max()):.4g} times the integer range)")
    return stored


def _over(x: torch.Tensor, k: int) -> torch.Tensor:
    """``x / k`` as an element-wise division by a tensor: CUDA divides by a Python scalar as a
    multiplication by its reciprocal, which rounds some quotients differently from the CPU, and
    the quantizer must give the same bytes on every device (the converter quantizes on the CPU,
    ``from_pretrained(weight_quant=...)`` on the GPU)."""
    return x / torch.full_like(x, k)


def _divide(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``w / scale`` with 0 where the scale is 0 (an all-zero column or group)."""
    return w / torch.where(scale == 0, torch.ones_like(scale), scale)


def quantize_int8(w: torch.Tensor, scale_dtype: torch.dtype = torch.float16,
                  name: str = "weight") -> Quantized:
    """Per-output-channel symmetric int8 of ``w`` ``[in, *out]`` (any floating dtype): data int8
    ``[in, *out]``, scale ``[*out]`` in ``scale_dtype``. ``name`` is used in error messages."""
    w = _check_input(w, name)
    scale = _storable_scale(_over(w.abs().amax(dim=0), _INT8_MAX), scale_dtype, name)
    q = torch.round(_divide(w, scale.float())).clamp_(-_INT8_MAX, _INT8_MAX)
    return Quantized(q.to(torch.int8), scale)


def dequantize_int8(data: torch.Tensor, scale: torch.Tensor,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``data`` int8 ``[in, *out]`` times ``scale`` ``[*out]`` -> ``[in, *out]`` in ``dtype``."""
    if data.dtype != torch.int8 or tuple(scale.shape) != tuple(data.shape[1:]):
        raise ValueError(f"int8 data {data.dtype} {list(data.shape)} and scale "
                         f"{list(scale.shape)} do not form an int8 kernel (scale = data.shape[1:])")
    return (data.float() * scale.float()).to(dtype)


def pack_int4(nibbles: torch.Tensor) -> torch.Tensor:
    """Integer ``[in, *out]`` with values in ``[0, 15]`` (``in`` even) -> uint8 ``[in / 2, *out]``:
    row ``2j`` in the low nibble, row ``2j + 1`` in the high nibble of byte row ``j``."""
    if nibbles.shape[0] % 2:
        raise ValueError(f"int4 packing needs an even input width, got {nibbles.shape[0]}")
    n = nibbles.to(torch.uint8)
    return n[0::2] | (n[1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 ``[in / 2, *out]`` -> uint8 nibbles ``[in, *out]`` in ``[0, 15]`` (inverse of
    :func:`pack_int4`)."""
    if packed.dtype != torch.uint8:
        raise ValueError(f"packed int4 data must be uint8, got {packed.dtype}")
    return torch.stack((packed & 0x0F, packed >> 4), dim=1).reshape(
        2 * packed.shape[0], *packed.shape[1:])


def quantize_int4(w: torch.Tensor, group_size: int = 128,
                  scale_dtype: torch.dtype = torch.float16, asymmetric: bool = False,
                  name: str = "weight") -> Quantized:
    """Group-wise int4 of ``w`` ``[in, *out]`` along the input axis: data uint8
    ``[in / 2, *out]`` (packed), scale ``[in / group_size, *out]`` in ``scale_dtype``, zero points
    uint8 of the scale's shape when ``asymmetric``. ``group_size`` must be even and divide
    ``in``."""
    w = _check_input(w, name)
    width = w.shape[0]
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2 \
            or group_size % 2:
        raise ValueError(f"{name}: int4 group size must be an even integer >= 2, got "
                         f"{group_size!r}")
    if width % group_size:
        raise ValueError(f"{name}: int4 group size {group_size} does not divide the input width "
                         f"{width}")
    groups = w.reshape(width // group_size, group_size, *w.shape[1:])
    if asymmetric:
        lo = groups.amin(dim=1).clamp(max=0)
        hi = groups.amax(dim=1).clamp(min=0)
        scale = _storable_scale(_over(hi - lo, _INT4_LEVELS), scale_dtype, name)
        step = scale.float()
        zero = torch.round(_divide(-lo, step)).clamp_(0, _INT4_LEVELS)
        q = torch.round(_divide(groups, step[:, None])) + zero[:, None]
        q = q.clamp_(0, _INT4_LEVELS).reshape(w.shape)
        return Quantized(pack_int4(q), scale, zero.to(torch.uint8))
    scale = _storable_scale(_over(groups.abs().amax(dim=1), _INT4_MAX), scale_dtype, name)
    q = torch.round(_divide(groups, scale.float()[:, None])).clamp_(-_INT4_MAX, _INT4_MAX)
    return Quantized(pack_int4(q.reshape(w.shape).to(torch.int8) & 0x0F), scale)


def dequantize_int4(data: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None = None,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Packed uint8 ``data`` ``[in / 2, *out]``, ``scale`` ``[in / G, *out]`` (and uint8
    ``zero`` of the same shape if asymmetric) -> ``[in, *out]`` in ``dtype``; ``G`` follows from
    the shapes."""
    nibbles = unpack_int4(data)
    width = nibbles.shape[0]
    if (scale.dim() != data.dim() or tuple(scale.shape[1:]) != tuple(data.shape[1:])
            or scale.shape[0] == 0 or width % scale.shape[0]
            or (zero is not None and zero.shape != scale.shape)):
        raise ValueError(f"int4 data {list(data.shape)}, scale {list(scale.shape)} and zero "
                         f"{None if zero is None else list(zero.shape)} do not form an int4 "
                         "kernel (scale [in / G, *out], zero as scale)")
    group = width // scale.shape[0]
    if zero is None:
        q = ((nibbles.to(torch.int8) ^ 8) - 8).float()  # two's complement nibble
    else:
        q = nibbles.float() - zero.float().repeat_interleave(group, dim=0)
    return (q * scale.float().repeat_interleave(group, dim=0)).to(dtype)


def quantize(w: torch.Tensor, mode: str, group_size: int = 128,
             scale_dtype: torch.dtype = torch.float16, asymmetric: bool = False,
             name: str = "weight") -> Quantized:
    """:func:`quantize_int8` or :func:`quantize_int4` by ``mode`` (``group_size`` and
    ``asymmetric`` apply to int4 only)."""
    if mode == "int8":
        if asymmetric:
            raise ValueError("int8 weight-only quantization is symmetric; asymmetric (zero "
                             "points) applies to int4 only")
        return quantize_int8(w, scale_dtype, name)
    if mode == "int4":
        return quantize_int4(w, group_size, scale_dtype, asymmetric, name)
    raise ValueError(f"weight quantization must be one of {', '.join(MODES)}, got {mode!r}")


def dequantize(q: Quantized, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The kernel ``[in, *out]`` that ``q`` stands for, in ``dtype``."""
    if q.mode == "int8":
        return dequantize_int8(q.data, q.scale, dtype)
    return dequantize_int4(q.data, q.scale, q.zero, dtype)
