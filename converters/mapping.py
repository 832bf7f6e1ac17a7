"""Declarative name maps: the pieces every source module is built from.

A source module lists :class:`Rule` s — target on-disk name, source tensor name(s), transform —
with ``{i}`` standing for the layer index. :func:`expand` turns them into one :class:`Task` per
target tensor. Transforms are module-level functions ``fn(config, *tensors) -> tensor`` that return
the full, unsplit tensor in on-disk layout (see :func:`warpformer.weights.weight_specs`); the
writer casts, splits and writes it. Transforms keep the dtype they are given (the checkpoint's);
``h`` below is ``cfg.hidden_size``. Transforms here cover the layouts HF and Megatron use.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from warpformer.config import GptConfig, normalize_activation
from warpformer.weights import WeightSpec

from .errors import ConversionError

__all__ = [
    "ConfigDict", "Rule", "Task", "Plan", "expand", "find_prefix", "hf_activation",
    "read_hf_config",
    "copy", "linear", "qkv_from_separate", "qkv_bias_from_separate", "qkv_from_fused",
    "qkv_bias_from_fused", "qkv_from_head_interleaved", "qkv_bias_from_head_interleaved",
]

Transform = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class Rule:
    """``target`` (on-disk name, ``{i}`` = layer) <- ``transform(config, *sources)``.

    A source ``"a|b"`` lists alternative names: the first one present is read."""

    target: str
    sources: tuple[str, ...]
    transform: Transform


@dataclass(frozen=True)
class Task:
    """One target tensor to produce (a rule with the layer index and source prefix filled in)."""

    target: str
    sources: tuple[str, ...]
    transform: Transform


@dataclass
class Plan:
    """Everything the writer needs: the config to write, the expected tensors, the tasks and a
    picklable ``source`` whose ``reader()`` returns an object with ``get(name) -> Tensor``."""

    config: GptConfig
    specs: dict[str, WeightSpec]
    tasks: list[Task]
    source: Any
    description: str = ""
    file_prefix: str = "model."  # of every file name (weights.file_name)
    # The file table when it differs from ``specs`` (weight-only quantized: stored_specs).
    stored: dict[str, WeightSpec] | None = None


def expand(rules: Sequence[Rule], num_layers: int, prefix: str = "") -> list[Task]:
    """Tasks for ``rules``: layer rules (``{i}`` in target) once per layer, others once."""
    tasks = []
    for rule in rules:
        layers = range(num_layers) if "{i}" in rule.target else [None]
        for i in layers:
            tasks.append(Task(
                rule.target.format(i=i),
                tuple(prefix + s.format(i=i) for s in rule.sources),
                rule.transform,
            ))
    return tasks


def find_prefix(keys: Sequence[str], anchor: str, candidates: Sequence[str]) -> str:
    """The prefix among ``candidates`` (e.g. ``"transformer."``, ``""``) under which ``anchor``
    exists: HF checkpoints saved from the base model lack the task model's prefix."""
    keyset = set(keys)
    for prefix in candidates:
        if prefix + anchor in keyset:
            return prefix
    raise ConversionError(
        f"checkpoint lacks tensor {anchor!r} (looked under prefixes "
        f"{', '.join(repr(p) for p in candidates)}); is this the right architecture?"
    )


class ConfigDict(dict):
    """A source's configuration (HF ``config.json``, Megatron ``args``) whose ``[key]`` lookup of a
    missing key raises :class:`ConversionError` naming the key and ``where`` it should be, so a
    required key (``hf["n_head"]``) needs no check of its own; ``get`` keeps its default."""

    def __init__(self, values: dict[str, Any], where: str) -> None:
        super().__init__(values)
        self.where = where

    def __missing__(self, key: str) -> Any:
        raise ConversionError(f"{self.where}: required key {key!r} is missing")


def read_hf_config(root: Path) -> ConfigDict:
    """The parsed ``config.json`` of a HF checkpoint folder (a :class:`ConfigDict`)."""
    path = root / "config.json"
    try:
        values = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConversionError(f"{path}: cannot read config.json ({exc})") from None
    if not isinstance(values, dict):
        raise ConversionError(f"{path}: not a JSON object")
    return ConfigDict(values, str(path))


def hf_activation(name: str, where: str) -> str:
    """Our activation name for a HF ``activation_function``/``hidden_act`` string.

    HF ``gelu`` is the exact erf form (unlike FT's legacy ``Gelu``), so it is mapped here and
    not through :func:`warpformer.config.normalize_activation`.
    """
    key = str(name).lower()
    if key == "gelu":
        return "gelu_erf"
    try:
        return normalize_activation(key)
    except ValueError:
        raise ConversionError(f"{where}: activation {name!r} is not supported") from None


# --------------------------------------------------------------------------- transforms
def copy(cfg: GptConfig, t: torch.Tensor) -> torch.Tensor:
    """Unchanged, any shape and dtype (norms, biases, embeddings)."""
    return t


def linear(cfg: GptConfig, w: torch.Tensor) -> torch.Tensor:
    """``nn.Linear`` weight ``[out, in]`` -> kernel ``[in, out]`` (a transposed view, same
    dtype)."""
    return w.t()


def qkv_from_separate(cfg: GptConfig, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
                      ) -> torch.Tensor:
    """Three ``nn.Linear`` weights ``[h, h]`` -> ``[h, 3, h]``, same dtype."""
    return torch.stack((q.t(), k.t(), v.t()), dim=1)


def qkv_bias_from_separate(cfg: GptConfig, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
                           ) -> torch.Tensor:
    """Three biases ``[h]`` -> ``[3, h]``, same dtype."""
    return torch.stack((q, k, v))


def qkv_from_fused(cfg: GptConfig, w: torch.Tensor) -> torch.Tensor:
    """Fused ``[in=h, out=3h]`` kernel (GPT-2 Conv1D), outputs Q|K|V -> ``[h, 3, h]``, same
    dtype."""
    return w.reshape(cfg.hidden_size, 3, cfg.hidden_size)


def qkv_bias_from_fused(cfg: GptConfig, b: torch.Tensor) -> torch.Tensor:
    """Fused bias ``[3h]`` ordered Q|K|V -> ``[3, h]``, same dtype."""
    return b.reshape(3, cfg.hidden_size)


def qkv_from_head_interleaved(cfg: GptConfig, w: torch.Tensor) -> torch.Tensor:
    """``nn.Linear`` ``[3h, h]`` whose rows are ``[heads, 3, d]`` (BLOOM, NeoX, Megatron v2+)
    -> ``[h, 3, h]`` with all Q heads, then K, then V; same dtype."""
    n, d, h = cfg.head_num, cfg.size_per_head, cfg.hidden_size
    return w.reshape(n, 3, d, h).permute(3, 1, 0, 2).reshape(h, 3, h)


def qkv_bias_from_head_interleaved(cfg: GptConfig, b: torch.Tensor) -> torch.Tensor:
    """Bias ``[3h]`` ordered ``[heads, 3, d]`` -> ``[3, h]``, same dtype."""
    n, d = cfg.head_num, cfg.size_per_head
    return b.reshape(n, 3, d).transpose(0, 1).reshape(3, n * d)


def token_id(hf: dict[str, Any], key: str, default: int = 0) -> int:
    """A special-token id from a HF config: the first one in ``[0, vocab_size)`` if it is a list,
    ``default`` if unset.

    HF accepts ids outside the vocabulary with a warning (tiny test models keep GPT-2's 50256 with
    a small vocabulary). Its generate can never emit such an id, so a HF row never ends on it; the
    engine needs an in-range id, so we take ``vocab_size - 1`` and warn (``docs/FORMAT.md``).
    """
    value = hf.get(key)
    values = [v for v in (value if isinstance(value, list) else [value]) if v is not None]
    if not values:
        return default
    vocab = int(hf["vocab_size"])
    for v in values:
        if 0 <= int(v) < vocab:
            return int(v)
    hint = "; pass end_id= to generate to stop on another id" if key.startswith("eos") else ""
    warnings.warn(f"{getattr(hf, 'where', 'config')}: {key} = {value} is outside the vocabulary "
                  f"[0, {vocab}) (HF only warns, and its generate never emits such an id); "
                  f"converting with {vocab - 1} (vocab_size - 1) instead{hint}", UserWarning,
                  stacklevel=2)
    return vocab - 1


def extra_token_ids(hf: dict[str, Any], key: str) -> str:
    """The in-vocabulary ids of a HF config's id list after the one :func:`token_id` takes,
    comma-separated ("" for a single id): Llama 3 Instruct's further end tokens."""
    value = hf.get(key)
    if not isinstance(value, list):
        return ""
    vocab = int(hf["vocab_size"])
    first = token_id(hf, key)
    rest = [int(v) for v in value if v is not None and 0 <= int(v) < vocab and int(v) != first]
    return ",".join(str(v) for v in dict.fromkeys(rest))


def drop_rows(count: int) -> Transform:
    """Transform dropping the first ``count`` rows (OPT's position-embedding offset):
    ``[rows, ...]`` -> ``[rows - count, ...]``, same dtype (a view)."""
    return _DropRows(count)


@dataclass(frozen=True)
class _DropRows:
    count: int

    def __call__(self, cfg: GptConfig, t: torch.Tensor) -> torch.Tensor:
        return t[self.count:]
