"""Weight table and loader for a converted ``<tp>-gpu/`` directory.

:func:`weight_specs` gives which files a config implies, their full (unsplit) shapes and the axis
that tensor parallelism splits, from the engine's own table (csrc/models/gpt/gpt_weights.h); the
converters' writer, this loader and :mod:`warpformer.reference` use it. File naming:
``model.<name>.bin`` for replicated tensors, ``model.<name>.<tp_rank>.bin`` for split ones;
headerless little-endian C-order arrays of ``weight_data_type`` (bf16 files hold raw bf16 bits).
A weight-only quantized folder (``weight_quant`` in ``config.ini``) stores each layer's linear
kernels as int8 or packed int4 files with scale (and zero-point) files beside them:
:func:`stored_specs` is its file table.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .config import ConfigError, GptConfig, local_vocab

__all__ = [
    "WeightSpec",
    "WeightFileError",
    "DTYPES",
    "STORAGE_DTYPES",
    "weight_specs",
    "quantized_kernels",
    "stored_specs",
    "expected_shapes",
    "file_name",
    "resolve_model_dir",
    "read_config",
    "stage_layers",
    "load_weights",
    "load_merged_weights",
]

DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}
# Files' element types: DTYPES plus the quantized kernels' (int8 data; packed int4, zero points).
STORAGE_DTYPES: dict[str, torch.dtype] = {**DTYPES, "int8": torch.int8, "uint8": torch.uint8}


class WeightFileError(RuntimeError):
    """A weight file is missing or its size disagrees with ``config.ini``."""


@dataclass(frozen=True)
class WeightSpec:
    """One tensor of the on-disk format.

    ``shape`` is the full, unsplit shape; ``split_axis`` the axis divided among tensor-parallel
    ranks (``None``: replicated, one file without rank suffix). ``layer`` is the global layer
    index or ``None`` for model-level tensors; ``stage`` says which pipeline stage needs a
    model-level tensor: ``"first"``, ``"last"`` or ``"first+last"``. ``optional`` tensors may be
    absent (only ``lm_head.weight``: absent means tied to ``wte``). ``per_rank``: a replicated
    tensor written whole once per rank, with the rank suffix (FT's BART layout names its
    row-parallel biases that way). ``dtype``: the file's element type, a key of
    :data:`STORAGE_DTYPES`; empty means the folder's ``weight_data_type``.
    """

    shape: tuple[int, ...]
    split_axis: int | None = None
    layer: int | None = None
    stage: str = ""
    optional: bool = False
    per_rank: bool = False
    dtype: str = ""

    @property
    def ranked(self) -> bool:
        """Whether the files carry a rank suffix (one file per tensor-parallel rank)."""
        return self.split_axis is not None or self.per_rank

    def shard_shape(self, tensor_para_size: int) -> tuple[int, ...]:
        """Shape of one rank's file."""
        if self.split_axis is None:
            return self.shape
        shape = list(self.shape)
        shape[self.split_axis] //= tensor_para_size
        return tuple(shape)


def weight_specs(config: GptConfig) -> dict[str, WeightSpec]:
    """Every tensor ``config`` implies, keyed by on-disk name without ``model.``/rank/``.bin``.

    Example key: ``layers.0.attention.query_key_value.weight`` -> shape ``[h, 3, h]`` split on
    axis -1 (stored per rank as ``[h, 3, h/tp]``: all Q heads, then K, then V). The table is the
    engine's own (``torch.ops.warpformer.gpt_weight_table``, csrc/models/gpt/gpt_weights.h), so
    the converters, this loader, the reference backend and the engine's checks cannot disagree.
    """
    if config.quant is not None:
        config = config.without_quant()
    return _engine_table(config)


def _engine_table(config: GptConfig) -> dict[str, WeightSpec]:
    """The engine's weight table for ``config`` (its stored form when quantized)."""
    try:
        table = json.loads(torch.ops.warpformer.gpt_weight_table(config.to_json()))
    except RuntimeError as exc:  # the table's rules (an int4 group per rank) as a config error
        raise ConfigError(str(exc).splitlines()[0]) from None
    return table_specs(table)


def table_specs(table: list[dict]) -> dict[str, WeightSpec]:
    """``{name: WeightSpec}`` of an engine weight table's JSON entries (any family's:
    csrc/models/weight_table.h)."""
    return {e["name"]: WeightSpec(tuple(e["shape"]), e["split"], e["layer"], e["stage"],
                                  e["optional"], e["per_rank"], e["dtype"] or "") for e in table}


# Suffixes of a quantized kernel's companion files: model.<name>_scale / _zero.
SCALE_SUFFIX, ZERO_SUFFIX = "_scale", "_zero"


def quantized_kernels(config: GptConfig) -> dict[str, int]:
    """``{name: input axis}`` of the tensors ``config.weight_quant`` quantizes: every layer's
    linear kernel (``[in, *out]``, input axis 0: QKV, attention dense, MLP in and out) and, with
    ``quant_lm_head``, ``lm_head.weight`` (``[V, e]``, input axis 1). Empty when unquantized."""
    if config.quant is None:
        return {}
    return {name: 1 if name == "lm_head.weight" else 0
            for name, spec in stored_specs(config).items()
            if spec.dtype in ("int8", "uint8") and not name.endswith(ZERO_SUFFIX)}


def stored_specs(config: GptConfig) -> dict[str, WeightSpec]:
    """The files of a converted folder: :func:`weight_specs`, where ``config.weight_quant`` is set
    each quantized kernel ``K`` ``[in, *out]`` (input axis 0; ``lm_head`` ``[V, e]`` has it last)
    becomes ``K`` (int8 ``[in, *out]``, or uint8 ``[in/2, *out]`` packing int4 along the input
    axis), ``K_scale`` (``[*out]`` for int8, ``[in/G, *out]`` for int4, in the compute dtype) and,
    for asymmetric int4, ``K_zero`` (uint8, as the scales). Data and int4 scales split as the
    kernel; int8 scales of a row-parallel kernel are replicated (whole columns). The engine's
    table (csrc/models/gpt/gpt_weights.h), like :func:`weight_specs`.

    Raises :class:`~warpformer.config.ConfigError` naming the tensor, its input width per rank and
    the group size when an int4 group would not fit in a rank's rows (or the width at all).
    """
    return _engine_table(config) if config.quant is not None else weight_specs(config)


def expected_shapes(config: GptConfig) -> dict[str, tuple[int, ...]]:
    """Per-rank file shapes for ``config`` (``tensor_para_size`` ranks), keyed like
    :func:`weight_specs`. Optional entries (``lm_head.weight``) are included."""
    tp = config.tensor_para_size
    return {name: spec.shard_shape(tp) for name, spec in weight_specs(config).items()}


def file_name(name: str, spec: WeightSpec, tp_rank: int, prefix: str = "model.") -> str:
    """On-disk file name of tensor ``name`` for ``tp_rank`` (FT's GPT files start with
    ``model.``; its T5 files have no prefix)."""
    if not spec.ranked:
        return f"{prefix}{name}.bin"
    return f"{prefix}{name}.{tp_rank}.bin"


def resolve_model_dir(model_dir: str | os.PathLike[str]) -> Path:
    """The folder holding ``config.ini``: ``model_dir`` itself, or its single ``<N>-gpu`` child."""
    path = Path(model_dir)
    if (path / "config.ini").is_file():
        return path
    children = sorted(p for p in path.glob("*-gpu") if re.fullmatch(r"\d+-gpu", p.name))
    if len(children) == 1 and (children[0] / "config.ini").is_file():
        return children[0]
    if len(children) > 1:
        names = ", ".join(c.name for c in children)
        raise WeightFileError(f"{path} holds several converted sizes ({names}); pass one of them")
    raise WeightFileError(f"{path}: no config.ini (expected a converted '<tp>-gpu' directory)")


def read_config(model_dir: str | os.PathLike[str]) -> GptConfig:
    """Read the ``GptConfig`` of a converted directory (see :func:`resolve_model_dir`)."""
    return GptConfig.from_ini(resolve_model_dir(model_dir) / "config.ini")


def stage_layers(num_layer: int, pp_rank: int, pipeline_para_size: int) -> range:
    """Contiguous global layer range of pipeline stage ``pp_rank``."""
    if pipeline_para_size <= 0 or not 0 <= pp_rank < pipeline_para_size:
        raise ValueError(f"pp_rank ({pp_rank}) must be in [0, pipeline_para_size "
                         f"({pipeline_para_size}))")
    if num_layer % pipeline_para_size:
        raise ValueError(f"num_layer ({num_layer}) must be divisible by pipeline_para_size "
                         f"({pipeline_para_size})")
    per = num_layer // pipeline_para_size
    return range(pp_rank * per, (pp_rank + 1) * per)


def _read_raw(path: Path, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    if dtype == torch.bfloat16:
        raw = np.fromfile(path, dtype="<i2")
        return torch.from_numpy(raw).view(torch.bfloat16).reshape(shape)
    np_dtype = {torch.float32: "<f4", torch.float16: "<f2", torch.int8: "i1",
                torch.uint8: "u1"}[dtype]
    return torch.from_numpy(np.fromfile(path, dtype=np_dtype)).reshape(shape)


def load_weights(
    model_dir: str | os.PathLike[str],
    tp_rank: int = 0,
    pp_rank: int = 0,
    pipeline_para_size: int = 1,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
) -> dict[str, torch.Tensor]:
    """Load one (tp_rank, pp_rank)'s tensors of a converted directory.

    Returns ``{name: tensor}`` with names as in :func:`weight_specs` (global layer indices), each
    tensor of its per-rank shape (e.g. QKV ``[h, 3, h/tp]``), cast to ``dtype`` (default: the file
    dtype) on ``device``. With pipeline parallelism only this stage's layer range is read, plus the
    embeddings (``wte``, ``wpe``, ``project_in``, ``pre_decoder_layernorm``) on the first stage and
    ``final_layernorm``/``project_out``/``lm_head`` on the last; the last stage also gets ``wte``
    when the head is tied to it. Every file's byte size is checked against the config before
    anything is read; a missing or mis-sized file raises :class:`WeightFileError` naming it.
    Without tensor parallelism ``wte`` and ``lm_head.weight`` are views of the first ``V`` rows of
    zero-padded buffers of a multiple of 8 rows, which the engine's lm_head uses in place.
    A quantized folder gives its files as stored (:func:`stored_specs`): int8 / packed-int4
    uint8 kernels and zero points keep their integer dtype, scales are cast like every floating
    tensor; :func:`load_merged_weights` dequantizes.
    """
    root = resolve_model_dir(model_dir)
    config = GptConfig.from_ini(root / "config.ini")
    tp = config.tensor_para_size
    if not 0 <= tp_rank < tp:
        raise ValueError(f"tp_rank ({tp_rank}) must be in [0, tensor_para_size ({tp}))")
    layers = stage_layers(config.num_layer, pp_rank, pipeline_para_size)
    first, last = pp_rank == 0, pp_rank == pipeline_para_size - 1
    file_dtype = DTYPES[config.weight_data_type]

    try:
        specs = stored_specs(config)
    except ConfigError as exc:
        raise ConfigError(f"{root / 'config.ini'}: {exc}") from None
    tied = not (root / file_name("lm_head.weight", specs["lm_head.weight"], tp_rank)).exists()
    plan: list[tuple[str, Path, tuple[int, ...]]] = []
    for name, spec in specs.items():
        if spec.layer is not None:
            wanted = spec.layer in layers
        elif name == "wte":
            wanted = first or (last and tied)
        else:
            wanted = (first and "first" in spec.stage) or (last and "last" in spec.stage)
        if not wanted or (spec.optional and tied):
            continue
        plan.append((name, root / file_name(name, spec, tp_rank), spec.shard_shape(tp)))

    for name, path, shape in plan:  # verify everything before reading anything
        kind = specs[name].dtype or config.weight_data_type
        expected = int(np.prod(shape)) * STORAGE_DTYPES[kind].itemsize
        if not path.is_file():
            raise WeightFileError(
                f"missing weight file {path} (tensor {name}, shape {list(shape)} "
                f"{kind}, {expected} bytes expected)"
            )
        actual = path.stat().st_size
        if actual != expected:
            raise WeightFileError(
                f"weight file {path} has {actual} bytes, expected {expected} "
                f"(shape {list(shape)} {kind} per config.ini)"
            )

    _check_no_extra_layers(root, config)
    out: dict[str, torch.Tensor] = {}
    for name, path, shape in plan:
        stored = specs[name].dtype
        tensor = _read_raw(path, STORAGE_DTYPES[stored] if stored else file_dtype, shape)
        if config.row_parallel_bias_divided and _is_row_parallel_bias(name, specs):
            tensor = (tensor.float() * tp).to(file_dtype)  # FT stored bias / tp: undo it
        to = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
        # One GPU's head multiplies local_vocab rows; tensor-parallel ranks copy their padded
        # slice of it whatever they are given (a quantized head is not the engine's yet).
        rows = (local_vocab(config.vocab_size)
                if tp == 1 and name in _VOCAB_ROW_TENSORS and not stored else 0)
        out[name] = (_in_padded_rows(tensor, rows, to, device) if rows > shape[0]
                     else tensor.to(dtype=to, device=device))
    _check_finite(out, {name: path for name, path, _ in plan},
                  "" if dtype in (None, file_dtype) else f" after the cast to {dtype}")
    return out


def _is_row_parallel_bias(name: str, specs: dict[str, WeightSpec]) -> bool:
    """Whether ``name`` is the bias of a row-parallel product (its weight split on axis 0)."""
    if not name.endswith(".bias"):
        return False
    weight = specs.get(name[: -len("bias")] + "weight")
    return weight is not None and weight.split_axis == 0


_LAYER_FILE = re.compile(r"model\.layers\.(\d+)\.")


def _check_no_extra_layers(root: Path, config: GptConfig) -> None:
    """Files of layers past ``num_layer`` mean a config.ini that does not describe the folder
    (a truncated or edited ``num_layer``): refuse rather than run fewer layers silently."""
    extra = sorted({int(m.group(1)) for p in root.iterdir()
                    if (m := _LAYER_FILE.match(p.name)) and int(m.group(1)) >= config.num_layer})
    if extra:
        shown = ", ".join(map(str, extra[:5])) + (", ..." if len(extra) > 5 else "")
        raise WeightFileError(f"{root} holds weight files of layer(s) {shown}, but config.ini "
                              f"says num_layer = {config.num_layer}; fix num_layer or remove "
                              "those files")


def _check_finite(tensors: dict[str, torch.Tensor], paths: dict[str, Path], cast: str) -> None:
    """Raise naming the first file whose tensor holds NaN or inf. Each tensor's min and max are
    reduced where it lives (NaN propagates into both, inf shows in one; no tensor-sized
    temporary) and read back with a single host sync: milliseconds for a 6B model on a GPU."""
    names = [n for n, t in tensors.items() if t.numel()]
    if not names:
        return
    ends = torch.stack([torch.stack(torch.aminmax(tensors[n])).float() for n in names])
    flags = torch.isfinite(ends).all(dim=1).cpu()
    bad = [n for n, ok in zip(names, flags.tolist(), strict=True) if not ok]
    if bad:
        t = tensors[bad[0]]
        count = int((~torch.isfinite(t)).sum())
        raise WeightFileError(f"weight file {paths[bad[0]]} (tensor {bad[0]}) holds {count} "
                              f"non-finite value(s) (NaN or inf){cast}"
                              + (f"; {len(bad) - 1} more file(s) too" if len(bad) > 1 else ""))


# The tensors with one row per vocabulary entry, which load_weights pads (_in_padded_rows).
_VOCAB_ROW_TENSORS = ("wte", "lm_head.weight")


def _in_padded_rows(tensor: torch.Tensor, rows: int, dtype: torch.dtype,
                    device: str | torch.device) -> torch.Tensor:
    """``tensor`` ``[V, e]`` cast to ``dtype`` on ``device`` as the first ``V`` of ``rows`` zeroed
    rows: still shape ``[V, e]``, but the CUDA engine finds the padding rows in its storage and
    multiplies its lm_head at that width in place (an odd width such as GPT-2's 50,257 runs about
    6x slower past 8 rows) instead of copying it."""
    buffer = torch.zeros((rows, *tensor.shape[1:]), dtype=dtype, device=device)
    buffer[: tensor.shape[0]].copy_(tensor)
    return buffer[: tensor.shape[0]]


def load_merged_weights(
    model_dir: str | os.PathLike[str],
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    dequantize: bool = True,
) -> tuple[GptConfig, dict[str, torch.Tensor]]:
    """Load every rank of a converted directory and concatenate split tensors back to their full
    shapes (:func:`weight_specs`, e.g. QKV ``[h, 3, h]``). Returns ``(config, weights)``, the
    tensors cast to ``dtype`` (default: the file dtype) on ``device``. A quantized folder's
    kernels are dequantized (``(q - zero) * scale`` in fp32, then cast to ``dtype``), unless
    ``dequantize`` is false: then the full stored tensors of :func:`stored_specs` come back."""
    config = read_config(model_dir)
    specs = stored_specs(config)
    shards = [load_weights(model_dir, r, dtype=dtype, device=device)
              for r in range(config.tensor_para_size)]
    merged: dict[str, torch.Tensor] = {}
    for name, tensor in shards[0].items():
        axis = specs[name].split_axis
        merged[name] = tensor if axis is None else torch.cat([s[name] for s in shards], dim=axis)
    if dequantize and config.quant is not None:
        from .weight_quant import dequantize_weights

        target = dtype if dtype is not None else DTYPES[config.weight_data_type]
        merged = dequantize_weights(config, merged, target)
    return config, merged
