"""HF ``BloomForCausalLM``: ALiBi, an embedding layernorm, per-head interleaved fused QKV."""

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
    linear,
    qkv_bias_from_head_interleaved,
    qkv_from_head_interleaved,
    token_id,
)
from .sources import HfCheckpoint

ARCHITECTURES = ("BloomForCausalLM", "BloomModel")  # BloomModel: tied head by definition

L = "h.{i}."
RULES = [
    Rule("wte", ("word_embeddings.weight",), copy),
    Rule("pre_decoder_layernorm.weight", ("word_embeddings_layernorm.weight",), copy),
    Rule("pre_decoder_layernorm.bias", ("word_embeddings_layernorm.bias",), copy),
    Rule("layers.{i}.input_layernorm.weight", (L + "input_layernorm.weight",), copy),
    Rule("layers.{i}.input_layernorm.bias", (L + "input_layernorm.bias",), copy),
    Rule("layers.{i}.attention.query_key_value.weight",
         (L + "self_attention.query_key_value.weight",), qkv_from_head_interleaved),
    Rule("layers.{i}.attention.query_key_value.bias",
         (L + "self_attention.query_key_value.bias",), qkv_bias_from_head_interleaved),
    Rule("layers.{i}.attention.dense.weight", (L + "self_attention.dense.weight",), linear),
    Rule("layers.{i}.attention.dense.bias", (L + "self_attention.dense.bias",), copy),
    Rule("layers.{i}.post_attention_layernorm.weight", (L + "post_attention_layernorm.weight",),
         copy),
    Rule("layers.{i}.post_attention_layernorm.bias", (L + "post_attention_layernorm.bias",), copy),
    Rule("layers.{i}.mlp.dense_h_to_4h.weight", (L + "mlp.dense_h_to_4h.weight",), linear),
    Rule("layers.{i}.mlp.dense_h_to_4h.bias", (L + "mlp.dense_h_to_4h.bias",), copy),
    Rule("layers.{i}.mlp.dense_4h_to_h.weight", (L + "mlp.dense_4h_to_h.weight",), linear),
    Rule("layers.{i}.mlp.dense_4h_to_h.bias", (L + "mlp.dense_4h_to_h.bias",), copy),
    Rule("final_layernorm.weight", ("ln_f.weight",), copy),
    Rule("final_layernorm.bias", ("ln_f.bias",), copy),
]
LM_HEAD = Rule("lm_head.weight", ("lm_head.weight",), copy)


def make_config(hf: dict[str, Any], tp: int, data_type: str) -> GptConfig:
    """GptConfig for a BLOOM ``config.json`` (the FFN is always ``4h``, gelu tanh form)."""
    if hf.get("apply_residual_connection_post_layernorm"):
        raise ConversionError("BLOOM with apply_residual_connection_post_layernorm = true is not "
                              "supported")
    # Aliases first (they win in BloomConfig too), so a missing key is reported by the name
    # config.json uses.
    h = hf.get("n_embed") or hf["hidden_size"]
    n = hf.get("num_attention_heads") or hf["n_head"]
    return GptConfig(
        model_name=hf.get("_name_or_path") or "bloom", model_variant="bloom",
        head_num=n, size_per_head=h // n, inter_size=4 * h,
        num_layer=hf.get("num_hidden_layers") or hf["n_layer"], vocab_size=hf["vocab_size"],
        start_id=token_id(hf, "bos_token_id", 1), end_id=token_id(hf, "eos_token_id", 2),
        weight_data_type=data_type, tensor_para_size=tp,
        layernorm_eps=hf.get("layer_norm_epsilon", 1e-5), activation_type="gelu_tanh",
        has_positional_encoding=False, has_pre_decoder_layernorm=True,
        use_attention_linear_bias=True,
    )


def build_plan(root: Path, hf: dict[str, Any], tp: int, data_type: str) -> Plan:
    """Plan converting the BLOOM checkpoint under ``root``."""
    cfg = make_config(hf, tp, data_type)
    ckpt = HfCheckpoint.open(root)
    prefix = find_prefix(ckpt.keys(), "word_embeddings.weight", ("transformer.", ""))
    tasks = expand(RULES, cfg.num_layer, prefix)
    if not hf.get("tie_word_embeddings", True):
        tasks += expand([LM_HEAD], 0)
    return Plan(cfg, weight_specs(cfg), tasks, ckpt, "BloomForCausalLM")
