"""HF LLaMA-style decoders: ``LlamaForCausalLM`` (Llama 2, Llama 3.x with ``llama3`` rotary
scaling), ``MistralForCausalLM`` (a sliding attention window) and ``Qwen2ForCausalLM`` (q/k/v
biases, tied embeddings on small models). RMSNorm pre-norm blocks, a gated MLP
(``act(x G) * (x U)``), "half" rotary on the whole head, grouped-query attention.

Grouped-query QKV files hold each rank's Q heads, then its K heads, then its V heads; with fewer
K/V heads than ranks every rank keeps a copy of the one its Q heads use (``docs/FORMAT.md``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from warpformer.config import GptConfig
from warpformer.weights import weight_specs

from .errors import ConversionError
from .mapping import (
    ConfigDict,
    Plan,
    Rule,
    copy,
    expand,
    extra_token_ids,
    find_prefix,
    hf_activation,
    linear,
    token_id,
)
from .sources import HfCheckpoint

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
_VARIANTS = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
             "Qwen2ForCausalLM": "qwen2"}


def _rank_heads(cfg: GptConfig, w: torch.Tensor, kv: bool) -> list[torch.Tensor]:
    """Rank r's slice of a head-major projection output ``[heads * d, ...]``: its Q heads, or
    its K/V heads (the shared head when there are fewer K/V heads than ranks)."""
    tp, d = cfg.tensor_para_size, cfg.size_per_head
    heads = cfg.kv_heads if kv else cfg.head_num
    local = cfg.local_kv_heads if kv else cfg.head_num // tp
    first = ([r * heads // tp for r in range(tp)] if heads < tp
             else [r * local for r in range(tp)])
    return [w[h0 * d:(h0 + local) * d] for h0 in first]


def qkv_grouped(cfg: GptConfig, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
                ) -> torch.Tensor:
    """``nn.Linear`` q ``[H d, h]``, k and v ``[KV d, h]`` -> ``[h, tp * (H/tp + 2 kv_r) d]``:
    the ranks' ``[Q | K | V]`` blocks in order (multi-head: ``[h, 3, h]``). Same dtype."""
    if not cfg.grouped_query:
        return torch.stack((q.t(), k.t(), v.t()), dim=1)
    blocks = zip(_rank_heads(cfg, q, False), _rank_heads(cfg, k, True),
                 _rank_heads(cfg, v, True), strict=True)
    return torch.cat([torch.cat(b, dim=0) for b in blocks], dim=0).t()


def qkv_bias_grouped(cfg: GptConfig, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
                     ) -> torch.Tensor:
    """Biases ``[H d]``, ``[KV d]``, ``[KV d]`` laid out as :func:`qkv_grouped`'s columns."""
    if not cfg.grouped_query:
        return torch.stack((q, k, v))
    return qkv_grouped(cfg, q[:, None], k[:, None], v[:, None])[0]


L = "model.layers.{i}."
RULES = [
    Rule("wte", ("model.embed_tokens.weight",), copy),
    Rule("layers.{i}.input_layernorm.weight", (L + "input_layernorm.weight",), copy),
    Rule("layers.{i}.attention.query_key_value.weight",
         (L + "self_attn.q_proj.weight", L + "self_attn.k_proj.weight",
          L + "self_attn.v_proj.weight"), qkv_grouped),
    Rule("layers.{i}.attention.dense.weight", (L + "self_attn.o_proj.weight",), linear),
    Rule("layers.{i}.post_attention_layernorm.weight", (L + "post_attention_layernorm.weight",),
         copy),
    Rule("layers.{i}.mlp.gate.weight", (L + "mlp.gate_proj.weight",), linear),
    Rule("layers.{i}.mlp.dense_h_to_4h.weight", (L + "mlp.up_proj.weight",), linear),
    Rule("layers.{i}.mlp.dense_4h_to_h.weight", (L + "mlp.down_proj.weight",), linear),
    Rule("final_layernorm.weight", ("model.norm.weight",), copy),
]
QKV_BIAS = Rule("layers.{i}.attention.query_key_value.bias",
                (L + "self_attn.q_proj.bias", L + "self_attn.k_proj.bias",
                 L + "self_attn.v_proj.bias"), qkv_bias_grouped)
OUT_BIAS = Rule("layers.{i}.attention.dense.bias", (L + "self_attn.o_proj.bias",), copy)
MLP_BIAS = [
    Rule("layers.{i}.mlp.gate.bias", (L + "mlp.gate_proj.bias",), copy),
    Rule("layers.{i}.mlp.dense_h_to_4h.bias", (L + "mlp.up_proj.bias",), copy),
    Rule("layers.{i}.mlp.dense_4h_to_h.bias", (L + "mlp.down_proj.bias",), copy),
]
LM_HEAD = Rule("lm_head.weight", ("lm_head.weight",), copy)


_MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                "qwen2": "Qwen2ForCausalLM"}


def _architecture(hf: dict[str, Any]) -> str:
    archs = [a for a in hf.get("architectures") or [] if a in ARCHITECTURES]
    return archs[0] if archs else _MODEL_TYPES.get(hf.get("model_type", ""), ARCHITECTURES[0])


def _rope(hf: dict[str, Any], arch: str) -> dict[str, Any]:
    """The ``rope_scaling_*`` keys (and ``rotary_base``) of a HF config: transformers 5's
    ``rope_parameters`` or the legacy ``rope_theta`` / ``rope_scaling``."""
    params = dict(hf.get("rope_parameters") or {})
    legacy = hf.get("rope_scaling") or {}
    params = {**legacy, **params}
    base = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ConversionError(f"{arch}: partial_rotary_factor != 1 is not supported")
    out: dict[str, Any] = {"rotary_base": float(base)}
    if kind == "default":
        return out
    if kind not in ("linear", "dynamic", "llama3", "yarn"):
        raise ConversionError(f"{arch}: rope_type {kind!r} is not supported (default, linear, "
                              "dynamic, llama3, yarn)")
    factor = params.get("factor")
    orig = params.get("original_max_position_embeddings")
    if kind == "dynamic":  # HF scales against max_position_embeddings
        orig = hf.get("max_position_embeddings")
    if kind == "yarn" and factor is None and orig:
        factor = hf["max_position_embeddings"] / orig
    if factor is None:
        raise ConversionError(f"{arch}: rope_type {kind} needs a factor")
    out.update(rope_scaling_type=kind, rope_scaling_factor=float(factor),
               rope_scaling_original_max_position=int(orig or 0))
    if kind == "llama3":
        out.update(rope_scaling_low_freq_factor=float(params["low_freq_factor"]),
                   rope_scaling_high_freq_factor=float(params["high_freq_factor"]))
    if kind == "yarn":
        def mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0
        attn = params.get("attention_factor")
        if attn is None:
            m, m_all = params.get("mscale"), params.get("mscale_all_dim")
            attn = (mscale(factor, m) / mscale(factor, m_all) if m and m_all
                    else mscale(factor))
        out.update(rope_scaling_beta_fast=float(params.get("beta_fast") or 32),
                   rope_scaling_beta_slow=float(params.get("beta_slow") or 1),
                   rope_scaling_attention_factor=float(attn),
                   rope_scaling_truncate=bool(params.get("truncate", True)))
    return out


def make_config(hf: dict[str, Any], tp: int, data_type: str, arch: str | None = None
                ) -> GptConfig:
    """GptConfig for a Llama / Mistral / Qwen2 ``config.json`` (``arch`` read from it when not
    given)."""
    arch = arch or _architecture(hf)
    h, n = hf["hidden_size"], hf["num_attention_heads"]
    d = hf.get("head_dim") or h // n
    if n * d != h:
        raise ConversionError(f"{arch}: num_attention_heads ({n}) x head_dim ({d}) must equal "
                              f"hidden_size ({h}) in warpformer's format")
    kv = hf.get("num_key_value_heads") or n
    window = 0
    if arch == "MistralForCausalLM":
        window = hf.get("sliding_window") or 0
    elif arch == "Qwen2ForCausalLM" and hf.get("use_sliding_window"):
        raise ConversionError(f"{arch}: use_sliding_window (a window on some layers only) is not "
                              "supported")
    qwen = arch == "Qwen2ForCausalLM"
    attn_bias = bool(hf.get("attention_bias", False)) or qwen
    return GptConfig(
        model_name=hf.get("_name_or_path") or _VARIANTS[arch], model_variant="llama",
        head_num=n, size_per_head=d, inter_size=hf["intermediate_size"],
        num_layer=hf["num_hidden_layers"], vocab_size=hf["vocab_size"],
        max_pos_seq_len=hf.get("max_position_embeddings", 2048),
        start_id=token_id(hf, "bos_token_id"), end_id=token_id(hf, "eos_token_id"),
        extra_end_ids=extra_token_ids(hf, "eos_token_id"),
        weight_data_type=data_type, tensor_para_size=tp,
        layernorm_eps=hf.get("rms_norm_eps", 1e-6), layernorm_type="rmsnorm",
        activation_type=hf_activation(hf.get("hidden_act", "silu"), arch),
        use_gated_activation=True, has_positional_encoding=False,
        rotary_embedding_dim=d, rotary_style="half", kv_head_num=kv if kv != n else 0,
        has_attention_bias=attn_bias, has_attention_out_bias=attn_bias and not qwen,
        has_mlp_bias=bool(hf.get("mlp_bias", False)), sliding_window=window,
        **_rope(hf, arch),
    )


def _generation_eos(root: Path, hf: dict[str, Any]) -> dict[str, Any]:
    """``hf`` with ``eos_token_id`` from ``generation_config.json`` when that file sets it: what
    transformers' generate ends rows at (Llama 3 Instruct lists 128001 and 128009 there, while
    config.json has 128009 alone)."""
    path = Path(root) / "generation_config.json"
    if not path.is_file():
        return hf
    try:
        eos = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
    except (OSError, ValueError) as exc:
        raise ConversionError(f"{path}: not readable as JSON ({exc})") from None
    if eos is None:
        return hf
    return ConfigDict({**hf, "eos_token_id": eos}, getattr(hf, "where", str(path)))


def build_plan(root: Path, hf: dict[str, Any], tp: int, data_type: str) -> Plan:
    """Plan converting the LLaMA-style checkpoint under ``root``."""
    arch = _architecture(hf)
    cfg = make_config(_generation_eos(root, hf), tp, data_type, arch)
    ckpt = HfCheckpoint.open(root)
    find_prefix(ckpt.keys(), "model.embed_tokens.weight", ("",))
    rules = list(RULES)
    if cfg.has_attention_bias:
        rules.append(QKV_BIAS)
        if cfg.has_attention_out_bias:
            rules.append(OUT_BIAS)
    if cfg.has_mlp_bias:
        rules += MLP_BIAS
    tasks = expand(rules, cfg.num_layer)
    if not hf.get("tie_word_embeddings", False):
        tasks += expand([LM_HEAD], 0)
    return Plan(cfg, weight_specs(cfg), tasks, ckpt, arch)
