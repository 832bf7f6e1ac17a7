"""Weight table and loader of FT's encoder-decoder layouts (T5 family, BART family).

:func:`t5_weight_specs` lists every tensor a :class:`~warpformer.t5_config.T5Config` implies with
its full (unsplit) shape and tensor-parallel split axis; names are FT's file names without the
rank suffix and ``.bin``: ``<name>.bin`` for replicated tensors, ``<name>.<tp_rank>.bin`` for split
ones and for BART's row-parallel biases (no ``model.`` prefix, unlike the GPT layout). Files are
headerless little-endian C-order arrays of ``weight_data_type``. :func:`model_names` and
:func:`layer_names` map a tensor's role to the family's file name (FT's
``huggingface_t5_ckpt_convert`` / ``huggingface_bart_convert``); the converters,
:func:`load_t5_weights` and :mod:`warpformer.reference_seq2seq` share them. All three read the
engine's own table (``torch.ops.warpformer.t5_weight_table``, csrc/models/t5/t5_weights.h), which
gives each file its role and stack, so the format exists once, in C++.
"""

from __future__ import annotations

import functools
import json
import os
import re

import numpy as np
import torch

from .config import ConfigError
from .t5_config import T5Config
from .weights import (
    DTYPES,
    WeightFileError,
    WeightSpec,
    _read_raw,
    file_name,
    resolve_model_dir,
    table_specs,
)

__all__ = ["t5_weight_specs", "t5_file_name", "read_t5_config", "load_t5_weights",
           "load_merged_t5_weights", "model_names", "layer_names", "bias_name", "EMBEDDING",
           "LM_HEAD", "STACKS"]

EMBEDDING = "shared.weight_T"  # [V, d]: FT's name for the T5 embedding rows (HF's layout)
LM_HEAD = "lm_head.weight"  # [V, d]
STACKS = ("encoder", "decoder")


@functools.lru_cache(maxsize=64)
def _engine_table(config_json: str) -> tuple[dict, ...]:
    """The engine's table for a :meth:`T5Config.to_json` text (cached: the reference asks for a
    layer's names at every step)."""
    try:
        return tuple(json.loads(torch.ops.warpformer.t5_weight_table(config_json)))
    except RuntimeError as exc:  # the engine's config rules, as a config error
        raise ConfigError(str(exc).splitlines()[0]) from None


def _is_bias(entry: dict, roles: set[tuple[str, int | None, str]]) -> bool:
    """Whether ``entry`` is the bias beside another entry's weight (role ``<weight role>_bias``;
    ``logits_bias`` is a tensor of its own)."""
    role = entry["role"]
    return role.endswith("_bias") and (entry["stack"], entry["layer"], role[:-5]) in roles


def _named(config: T5Config) -> list[dict]:
    """The table's weights (biases left out: :func:`bias_name` finds them)."""
    table = _engine_table(config.to_json())
    roles = {(e["stack"], e["layer"], e["role"]) for e in table}
    return [e for e in table if not _is_bias(e, roles)]


def model_names(config: T5Config) -> dict[str, str]:
    """Model-level role -> file name. Roles: ``{stack}_embedding`` (``[V, d]``, the two T5 stacks
    share one file, the table's role ``embedding``), ``{stack}_positions`` (T5: relative bias
    table ``[n, B]``; BART: learned table ``[P, d]``), ``{stack}_embedding_norm`` (BART's
    ``layernorm_embedding``, which FT names ``final_layer_norm``), ``{stack}_final_norm`` (T5,
    mBART), ``lm_head``, ``logits_bias`` (BART's ``final_logits_bias``)."""
    names = {}
    for e in _named(config):
        if e["stack"]:
            continue
        if e["role"] == "embedding":  # T5's one table serves both stacks
            names.update({f"{s}_embedding": e["name"] for s in STACKS})
        else:
            names[e["role"]] = e["name"]
    return names


def layer_names(config: T5Config, stack: str, i: int) -> dict[str, str]:
    """Role -> file name of layer ``i`` of ``stack``. Roles: ``self_norm``, ``self_q``/``k``/``v``
    (encoder) or ``self_qkv`` (decoder, fused ``[d, 3, inner]``), ``self_o``; decoder only:
    ``cross_norm``, ``cross_q``/``k``/``v``, ``cross_o``; ``ffn_norm``, ``ffn_in``,
    ``ffn_gate`` (gated FFN only), ``ffn_out``. Norms sit before (pre-LN) or after (post-LN) the
    sublayer of the same prefix."""
    return {e["role"]: e["name"] for e in _named(config)
            if e["stack"] == stack and e["layer"] == i}


def bias_name(name: str) -> str:
    """The bias file beside weight ``name`` (BART: every projection and LayerNorm has one)."""
    return name[: -len("weight")] + "bias"


def t5_weight_specs(config: T5Config) -> dict[str, WeightSpec]:
    """Every tensor of ``config``'s layout, keyed by FT file name without rank and ``.bin``.

    Linear kernels are ``[in, out]``; embeddings, ``lm_head`` and BART's position tables are
    ``[rows, d]``. Split as FT does: Q, K, V and the FFN input on their output axis (heads / FFN
    columns), the attention output and FFN output on their input axis (rows); T5's relative
    attention bias tables ``[heads, buckets]`` on heads; embeddings, ``lm_head``, norms and
    position tables replicated. The BART family adds a bias beside every projection and norm
    (:func:`bias_name`): split with its kernel's output axis, or whole and written per rank
    (``per_rank``) beside a row-split kernel. The engine's table
    (``torch.ops.warpformer.t5_weight_table``); raises :class:`~warpformer.config.ConfigError`
    naming the key when the engine refuses the config.
    """
    return table_specs(list(_engine_table(config.to_json())))


def t5_file_name(name: str, spec: WeightSpec, tp_rank: int) -> str:
    """FT's file name of tensor ``name`` for ``tp_rank`` (no ``model.`` prefix)."""
    return file_name(name, spec, tp_rank, prefix="")


def read_t5_config(model_dir: str | os.PathLike[str]) -> T5Config:
    """The :class:`T5Config` of a converted directory (``model_dir`` or its one ``<N>-gpu``)."""
    return T5Config.from_ini(resolve_model_dir(model_dir) / "config.ini")


_BLOCK_FILE = re.compile(r"(encoder|decoder)\.(?:block\.)?(\d+)\.")  # T5, BART layer files


def load_t5_weights(model_dir: str | os.PathLike[str], tp_rank: int = 0,
                    dtype: torch.dtype | None = None,
                    device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """One tensor-parallel rank's tensors ``{name: tensor}`` (per-rank shapes) of a converted
    T5- or BART-family directory, cast to ``dtype`` (default: the file dtype) on ``device``.

    Every file's size is checked against ``config.ini`` before any is read; a missing or
    mis-sized file raises :class:`WeightFileError` naming it, its tensor and the expected size.
    A directory from FT's older converter, which wrote no ``lm_head.weight.bin`` for a tied
    head, loads with the embedding as the head. Files FT writes that are not read here
    (``shared.weight.bin``, the ``[d, V]`` transpose) are ignored.
    """
    root = resolve_model_dir(model_dir)
    config = T5Config.from_ini(root / "config.ini")
    tp = config.tensor_para_size
    if not 0 <= tp_rank < tp:
        raise ValueError(f"tp_rank ({tp_rank}) must be in [0, tensor_para_size ({tp}))")
    file_dtype = DTYPES[config.weight_data_type]
    itemsize = torch.empty((), dtype=file_dtype).element_size()
    specs = t5_weight_specs(config)
    # FT's older T5 converter wrote no head file for a tied head; its BART converter always does.
    head_from_embedding = (not config.is_bart and config.tie_word_embeddings
                           and not (root / t5_file_name(LM_HEAD, specs[LM_HEAD], 0)).exists())
    plan = []
    for name, spec in specs.items():
        if name == LM_HEAD and head_from_embedding:
            continue
        path = root / t5_file_name(name, spec, tp_rank)
        shape = spec.shard_shape(tp)
        expected = int(np.prod(shape)) * itemsize
        if not path.is_file():
            raise WeightFileError(f"missing weight file {path} (tensor {name}, shape "
                                  f"{list(shape)} {config.weight_data_type}, {expected} bytes "
                                  "expected)")
        if path.stat().st_size != expected:
            raise WeightFileError(f"weight file {path} has {path.stat().st_size} bytes, expected "
                                  f"{expected} (shape {list(shape)} {config.weight_data_type} "
                                  "per config.ini)")
        plan.append((name, path, shape))
    layers = {"encoder": config.encoder.num_layers, "decoder": config.decoder.num_layers}
    extra = sorted({f"{m.group(1)} block {m.group(2)}" for p in root.iterdir()
                    if (m := _BLOCK_FILE.match(p.name)) and int(m.group(2)) >= layers[m.group(1)]})
    if extra:
        raise WeightFileError(f"{root} holds weight files of {', '.join(extra[:4])}, beyond "
                              "num_layers in config.ini; fix num_layers or remove those files")
    out = {}
    for name, path, shape in plan:
        tensor = _read_raw(path, file_dtype, shape)
        out[name] = tensor.to(dtype=dtype or file_dtype, device=device)
        if not bool(torch.isfinite(out[name]).all()):
            raise WeightFileError(f"weight file {path} (tensor {name}) holds NaN or inf")
    if head_from_embedding:
        out[LM_HEAD] = out[EMBEDDING]
    return out


def load_merged_t5_weights(model_dir: str | os.PathLike[str], dtype: torch.dtype | None = None,
                           device: str | torch.device = "cpu"
                           ) -> tuple[T5Config, dict[str, torch.Tensor]]:
    """Every rank of a converted T5/BART directory, split tensors concatenated back to the full
    shapes of :func:`t5_weight_specs`; returns ``(config, weights)``."""
    config = read_t5_config(model_dir)
    specs = t5_weight_specs(config)
    shards = [load_t5_weights(model_dir, r, dtype, device)
              for r in range(config.tensor_para_size)]
    merged = {}
    for name, tensor in shards[0].items():
        axis = specs[name].split_axis
        merged[name] = tensor if axis is None else torch.cat([s[name] for s in shards], axis)
    return config, merged

