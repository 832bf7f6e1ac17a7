"""Weight table and loader of the T5 layout (FasterTransformer's ``huggingface_t5_ckpt_convert``).

:func:`t5_weight_specs` lists every tensor a :class:`~warpformer.t5_config.T5Config` implies with
its full (unsplit) shape and tensor-parallel split axis; names are FT's file names without the
rank suffix and ``.bin``: ``<name>.bin`` for replicated tensors, ``<name>.<tp_rank>.bin`` for split
ones (no ``model.`` prefix, unlike the GPT layout). Files are headerless little-endian C-order
arrays of ``weight_data_type``. The converter, :func:`load_t5_weights` and
:mod:`warpformer.reference_seq2seq` share this table. (The GPT table lives in the engine; the T5
one moves there when the engine gains the family.)
"""

from __future__ import annotations

import os
import re

import numpy as np
import torch

from .t5_config import T5Config
from .weights import DTYPES, WeightFileError, WeightSpec, _read_raw, file_name, resolve_model_dir

__all__ = ["t5_weight_specs", "t5_file_name", "read_t5_config", "load_t5_weights",
           "load_merged_t5_weights", "EMBEDDING", "LM_HEAD"]

EMBEDDING = "shared.weight_T"  # [V, d]: FT's name for the embedding rows (HF's layout)
LM_HEAD = "lm_head.weight"  # [V, d]


def t5_weight_specs(config: T5Config) -> dict[str, WeightSpec]:
    """Every tensor of ``config``'s layout, keyed by FT file name without rank and ``.bin``.

    Linear kernels are ``[in, out]``. Split (as FT does): Q, K, V, ``wi``, ``wi2`` on their output
    axis (heads / FFN columns), ``o`` and ``wo`` on their input axis (rows), the relative
    attention bias tables ``[heads, buckets]`` on heads; norms, the embedding and ``lm_head`` are
    replicated. The decoder's self-attention Q/K/V are fused ``[d, 3, inner]`` (``qkv.weight``).
    """
    enc, dec, tp_axis = config.encoder, config.decoder, 1
    V, d = config.vocab_size, config.d_model
    specs: dict[str, WeightSpec] = {
        EMBEDDING: WeightSpec((V, d)),
        LM_HEAD: WeightSpec((V, d)),
        "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight":
            WeightSpec((enc.num_heads, enc.relative_attention_num_buckets), 0, 0),
        "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight":
            WeightSpec((dec.num_heads, dec.relative_attention_num_buckets), 0, 0),
        "encoder.final_layer_norm.weight": WeightSpec((d,)),
        "decoder.final_layer_norm.weight": WeightSpec((d,)),
    }

    def ffn(prefix: str, stack, i: int) -> None:
        specs[prefix + "wi.weight"] = WeightSpec((d, stack.d_ff), tp_axis, i)
        if stack.gated:
            specs[prefix + "wi2.weight"] = WeightSpec((d, stack.d_ff), tp_axis, i)
        specs[prefix + "wo.weight"] = WeightSpec((stack.d_ff, d), 0, i)

    for i in range(enc.num_layers):
        p = f"encoder.block.{i}.layer."
        specs[p + "0.layer_norm.weight"] = WeightSpec((d,), None, i)
        for m in "qkv":
            specs[p + f"0.SelfAttention.{m}.weight"] = WeightSpec((d, enc.inner_size), tp_axis, i)
        specs[p + "0.SelfAttention.o.weight"] = WeightSpec((enc.inner_size, d), 0, i)
        specs[p + "1.layer_norm.weight"] = WeightSpec((d,), None, i)
        ffn(p + "1.DenseReluDense.", enc, i)
    for i in range(dec.num_layers):
        p = f"decoder.block.{i}.layer."
        specs[p + "0.layer_norm.weight"] = WeightSpec((d,), None, i)
        specs[p + "0.SelfAttention.qkv.weight"] = WeightSpec((d, 3, dec.inner_size), 2, i)
        specs[p + "0.SelfAttention.o.weight"] = WeightSpec((dec.inner_size, d), 0, i)
        specs[p + "1.layer_norm.weight"] = WeightSpec((d,), None, i)
        for m in "qkv":
            specs[p + f"1.EncDecAttention.{m}.weight"] = WeightSpec((d, dec.inner_size), tp_axis,
                                                                     i)
        specs[p + "1.EncDecAttention.o.weight"] = WeightSpec((dec.inner_size, d), 0, i)
        specs[p + "2.layer_norm.weight"] = WeightSpec((d,), None, i)
        ffn(p + "2.DenseReluDense.", dec, i)
    return specs


def t5_file_name(name: str, spec: WeightSpec, tp_rank: int) -> str:
    """FT's file name of tensor ``name`` for ``tp_rank`` (no ``model.`` prefix)."""
    return file_name(name, spec, tp_rank, prefix="")


def read_t5_config(model_dir: str | os.PathLike[str]) -> T5Config:
    """The :class:`T5Config` of a converted directory (``model_dir`` or its one ``<N>-gpu``)."""
    return T5Config.from_ini(resolve_model_dir(model_dir) / "config.ini")


_BLOCK_FILE = re.compile(r"(encoder|decoder)\.block\.(\d+)\.")


def load_t5_weights(model_dir: str | os.PathLike[str], tp_rank: int = 0,
                    dtype: torch.dtype | None = None,
                    device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """One tensor-parallel rank's tensors ``{name: tensor}`` (per-rank shapes) of a converted T5
    directory, cast to ``dtype`` (default: the file dtype) on ``device``.

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
    head_file = root / t5_file_name(LM_HEAD, specs[LM_HEAD], tp_rank)
    head_from_embedding = not head_file.exists() and config.tie_word_embeddings
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
    """Every rank of a converted T5 directory, split tensors concatenated back to the full
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

