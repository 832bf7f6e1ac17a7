"""HF ``GPT2LMHeadModel``: pre-LN, learned positions, Conv1D kernels already ``[in, out]``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from warpformer.config import GptConfig
from warpformer.weights import weight_specs

from .errors import ConversionError
from .mapping import (
    Plan,
    Rule,
    copy,
    expand,
    find_prefix,
    hf_activation,
    qkv_bias_from_fused,
    qkv_from_fused,
    token_id,
)
from .sources import HfCheckpoint

# GPT2Model checkpoints (no head, tied by definition) convert the same way.
ARCHITECTURES = ("GPT2LMHeadModel", "GPT2Model")

L = "h.{i}."
RULES = [
    Rule("wte", ("wte.weight",), copy),
    Rule("wpe", ("wpe.weight",), copy),
    Rule("layers.{i}.input_layernorm.weight", (L + "ln_1.weight",), copy),
    Rule("layers.{i}.input_layernorm.bias", (L + "ln_1.bias",), copy),
    Rule("layers.{i}.attention.query_key_value.weight", (L + "attn.c_attn.weight",),
         qkv_from_fused),
    Rule("layers.{i}.attention.query_key_value.bias", (L + "attn.c_attn.bias",),
         qkv_bias_from_fused),
    Rule("layers.{i}.attention.dense.weight", (L + "attn.c_proj.weight",), copy),
    Rule("layers.{i}.attention.dense.bias", (L + "attn.c_proj.bias",), copy),
    Rule("layers.{i}.post_attention_layernorm.weight", (L + "ln_2.weight",), copy),
    Rule("layers.{i}.post_attention_layernorm.bias", (L + "ln_2.bias",), copy),
    Rule("layers.{i}.mlp.dense_h_to_4h.weight", (L + "mlp.c_fc.weight",), copy),
    Rule("layers.{i}.mlp.dense_h_to_4h.bias", (L + "mlp.c_fc.bias",), copy),
    Rule("layers.{i}.mlp.dense_4h_to_h.weight", (L + "mlp.c_proj.weight",), copy),
    Rule("layers.{i}.mlp.dense_4h_to_h.bias", (L + "mlp.c_proj.bias",), copy),
    Rule("final_layernorm.weight", ("ln_f.weight",), copy),
    Rule("final_layernorm.bias", ("ln_f.bias",), copy),
]
LM_HEAD = Rule("lm_head.weight", ("lm_head.weight",), copy)


def make_config(hf: dict[str, Any], tp: int, data_type: str) -> GptConfig:
    """GptConfig for a GPT-2 ``config.json``."""
    if not hf.get("scale_attn_weights", True) or hf.get("scale_attn_by_inverse_layer_idx"):
        raise ConversionError("GPT-2 attention without 1/sqrt(d) scaling or with per-layer "
                              "scaling (scale_attn_weights / scale_attn_by_inverse_layer_idx) "
                              "is not supported")
    h, n = hf["n_embd"], hf["n_head"]
    return GptConfig(
        model_name=hf.get("_name_or_path") or "gpt2", model_variant="gpt2",
        head_num=n, size_per_head=h // n, inter_size=hf.get("n_inner") or 4 * h,
        num_layer=hf["n_layer"], vocab_size=hf["vocab_size"], max_pos_seq_len=hf["n_positions"],
        start_id=token_id(hf, "bos_token_id"), end_id=token_id(hf, "eos_token_id"),
        weight_data_type=data_type, tensor_para_size=tp,
        layernorm_eps=hf.get("layer_norm_epsilon", 1e-5),
        activation_type=hf_activation(hf.get("activation_function", "gelu_new"), "GPT-2"),
    )


def build_plan(root: Path, hf: dict[str, Any], tp: int, data_type: str) -> Plan:
    """Plan converting the GPT-2 checkpoint under ``root``."""
    cfg = make_config(hf, tp, data_type)
    ckpt = HfCheckpoint.open(root)
    prefix = find_prefix(ckpt.keys(), "wte.weight", ("transformer.", ""))
    tasks = expand(RULES, cfg.num_layer, prefix)
    if not hf.get("tie_word_embeddings", True):
        tasks += expand([LM_HEAD], 0)
    return Plan(cfg, weight_specs(cfg), tasks, ckpt, "GPT2LMHeadModel")
