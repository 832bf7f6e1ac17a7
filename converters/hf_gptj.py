"""HF ``GPTJForCausalLM``: parallel residual sharing ``ln_1``, interleaved rotary on the first
``rotary_dim`` dims, bias-free q/k/v/out projections, untied ``lm_head`` with a bias."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from warpformer.config import GptConfig
from warpformer.weights import weight_specs

from .mapping import (
    Plan,
    Rule,
    copy,
    expand,
    find_prefix,
    hf_activation,
    linear,
    qkv_from_separate,
    token_id,
)
from .sources import HfCheckpoint

ARCHITECTURES = ("GPTJForCausalLM",)

L = "transformer.h.{i}."
RULES = [
    Rule("wte", ("transformer.wte.weight",), copy),
    Rule("layers.{i}.input_layernorm.weight", (L + "ln_1.weight",), copy),
    Rule("layers.{i}.input_layernorm.bias", (L + "ln_1.bias",), copy),
    Rule("layers.{i}.attention.query_key_value.weight",
         (L + "attn.q_proj.weight", L + "attn.k_proj.weight", L + "attn.v_proj.weight"),
         qkv_from_separate),
    Rule("layers.{i}.attention.dense.weight", (L + "attn.out_proj.weight",), linear),
    Rule("layers.{i}.mlp.dense_h_to_4h.weight", (L + "mlp.fc_in.weight",), linear),
    Rule("layers.{i}.mlp.dense_h_to_4h.bias", (L + "mlp.fc_in.bias",), copy),
    Rule("layers.{i}.mlp.dense_4h_to_h.weight", (L + "mlp.fc_out.weight",), linear),
    Rule("layers.{i}.mlp.dense_4h_to_h.bias", (L + "mlp.fc_out.bias",), copy),
    Rule("final_layernorm.weight", ("transformer.ln_f.weight",), copy),
    Rule("final_layernorm.bias", ("transformer.ln_f.bias",), copy),
    Rule("lm_head.weight", ("lm_head.weight",), copy),
    Rule("lm_head.bias", ("lm_head.bias",), copy),
]


def make_config(hf: dict[str, Any], tp: int, data_type: str) -> GptConfig:
    """GptConfig for a GPT-J ``config.json``."""
    h, n = hf["n_embd"], hf["n_head"]
    d = h // n
    return GptConfig(
        model_name=hf.get("_name_or_path") or "gptj", model_variant="gptj",
        head_num=n, size_per_head=d, inter_size=hf.get("n_inner") or 4 * h,
        num_layer=hf["n_layer"], vocab_size=hf["vocab_size"], max_pos_seq_len=hf["n_positions"],
        start_id=token_id(hf, "bos_token_id"), end_id=token_id(hf, "eos_token_id"),
        weight_data_type=data_type, tensor_para_size=tp,
        layernorm_eps=hf.get("layer_norm_epsilon", 1e-5),
        activation_type=hf_activation(hf.get("activation_function", "gelu_new"), "GPT-J"),
        has_positional_encoding=False, rotary_embedding_dim=hf.get("rotary_dim") or d,
        rotary_style="interleaved", rotary_base=10000.0, parallel_residual=True,
        parallel_shared_layernorm=True, has_attention_bias=False, has_lm_head_bias=True,
    )


def build_plan(root: Path, hf: dict[str, Any], tp: int, data_type: str) -> Plan:
    """Plan converting the GPT-J checkpoint under ``root``."""
    cfg = make_config(hf, tp, data_type)
    ckpt = HfCheckpoint.open(root)
    find_prefix(ckpt.keys(), "transformer.wte.weight", ("",))
    return Plan(cfg, weight_specs(cfg), expand(RULES, cfg.num_layer), ckpt, "GPTJForCausalLM")
