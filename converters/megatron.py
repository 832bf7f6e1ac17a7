"""Megatron-LM GPT checkpoints (``mp_rank_XX[_YYY]/model_optim_rng.pt``, legacy layout).

The trained tensor-parallel (TP) shards are merged into full tensors by :class:`MegatronReader`
and the writer re-splits them for the requested TP size, so any trained TP converts to any
inference TP. Pipeline stages (``_YYY``) hold contiguous layer ranges with local indices.

Fused QKV rows of one TP shard come in the layout of the checkpoint version:
``0``: ``[3, heads, d]``; ``1.0``: ``[heads, d, 3]``; ``2.0`` and later: ``[heads, 3, d]``.
Each shard is brought to ``[3, heads, d]`` before the shards are concatenated on the head axis.

Activation: Megatron's fused bias-GeLU (``bias_gelu_fusion``, on by default) and ``openai_gelu``
both compute the tanh form, so those checkpoints get ``gelu_tanh``; only models trained with the
fusion off and ``openai_gelu`` off used exact erf GeLU (``gelu_erf``).
"""

from __future__ import annotations

import argparse
import contextlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from warpformer.config import GptConfig
from warpformer.weights import weight_specs

from .errors import ConversionError
from .mapping import ConfigDict, Plan, Rule, copy, expand, linear, qkv_bias_from_fused

ARCHITECTURES = ("Megatron-LM GPT",)
_RANK_DIR = re.compile(r"mp_rank_(\d{2})(?:_(\d{3}))?")
_FILE_NAMES = ("model_optim_rng.pt", "model_rng.pt")


def _qkv_weight(cfg: GptConfig, w: torch.Tensor) -> torch.Tensor:
    """Merged QKV ``nn.Linear`` ``[3h, h]`` with rows ``[3, heads, d]`` -> ``[h, 3, h]``."""
    return w.t().reshape(cfg.hidden_size, 3, cfg.hidden_size)


L = "layers.{i}."
RULES = [
    Rule("wte", ("embedding.word_embeddings.weight",), copy),
    Rule("wpe", ("embedding.position_embeddings.weight",), copy),
    Rule("layers.{i}.input_layernorm.weight", (L + "input_layernorm.weight",), copy),
    Rule("layers.{i}.input_layernorm.bias", (L + "input_layernorm.bias",), copy),
    Rule("layers.{i}.attention.query_key_value.weight", (L + "attention.query_key_value.weight",),
         _qkv_weight),
    Rule("layers.{i}.attention.query_key_value.bias", (L + "attention.query_key_value.bias",),
         qkv_bias_from_fused),
    Rule("layers.{i}.attention.dense.weight", (L + "attention.dense.weight",), linear),
    Rule("layers.{i}.attention.dense.bias", (L + "attention.dense.bias",), copy),
    Rule("layers.{i}.post_attention_layernorm.weight", (L + "post_attention_layernorm.weight",),
         copy),
    Rule("layers.{i}.post_attention_layernorm.bias", (L + "post_attention_layernorm.bias",), copy),
    Rule("layers.{i}.mlp.dense_h_to_4h.weight", (L + "mlp.dense_h_to_4h.weight",), linear),
    Rule("layers.{i}.mlp.dense_h_to_4h.bias", (L + "mlp.dense_h_to_4h.bias",), copy),
    Rule("layers.{i}.mlp.dense_4h_to_h.weight", (L + "mlp.dense_4h_to_h.weight",), linear),
    Rule("layers.{i}.mlp.dense_4h_to_h.bias", (L + "mlp.dense_4h_to_h.bias",), copy),
    Rule("final_layernorm.weight", ("final_layernorm.weight",), copy),
    Rule("final_layernorm.bias", ("final_layernorm.bias",), copy),
]
LM_HEAD = Rule("lm_head.weight", ("output_layer.weight",), copy)

# How a (normalised) Megatron tensor is split across trained TP ranks: concat axis, or None for
# replicated (take rank 0). QKV gets its own per-head handling.
_COLUMN = ("mlp.dense_h_to_4h.weight", "mlp.dense_h_to_4h.bias")
_ROW = ("attention.dense.weight", "mlp.dense_4h_to_h.weight")


def checkpoint_dir(root: Path) -> Path | None:
    """The folder holding the ``mp_rank_*`` dirs (following ``latest_checkpointed_iteration.txt``),
    or ``None`` if ``root`` is not a Megatron checkpoint."""
    tracker = root / "latest_checkpointed_iteration.txt"
    if tracker.is_file():
        it = tracker.read_text().strip()
        if it != "release" and not it.isdigit():
            raise ConversionError(f"{tracker}: expected an iteration number or 'release', "
                                  f"got {it!r}")
        sub = root / ("release" if it == "release" else f"iter_{int(it):07d}")
        if not sub.is_dir():
            raise ConversionError(f"{tracker} points at {sub.name}, which does not exist")
        root = sub
    if any(_RANK_DIR.fullmatch(p.name) for p in root.glob("mp_rank_*")):
        return root
    return None


def _rank_files(root: Path) -> tuple[dict[tuple[int, int], Path], int, int]:
    files: dict[tuple[int, int], Path] = {}
    for d in root.glob("mp_rank_*"):
        m = _RANK_DIR.fullmatch(d.name)
        if not m:
            continue
        path = next((d / n for n in _FILE_NAMES if (d / n).is_file()), None)
        if path is None:
            raise ConversionError(f"missing checkpoint file {d / _FILE_NAMES[0]}")
        files[(int(m.group(1)), int(m.group(2) or 0))] = path
    tp = max(t for t, _ in files) + 1
    pp = max(p for _, p in files) + 1
    for t in range(tp):
        for p in range(pp):
            if (t, p) not in files:
                name = f"mp_rank_{t:02d}" + (f"_{p:03d}" if pp > 1 else "")
                raise ConversionError(f"missing checkpoint file {root / name / _FILE_NAMES[0]}")
    return files, tp, pp


def _load(path: Path, allow_unsafe_pickle: bool) -> dict[str, Any]:
    """``torch.load`` with ``weights_only`` (Namespace and numpy RNG state allowed) and mmap."""
    import numpy as np

    safe = [argparse.Namespace, np.ndarray, np.dtype, type(np.dtype(np.uint32)),
            getattr(np, "_core", np).multiarray._reconstruct]
    if hasattr(torch.serialization, "safe_globals"):
        allow = torch.serialization.safe_globals(safe)
    else:  # torch 2.4: process-wide allow-list
        torch.serialization.add_safe_globals(safe)
        allow = contextlib.nullcontext()
    try:
        with allow:
            try:
                return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as exc:
                if "mmap" not in str(exc):
                    raise
                return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        if "weights_only" in str(exc) or "Unsupported global" in str(exc):
            if allow_unsafe_pickle:
                return torch.load(path, map_location="cpu", weights_only=False)
            raise ConversionError(
                f"{path}: the checkpoint pickles objects outside the safe list ({exc}); if you "
                "trust it, pass --allow-unsafe-pickle") from None
        raise ConversionError(f"{path}: cannot read Megatron checkpoint (truncated or corrupt?): "
                              f"{type(exc).__name__}: {exc}") from None


def _flatten(tree: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    if isinstance(tree, torch.Tensor):
        out[prefix[:-1]] = tree
    elif isinstance(tree, dict):
        for k, v in tree.items():
            out.update(_flatten(v, f"{prefix}{k}."))
    return out


def _normalise(sd: dict[str, Any], path: Path) -> dict[str, torch.Tensor]:
    """Megatron's nested ``model.language_model`` dict -> flat names (``encoder``/``transformer``
    prefixes dropped, ``self_attention`` spelled ``attention``)."""
    model = sd.get("model")
    if model is None:
        keys = ", ".join(k for k in sd if k.startswith("model"))
        raise ConversionError(f"{path}: no 'model' entry (virtual pipeline checkpoints with "
                              f"{keys or 'no model'} entries are not supported)")
    flat = _flatten(model.get("language_model", model))
    out = {}
    for name, t in flat.items():
        name = re.sub(r"^(encoder|transformer)\.", "", name)
        out[name.replace(".self_attention.", ".attention.")] = t
    return out


@dataclass(frozen=True)
class MegatronSource:
    """Picklable description of a Megatron checkpoint; ``reader()`` merges shards on demand."""

    files: dict[tuple[int, int], Path]
    trained_tp: int
    trained_pp: int
    layers_per_stage: int
    version: float
    head_num: int
    allow_unsafe_pickle: bool

    def reader(self) -> MegatronReader:
        """A reader returning merged (full) tensors by normalised name."""
        return MegatronReader(self)


class MegatronReader:
    """Merges the trained TP shards of one tensor into the full tensor (``get``)."""

    def __init__(self, src: MegatronSource) -> None:
        self.src = src
        self._sd: dict[tuple[int, int], dict[str, torch.Tensor]] = {}

    def _shard(self, tp: int, pp: int, name: str) -> torch.Tensor:
        sd = self._sd.get((tp, pp))
        if sd is None:
            path = self.src.files[(tp, pp)]
            sd = self._sd[(tp, pp)] = _normalise(_load(path, self.src.allow_unsafe_pickle), path)
        if name not in sd:
            raise ConversionError(f"{self.src.files[(tp, pp)]}: checkpoint lacks tensor {name!r}")
        return sd[name]

    def _qkv(self, t: torch.Tensor) -> torch.Tensor:
        """One shard's QKV rows -> ``[3, heads_local, d, ...]``."""
        nl = self.src.head_num // self.src.trained_tp
        rest = t.shape[1:]
        d = t.shape[0] // (3 * nl)
        if self.src.version == 0:
            return t.reshape(3, nl, d, *rest)
        if self.src.version == 1.0:
            return t.reshape(nl, d, 3, *rest).movedim(2, 0)
        return t.reshape(nl, 3, d, *rest).transpose(0, 1)

    def _locate(self, name: str) -> tuple[int, str, str]:
        """``(pipeline stage, name within the stage's files, name without the layer prefix)``."""
        m = re.fullmatch(r"layers\.(\d+)\.(.+)", name)
        if m:
            g, leaf = int(m.group(1)), m.group(2)
            pp, local = divmod(g, self.src.layers_per_stage)
            return pp, f"layers.{local}.{leaf}", leaf
        last = name.startswith(("final_layernorm", "output_layer"))
        return (self.src.trained_pp - 1 if last else 0), name, name

    def where(self, name: str) -> str:
        """The rank files the shards of ``name`` come from (for messages)."""
        pp = self._locate(name)[0]
        return ", ".join(str(self.src.files[(t, pp)]) for t in range(self.src.trained_tp))

    def get(self, name: str) -> torch.Tensor:
        """Full tensor ``name`` (Megatron ``[out, in]`` orientation, global layer index) on CPU in
        the checkpoint's dtype, merged from the trained TP shards."""
        src = self.src
        pp, key, leaf = self._locate(name)
        shards = [self._shard(t, pp, key) for t in range(src.trained_tp)]
        if leaf.startswith("attention.query_key_value"):
            merged = torch.cat([self._qkv(s) for s in shards], dim=1)
            return merged.reshape(-1, *shards[0].shape[1:])
        if leaf in _COLUMN or name in ("embedding.word_embeddings.weight", "output_layer.weight"):
            return torch.cat(shards, dim=0)
        if leaf in _ROW:
            return torch.cat(shards, dim=1)
        return shards[0]


def build_plan(root: Path, tp: int, data_type: str, allow_unsafe_pickle: bool = False) -> Plan:
    """Plan converting the Megatron checkpoint under ``root`` to ``tp`` ranks."""
    ckdir = checkpoint_dir(root)
    if ckdir is None:
        raise ConversionError(f"{root}: no mp_rank_* folders (not a Megatron checkpoint)")
    files, trained_tp, trained_pp = _rank_files(ckdir)
    sd0 = _load(files[(0, 0)], allow_unsafe_pickle)
    args = sd0.get("args")
    if args is None:
        raise ConversionError(f"{files[(0, 0)]}: no 'args' entry; cannot infer the model shape")
    a = ConfigDict(vars(args), f"{files[(0, 0)]} (its 'args')")
    version = float(sd0.get("checkpoint_version", 0) or 0)
    cfg = make_config(a, tp, data_type)
    wte = _normalise(sd0, files[(0, 0)])["embedding.word_embeddings.weight"]
    cfg.vocab_size = wte.shape[0] * trained_tp
    ckpt_tp = a.get("tensor_model_parallel_size", a.get("model_parallel_size", trained_tp))
    if ckpt_tp != trained_tp:
        raise ConversionError(f"{ckdir}: args say tensor_model_parallel_size={ckpt_tp} but "
                              f"{trained_tp} mp_rank folders were found")
    if cfg.num_layer % trained_pp or cfg.head_num % trained_tp:
        raise ConversionError(f"{ckdir}: num_layers {cfg.num_layer} / heads {cfg.head_num} do "
                              f"not divide by the trained pp {trained_pp} / tp {trained_tp}")
    cfg.validate()
    src = MegatronSource(files, trained_tp, trained_pp, cfg.num_layer // trained_pp, version,
                         cfg.head_num, allow_unsafe_pickle)
    tasks = expand(RULES, cfg.num_layer)
    if a.get("untie_embeddings_and_output_weights", False):
        tasks += expand([LM_HEAD], 0)
    desc = f"Megatron GPT v{version:g} tp{trained_tp} pp{trained_pp}"
    return Plan(cfg, weight_specs(cfg), tasks, src, desc)


def make_config(a: dict[str, Any], tp: int, data_type: str) -> GptConfig:
    """GptConfig from a Megatron ``args`` namespace (as a dict)."""
    unsupported = {
        "swiglu": a.get("swiglu", False),
        "position_embedding_type != learned_absolute":
            a.get("position_embedding_type", "learned_absolute") != "learned_absolute",
        "normalization != LayerNorm": a.get("normalization", "LayerNorm") != "LayerNorm",
        "apply_residual_connection_post_layernorm":
            a.get("apply_residual_connection_post_layernorm", False),
        "group_query_attention": a.get("group_query_attention", False),
        "add_bias_linear = False": not a.get("add_bias_linear", True),
    }
    bad = [k for k, v in unsupported.items() if v]
    if bad:
        raise ConversionError(f"Megatron checkpoint uses unsupported options: {', '.join(bad)}")
    h, n = a["hidden_size"], a["num_attention_heads"]
    tanh = a.get("openai_gelu", False) or a.get("bias_gelu_fusion", True)
    vocab = a.get("padded_vocab_size") or 1
    end = 50256 if vocab > 50256 else 0
    return GptConfig(
        model_name="megatron-gpt", model_variant="megatron",
        head_num=n, size_per_head=h // n, inter_size=a.get("ffn_hidden_size") or 4 * h,
        num_layer=a["num_layers"], vocab_size=vocab, max_pos_seq_len=a["max_position_embeddings"],
        start_id=end, end_id=end, weight_data_type=data_type, tensor_para_size=tp,
        layernorm_eps=a.get("layernorm_epsilon", 1e-5),
        activation_type="gelu_tanh" if tanh else "gelu_erf",
    )
