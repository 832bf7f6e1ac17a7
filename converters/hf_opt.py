"""HF ``OPTForCausalLM``: learned positions with an offset of 2, ReLU, separate q/k/v.

OPT stores ``max_position_embeddings + 2`` position rows and looks up ``position + 2``;
FasterTransformer's OPT converter drops the first two rows so that ``wpe`` is indexed by the plain
position, and so do we (no offset key in config.ini; FT-converted OPT directories load as is).
OPT-350m (``word_embed_proj_dim != hidden_size``, ``do_layer_norm_before = false``) keeps its
bias-free ``project_in``/``project_out`` as ``[in, out]`` kernels and runs post-LN without a
final layernorm.
"""

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
    drop_rows,
    expand,
    find_prefix,
    hf_activation,
    linear,
    qkv_bias_from_separate,
    qkv_from_separate,
    token_id,
)
from .sources import HfCheckpoint

ARCHITECTURES = ("OPTForCausalLM", "OPTModel")  # OPTModel: tied head by definition
POSITION_OFFSET = 2

L = "decoder.layers.{i}."
A = L + "self_attn."
LAYER_RULES = [
    Rule("layers.{i}.input_layernorm.weight", (L + "self_attn_layer_norm.weight",), copy),
    Rule("layers.{i}.input_layernorm.bias", (L + "self_attn_layer_norm.bias",), copy),
    Rule("layers.{i}.attention.query_key_value.weight",
         (A + "q_proj.weight", A + "k_proj.weight", A + "v_proj.weight"), qkv_from_separate),
    Rule("layers.{i}.attention.query_key_value.bias",
         (A + "q_proj.bias", A + "k_proj.bias", A + "v_proj.bias"), qkv_bias_from_separate),
    Rule("layers.{i}.attention.dense.weight", (A + "out_proj.weight",), linear),
    Rule("layers.{i}.attention.dense.bias", (A + "out_proj.bias",), copy),
    Rule("layers.{i}.post_attention_layernorm.weight", (L + "final_layer_norm.weight",), copy),
    Rule("layers.{i}.post_attention_layernorm.bias", (L + "final_layer_norm.bias",), copy),
    Rule("layers.{i}.mlp.dense_h_to_4h.weight", (L + "fc1.weight",), linear),
    Rule("layers.{i}.mlp.dense_h_to_4h.bias", (L + "fc1.bias",), copy),
    Rule("layers.{i}.mlp.dense_4h_to_h.weight", (L + "fc2.weight",), linear),
    Rule("layers.{i}.mlp.dense_4h_to_h.bias", (L + "fc2.bias",), copy),
]
MODEL_RULES = [
    Rule("wte", ("decoder.embed_tokens.weight",), copy),
    Rule("wpe", ("decoder.embed_positions.weight",), drop_rows(POSITION_OFFSET)),
]
FINAL_NORM_RULES = [
    Rule("final_layernorm.weight", ("decoder.final_layer_norm.weight",), copy),
    Rule("final_layernorm.bias", ("decoder.final_layer_norm.bias",), copy),
]
PROJECTION_RULES = [
    Rule("project_in.weight", ("decoder.project_in.weight",), linear),
    Rule("project_out.weight", ("decoder.project_out.weight",), linear),
]
LM_HEAD = Rule("lm_head.weight", ("lm_head.weight",), copy)


def make_config(hf: dict[str, Any], tp: int, data_type: str) -> GptConfig:
    """GptConfig for an OPT ``config.json``."""
    if not hf.get("enable_bias", True) or not hf.get("layer_norm_elementwise_affine", True):
        raise ConversionError("OPT without biases (enable_bias = false) or without layernorm "
                              "affine parameters is not supported")
    h, n = hf["hidden_size"], hf["num_attention_heads"]
    pre = hf.get("do_layer_norm_before", True)
    proj = hf.get("word_embed_proj_dim") or h
    return GptConfig(
        model_name=hf.get("_name_or_path") or "opt", model_variant="opt",
        head_num=n, size_per_head=h // n, inter_size=hf["ffn_dim"],
        num_layer=hf["num_hidden_layers"], vocab_size=hf["vocab_size"],
        max_pos_seq_len=hf["max_position_embeddings"],
        start_id=token_id(hf, "bos_token_id", 2), end_id=token_id(hf, "eos_token_id", 2),
        weight_data_type=data_type, tensor_para_size=tp, layernorm_eps=1e-5,
        layernorm_type="pre_layernorm" if pre else "post_layernorm",
        activation_type=hf_activation(hf.get("activation_function", "relu"), "OPT"),
        has_post_decoder_layernorm=pre and not hf.get("_remove_final_layer_norm", False),
        word_embed_proj_dim=0 if proj == h else proj,
    )


def build_plan(root: Path, hf: dict[str, Any], tp: int, data_type: str) -> Plan:
    """Plan converting the OPT checkpoint under ``root``."""
    cfg = make_config(hf, tp, data_type)
    ckpt = HfCheckpoint.open(root)
    prefix = find_prefix(ckpt.keys(), "decoder.embed_tokens.weight", ("model.", ""))
    rules = LAYER_RULES + MODEL_RULES
    if cfg.has_post_decoder_layernorm:
        rules += FINAL_NORM_RULES
    if cfg.word_embed_proj_dim:
        rules += PROJECTION_RULES
    tasks = expand(rules, cfg.num_layer, prefix)
    if not hf.get("tie_word_embeddings", True):
        tasks += expand([LM_HEAD], 0)
    return Plan(cfg, weight_specs(cfg), tasks, ckpt, "OPTForCausalLM")
