"""HF ``GPTNeoXForCausalLM``: "half" rotary on ``rotary_pct`` of each head, per-head interleaved
fused QKV, parallel (``use_parallel_residual``) or sequential residual, untied ``embed_out``."""

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
    linear,
    qkv_bias_from_head_interleaved,
    qkv_from_head_interleaved,
    token_id,
)
from .sources import HfCheckpoint

ARCHITECTURES = ("GPTNeoXForCausalLM",)

L = "gpt_neox.layers.{i}."
RULES = [
    Rule("wte", ("gpt_neox.embed_in.weight",), copy),
    Rule("layers.{i}.input_layernorm.weight", (L + "input_layernorm.weight",), copy),
    Rule("layers.{i}.input_layernorm.bias", (L + "input_layernorm.bias",), copy),
    Rule("layers.{i}.attention.query_key_value.weight", (L + "attention.query_key_value.weight",),
         qkv_from_head_interleaved),
    Rule("layers.{i}.attention.dense.weight", (L + "attention.dense.weight",), linear),
    Rule("layers.{i}.post_attention_layernorm.weight", (L + "post_attention_layernorm.weight",),
         copy),
    Rule("layers.{i}.post_attention_layernorm.bias", (L + "post_attention_layernorm.bias",), copy),
    Rule("layers.{i}.mlp.dense_h_to_4h.weight", (L + "mlp.dense_h_to_4h.weight",), linear),
    Rule("layers.{i}.mlp.dense_h_to_4h.bias", (L + "mlp.dense_h_to_4h.bias",), copy),
    Rule("layers.{i}.mlp.dense_4h_to_h.weight", (L + "mlp.dense_4h_to_h.weight",), linear),
    Rule("layers.{i}.mlp.dense_4h_to_h.bias", (L + "mlp.dense_4h_to_h.bias",), copy),
    Rule("final_layernorm.weight", ("gpt_neox.final_layer_norm.weight",), copy),
    Rule("final_layernorm.bias", ("gpt_neox.final_layer_norm.bias",), copy),
]
BIAS_RULES = [
    Rule("layers.{i}.attention.query_key_value.bias", (L + "attention.query_key_value.bias",),
         qkv_bias_from_head_interleaved),
    Rule("layers.{i}.attention.dense.bias", (L + "attention.dense.bias",), copy),
]
# On disk it is "embed_out"; transformers 5 renames the module "lm_head" in memory.
LM_HEAD = Rule("lm_head.weight", ("embed_out.weight|lm_head.weight",), copy)


def _rope(hf: dict[str, Any]) -> tuple[float, float]:
    """(partial rotary factor, base) from either the legacy keys or transformers 5's
    ``rope_parameters``."""
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ("default", None):
        raise ConversionError(f"GPT-NeoX rope_type {kind!r} is not supported (only default)")
    pct = rope.get("partial_rotary_factor", hf.get("rotary_pct", 0.25))
    base = rope.get("rope_theta", hf.get("rotary_emb_base", 10000.0))
    return float(pct), float(base)


def make_config(hf: dict[str, Any], tp: int, data_type: str) -> GptConfig:
    """GptConfig for a GPT-NeoX ``config.json``."""
    h, n = hf["hidden_size"], hf["num_attention_heads"]
    d = h // n
    pct, base = _rope(hf)
    parallel = hf.get("use_parallel_residual", True)
    return GptConfig(
        model_name=hf.get("_name_or_path") or "gptneox", model_variant="gptneox",
        head_num=n, size_per_head=d, inter_size=hf["intermediate_size"],
        num_layer=hf["num_hidden_layers"], vocab_size=hf["vocab_size"],
        max_pos_seq_len=hf.get("max_position_embeddings", 2048),
        start_id=token_id(hf, "bos_token_id"), end_id=token_id(hf, "eos_token_id"),
        weight_data_type=data_type, tensor_para_size=tp,
        layernorm_eps=hf.get("layer_norm_eps", 1e-5),
        activation_type=hf_activation(hf.get("hidden_act", "gelu"), "GPT-NeoX"),
        has_positional_encoding=False, rotary_embedding_dim=int(d * pct), rotary_style="half",
        rotary_base=base, parallel_residual=parallel, parallel_shared_layernorm=False,
        has_attention_bias=hf.get("attention_bias", True),
    )


def build_plan(root: Path, hf: dict[str, Any], tp: int, data_type: str) -> Plan:
    """Plan converting the GPT-NeoX checkpoint under ``root``."""
    cfg = make_config(hf, tp, data_type)
    ckpt = HfCheckpoint.open(root)
    find_prefix(ckpt.keys(), "gpt_neox.embed_in.weight", ("",))
    rules = RULES + (BIAS_RULES if cfg.has_attention_bias else [])
    tasks = expand(rules, cfg.num_layer)
    if not hf.get("tie_word_embeddings", False):
        tasks += expand([LM_HEAD], 0)
    return Plan(cfg, weight_specs(cfg), tasks, ckpt, "GPTNeoXForCausalLM")
