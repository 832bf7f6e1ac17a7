"""Weight table and loader of FT's encoder-decoder layouts (T5 family, BART family).

:func:`t5_weight_specs` lists every tensor a :class:`~warpformer.t5_config.T5Config` implies with
its full (unsplit) shape and tensor-parallel split axis; names are FT's file names without the
rank suffix and ``.bin``: ``<name>.bin`` for replicated tensors, ``<name>.<tp_rank>.bin`` for split
ones and for BART's row-parallel biases (no ``model.`` prefix, unlike the GPT layout). Files are
headerless little-endian C-order arrays of ``weight_data_type``. The names come from
:func:`model_names` and :func:`layer_names`, which map a tensor's role to the family's file name
(FT's ``huggingface_t5_ckpt_convert`` / ``huggingface_bart_convert``); the converters,
:func:`load_t5_weights` and :mod:`warpformer.reference_seq2seq` share them. (The GPT table lives
in the engine; this one moves there when the engine gains the family.)
"""

from __future__ import annotations

import os
import re

import numpy as np
import torch

from .t5_config import T5Config, T5StackConfig
from .weights import DTYPES, WeightFileError, WeightSpec, _read_raw, file_name, resolve_model_dir

__all__ = ["t5_weight_specs", "t5_file_name", "read_t5_config", "load_t5_weights",
           "load_merged_t5_weights", "model_names", "layer_names", "bias_name", "EMBEDDING",
           "LM_HEAD", "STACKS"]

EMBEDDING = "shared.weight_T"  # [V, d]: FT's name for the T5 embedding rows (HF's layout)
LM_HEAD = "lm_head.weight"  # [V, d]
STACKS = ("encoder", "decoder")


def model_names(config: T5Config) -> dict[str, str]:
    """Model-level role -> file name. Roles: ``{stack}_embedding`` (``[V, d]``, the two T5 stacks
    share one file), ``{stack}_positions`` (T5: relative bias table ``[n, B]``; BART: learned
    table ``[P, d]``), ``{stack}_embedding_norm`` (BART's ``layernorm_embedding``, which FT names
    ``final_layer_norm``), ``{stack}_final_norm`` (T5, mBART), ``lm_head``, ``logits_bias``
    (BART's ``final_logits_bias``)."""
    if not config.is_bart:
        names = {"lm_head": LM_HEAD}
        for s in STACKS:
            names[f"{s}_embedding"] = EMBEDDING
            names[f"{s}_positions"] = \
                f"{s}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
            names[f"{s}_final_norm"] = f"{s}.final_layer_norm.weight"
        return names
    names = {"lm_head": "decoder.lm_head.weight", "logits_bias": "decoder.final_logits_bias"}
    for s in STACKS:
        names[f"{s}_embedding"] = f"{s}.embed_tokens.weight"
        names[f"{s}_positions"] = f"{s}.embed_positions.weight"
        names[f"{s}_embedding_norm"] = f"{s}.final_layer_norm.weight"
        if config.pre_layernorm:  # mBART
            names[f"{s}_final_norm"] = f"{s}.layer_norm.weight"
    return names


def layer_names(config: T5Config, stack: str, i: int) -> dict[str, str]:
    """Role -> file name of layer ``i`` of ``stack``. Roles: ``self_norm``, ``self_q``/``k``/``v``
    (encoder) or ``self_qkv`` (decoder, fused ``[d, 3, inner]``), ``self_o``; decoder only:
    ``cross_norm``, ``cross_q``/``k``/``v``, ``cross_o``; ``ffn_norm``, ``ffn_in``,
    ``ffn_gate`` (gated FFN only), ``ffn_out``. Norms sit before (pre-LN) or after (post-LN) the
    sublayer of the same prefix."""
    decoder = stack == "decoder"
    if config.is_bart:
        p = f"{stack}.{i}.layer."
        sa, ca, ffn = p + "SelfAttention.", p + "CrossAttention.", p + "SelfAttention."
        names = {"self_norm": sa + "attn_layer_norm.weight", "self_o": sa + "out_proj.weight",
                 "cross_norm": ca + "attn_layer_norm.weight", "cross_o": ca + "out_proj.weight",
                 "ffn_norm": ffn + "final_layer_norm.weight", "ffn_in": ffn + "fc1.weight",
                 "ffn_out": ffn + "fc2.weight"}
    else:
        p = f"{stack}.block.{i}.layer."
        sa, ca = p + "0.SelfAttention.", p + "1.EncDecAttention."
        ffn = p + ("2." if decoder else "1.")
        names = {"self_norm": p + "0.layer_norm.weight", "self_o": sa + "o.weight",
                 "cross_norm": p + "1.layer_norm.weight", "cross_o": ca + "o.weight",
                 "ffn_norm": ffn + "layer_norm.weight", "ffn_in": ffn + "DenseReluDense.wi.weight",
                 "ffn_out": ffn + "DenseReluDense.wo.weight"}
        if getattr(config, stack).gated:
            names["ffn_gate"] = ffn + "DenseReluDense.wi2.weight"
    if decoder:
        names["self_qkv"] = sa + "qkv.weight"
        names.update({f"cross_{m}": ca + f"{m}.weight" for m in "qkv"})
    else:
        del names["cross_norm"], names["cross_o"]
        names.update({f"self_{m}": sa + f"{m}.weight" for m in "qkv"})
    return names


def bias_name(name: str) -> str:
    """The bias file beside weight ``name`` (BART: every projection and LayerNorm has one)."""
    return name[: -len("weight")] + "bias"


def _layer_spec(role: str, d: int, stack: T5StackConfig, layer: int) -> WeightSpec:
    """Shape and split of a layer tensor by role. Split as FT does: Q, K, V and the FFN input
    on their output axis (heads / FFN columns), the attention output and FFN output on their
    input axis (rows); norms replicated."""
    inner, f = stack.inner_size, stack.d_ff
    if role.endswith("norm"):
        return WeightSpec((d,), None, layer)
    if role == "self_qkv":
        return WeightSpec((d, 3, inner), 2, layer)
    if role.endswith("_o"):
        return WeightSpec((inner, d), 0, layer)
    if role == "ffn_out":
        return WeightSpec((f, d), 0, layer)
    if role in ("ffn_in", "ffn_gate"):
        return WeightSpec((d, f), 1, layer)
    return WeightSpec((d, inner), 1, layer)  # q, k, v


def _bias_spec(weight: WeightSpec) -> WeightSpec:
    """The bias of a norm (``[d]``, replicated) or of a kernel ``[in, *out]`` (``[*out]``, split
    with the output axis; a row-split kernel's bias is whole on every rank, written per rank as
    FT's BART loader reads it)."""
    if len(weight.shape) == 1:
        return weight
    if weight.split_axis == 0:
        return WeightSpec(weight.shape[1:], None, weight.layer, per_rank=True)
    return WeightSpec(weight.shape[1:], weight.split_axis - 1, weight.layer)


def t5_weight_specs(config: T5Config) -> dict[str, WeightSpec]:
    """Every tensor of ``config``'s layout, keyed by FT file name without rank and ``.bin``.

    Linear kernels are ``[in, out]``; embeddings, ``lm_head`` and BART's position tables are
    ``[rows, d]``. T5's relative attention bias tables ``[heads, buckets]`` are split on heads;
    embeddings, ``lm_head``, norms and position tables are replicated (see :func:`_layer_spec`).
    The BART family adds a bias beside every projection and norm (:func:`bias_name`).
    """
    V, d = config.vocab_size, config.d_model
    specs: dict[str, WeightSpec] = {}
    for role, name in model_names(config).items():
        if role.endswith("norm"):
            specs[name] = WeightSpec((d,))
            if config.is_bart:
                specs[bias_name(name)] = WeightSpec((d,))
        elif role.endswith("positions"):
            stack = getattr(config, role.split("_")[0])
            specs[name] = (WeightSpec((stack.max_pos_seq_len, d)) if config.is_bart else
                           WeightSpec((stack.num_heads, stack.relative_attention_num_buckets), 0,
                                      0))
        else:
            specs[name] = WeightSpec((V,) if role == "logits_bias" else (V, d))
    for stack_name in STACKS:
        stack = getattr(config, stack_name)
        for i in range(stack.num_layers):
            for role, name in layer_names(config, stack_name, i).items():
                specs[name] = _layer_spec(role, d, stack, i)
                if config.is_bart:
                    specs[bias_name(name)] = _bias_spec(specs[name])
    return specs


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

