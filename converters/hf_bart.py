"""HF ``BartForConditionalGeneration`` / ``MBartForConditionalGeneration`` -> FT's BART layout.

FT's encoder-decoder layout with the file names of its BART converter
(``examples/pytorch/bart/utils/huggingface_bart_convert.py``): ``encoder.{i}.layer.SelfAttention.
q.weight.0.bin``, ``decoder.{i}.layer.CrossAttention.out_proj.bias.0.bin`` ... The layout and its
tensor-parallel split are :func:`warpformer.t5_weights.t5_weight_specs` (``docs/FORMAT.md``,
"BART family"); ``config.ini`` is :class:`warpformer.t5_config.T5Config` with ``model_type``
``bart`` / ``mbart``. As FT's converter does, the two ``embed_tokens`` files hold the shared
embedding times ``sqrt(d_model)`` when ``scale_embedding`` is set, and the position tables drop
HF's first two rows (BART's offset), so row ``p`` is position ``p``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from warpformer.config import ConfigError
from warpformer.t5_config import T5Config, T5StackConfig
from warpformer.t5_weights import bias_name, layer_names, model_names, t5_weight_specs

from .errors import ConversionError
from .hf_t5 import FtT5Output, check_hf_shapes
from .mapping import (
    Plan,
    Rule,
    Transform,
    copy,
    drop_rows,
    expand,
    linear,
    qkv_bias_from_separate,
    qkv_from_separate,
    token_id,
)
from .sources import HfCheckpoint

ARCHITECTURES = ("BartForConditionalGeneration", "MBartForConditionalGeneration")

_EMBEDDING_SOURCES = ("model.shared.weight|model.encoder.embed_tokens.weight|"
                      "model.decoder.embed_tokens.weight")
POSITION_OFFSET = 2  # HF's BartLearnedPositionalEmbedding offset

# Role (warpformer.t5_weights.layer_names) -> HF module under model.{stack}.layers.{i}.
_LAYER_SOURCES = {
    "self_norm": "self_attn_layer_norm", "self_q": "self_attn.q_proj",
    "self_k": "self_attn.k_proj", "self_v": "self_attn.v_proj", "self_o": "self_attn.out_proj",
    "cross_norm": "encoder_attn_layer_norm", "cross_q": "encoder_attn.q_proj",
    "cross_k": "encoder_attn.k_proj", "cross_v": "encoder_attn.v_proj",
    "cross_o": "encoder_attn.out_proj", "ffn_norm": "final_layer_norm", "ffn_in": "fc1",
    "ffn_out": "fc2",
}


def flatten(cfg: Any, t: torch.Tensor) -> torch.Tensor:
    """``final_logits_bias`` ``[1, V]`` -> ``[V]``, same dtype (a view)."""
    return t.reshape(-1)


@dataclass(frozen=True)
class _Scale:
    """Transform multiplying by ``factor`` (the folded ``scale_embedding``), computed in fp32 so
    a half-precision checkpoint is rounded once, when written."""

    factor: float

    def __call__(self, cfg: Any, t: torch.Tensor) -> torch.Tensor:
        return t if self.factor == 1.0 else t.float() * self.factor


def _layer_rules(config: T5Config, stack: str) -> list[Rule]:
    """Rules of layer ``{i}`` of ``stack``; weights and biases, targets are FT names."""
    rules = []
    hf = f"model.{stack}.layers.{{i}}."
    for role, target in layer_names(config, stack, 0).items():
        target = target.replace(f"{stack}.0.", f"{stack}.{{i}}.", 1)
        if role == "self_qkv":
            for kind, fuse in (("weight", qkv_from_separate), ("bias", qkv_bias_from_separate)):
                rules.append(Rule(target[: -len("weight")] + kind, tuple(
                    hf + f"self_attn.{m}_proj.{kind}" for m in "qkv"), fuse))
            continue
        source = hf + _LAYER_SOURCES[role]
        kernel: Transform = copy if role.endswith("norm") else linear
        rules.append(Rule(target, (source + ".weight",), kernel))
        rules.append(Rule(bias_name(target), (source + ".bias",), copy))
    return rules


def _model_rules(config: T5Config, head_sources: str, embed_scale: float) -> list[Rule]:
    """Model-level rules; the embedding files get ``embed_scale`` folded in."""
    names = model_names(config)
    scale = _Scale(embed_scale)
    rules = [Rule(names["lm_head"], (head_sources,), copy),
             Rule(names["logits_bias"], ("final_logits_bias",), flatten)]
    for stack in ("encoder", "decoder"):
        hf = f"model.{stack}."
        rules += [
            Rule(names[f"{stack}_embedding"], (_EMBEDDING_SOURCES,), scale),
            Rule(names[f"{stack}_positions"], (hf + "embed_positions.weight",),
                 drop_rows(POSITION_OFFSET)),
        ]
        norms = [("embedding_norm", "layernorm_embedding")]
        if f"{stack}_final_norm" in names:
            norms.append(("final_norm", "layer_norm"))
        for role, module in norms:
            target = names[f"{stack}_{role}"]
            rules += [Rule(target, (hf + module + ".weight",), copy),
                      Rule(bias_name(target), (hf + module + ".bias",), copy)]
    return rules


def make_config(hf: Any, tp: int, data_type: str) -> T5Config:
    """:class:`T5Config` (``model_type`` ``bart``/``mbart``) for a BART/mBART ``config.json``
    (a :class:`~.mapping.ConfigDict`)."""
    where = getattr(hf, "where", "config.json")
    act = str(hf.get("activation_function") or "gelu")
    d_model = hf["d_model"]

    def stack(prefix: str) -> T5StackConfig:
        heads = hf[f"{prefix}_attention_heads"]
        if int(heads) < 1 or int(d_model) % int(heads):
            raise ConversionError(f"{where}: d_model ({d_model}) must be divisible by "
                                  f"{prefix}_attention_heads ({heads})")
        return T5StackConfig(
            vocab_size=hf["vocab_size"], d_model=d_model, d_kv=int(d_model) // int(heads),
            d_ff=hf[f"{prefix}_ffn_dim"], num_layers=hf[f"{prefix}_layers"], num_heads=heads,
            layer_norm_epsilon=1e-5, feed_forward_proj=act, dense_act_fn=act,
            max_pos_seq_len=hf["max_position_embeddings"])

    eos = token_id(hf, "eos_token_id", 2)
    try:
        return T5Config(
            encoder=stack("encoder"), decoder=stack("decoder"),
            pad_token_id=token_id(hf, "pad_token_id", 1), eos_token_id=eos,
            # HF's generate starts from bos when decoder_start_token_id is unset (mBART).
            decoder_start_token_id=token_id(hf, "decoder_start_token_id",
                                            token_id(hf, "bos_token_id", 0)),
            tie_word_embeddings=False, weight_data_type=data_type, tensor_para_size=tp,
            model_type="mbart" if hf.get("model_type") == "mbart" else "bart")
    except ConfigError as exc:
        message = str(exc).replace("dense_act_fn", "activation_function", 1)
        raise ConversionError(f"{where}: {message}") from None


def build_plan(root: Path, hf: Any, tp: int, data_type: str) -> Plan:
    """Plan converting the BART/mBART checkpoint under ``root`` for ``tp`` ranks."""
    config = make_config(hf, tp, data_type)
    ckpt = HfCheckpoint.open(root)
    # As for T5: a head the config declares untied must be in the checkpoint; a tied one may be
    # saved only as the shared embedding (transformers 5 omits the tied lm_head.weight).
    untied = hf.get("tie_word_embeddings", True) is False
    head = "lm_head.weight" if untied else "lm_head.weight|" + _EMBEDDING_SOURCES
    scale = math.sqrt(config.d_model) if hf.get("scale_embedding", False) else 1.0
    tasks = expand(_model_rules(config, head, scale), 0)
    for stack in ("encoder", "decoder"):
        tasks += expand(_layer_rules(config, stack), getattr(config, stack).num_layers)
    check_hf_shapes(ckpt, tasks)
    arch = ARCHITECTURES[config.model_type == "mbart"]
    return Plan(FtT5Output(config), t5_weight_specs(config), tasks, ckpt, arch, file_prefix="")
