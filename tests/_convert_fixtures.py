"""Fixtures shared by the converter/reference/loader tests (import them into a test module).

``checkpoint(name, fmt)`` saves the tiny random HF model ``name`` once per session in ``fmt``
(``safetensors``, ``bin``, ``safetensors-sharded``, ``bin-sharded``); ``converted(name, tp,
data_type)`` converts its safetensors save once per session. Both return paths under a session
temp dir; tests must not modify them (copy first).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import transformers
from _models import VOCAB, build, hf_logits, save_bin, save_safetensors

from warpformer.converters import convert


@pytest.fixture(scope="session")
def token_ids() -> torch.Tensor:
    """LongTensor [3, 11] of random token ids."""
    return torch.randint(0, VOCAB, (3, 11), generator=torch.Generator().manual_seed(7))


@pytest.fixture(scope="session")
def hf_model() -> Callable[[str], transformers.PreTrainedModel]:
    cache: dict[str, transformers.PreTrainedModel] = {}

    def get(name: str) -> transformers.PreTrainedModel:
        if name not in cache:
            cache[name] = build(name)
        return cache[name]

    return get


@pytest.fixture(scope="session")
def hf_reference(hf_model, token_ids) -> Callable[[str], torch.Tensor]:
    """``name -> HF fp32 logits [3, 11, V]`` for :func:`token_ids`."""
    cache: dict[str, torch.Tensor] = {}

    def get(name: str) -> torch.Tensor:
        if name not in cache:
            cache[name] = hf_logits(hf_model(name), token_ids)
        return cache[name]

    return get


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory, hf_model) -> Callable[[str, str], Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    cache: dict[tuple[str, str], Path] = {}

    def get(name: str, fmt: str = "safetensors") -> Path:
        key = (name, fmt)
        if key not in cache:
            path, model = root / f"{name}-{fmt}", hf_model(name)
            if fmt == "safetensors":
                save_safetensors(model, path)
            elif fmt == "safetensors-sharded":
                save_safetensors(model, path, max_shard_size="20KB")
            elif fmt == "bin":
                save_bin(model, path)
            elif fmt == "bin-sharded":
                save_bin(model, path, shards=3)
            else:
                raise ValueError(fmt)
            cache[key] = path
        return cache[key]

    return get


@pytest.fixture(scope="session")
def converted(tmp_path_factory, checkpoint) -> Callable[..., Path]:
    root = tmp_path_factory.mktemp("converted")
    cache: dict[tuple[str, int, str], Path] = {}

    def get(name: str, tp: int = 1, data_type: str = "fp32") -> Path:
        key = (name, tp, data_type)
        if key not in cache:
            out = root / f"{name}-{data_type}"
            cache[key] = convert(checkpoint(name), out, tp, data_type).output_dir
        return cache[key]

    return get

