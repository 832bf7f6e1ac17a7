"""warpformer.options: the engine options' checks, their JSON for the C++ class, and the
from_pretrained keywords that build them."""

from __future__ import annotations

import json

import pytest
import torch
from _models import build

from warpformer.converters import convert
from warpformer.gpt import GPT
from warpformer.options import EngineOptions, model_options_json


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(cuda_graphs=1), r"cuda_graphs must be True or False, got 1"),
    (dict(peer_allreduce="no"), r"peer_allreduce must be True or False, got 'no'"),
    (dict(prefill_tokens=0), r"prefill_tokens must be None or a number of tokens in \[1, "),
    (dict(prefill_tokens=2**31), r"prefill_tokens must be None or a number of tokens"),
    (dict(prefill_tokens=True), r"prefill_tokens must be None or a number of tokens"),
    (dict(prefill_tokens=1.5), r"prefill_tokens must be None or a number of tokens"),
    (dict(gemm_config=3), r"gemm_config must be a path or None, got 3"),
])
def test_bad_options_are_named(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        EngineOptions(**kwargs)


def test_options_json_holds_the_class_keys():
    text = model_options_json(EngineOptions(cuda_graphs=False, prefill_tokens=512,
                                            gemm_config="t.tsv", peer_allreduce=False),
                              max_batch=4, max_seq_len=100, dtype="fp16", tensor_para_rank=1,
                              pipeline_para_size=2, pipeline_para_rank=1)
    assert json.loads(text) == dict(max_batch=4, max_seq_len=100, dtype="fp16",
                                    tensor_para_rank=1, pipeline_para_size=2,
                                    pipeline_para_rank=1, gemm_config="t.tsv",
                                    cuda_graphs=False, prefill_tokens=512)
    # Defaults: graphs on, the engine's own group size (0), heuristics unless the env file.
    d = json.loads(model_options_json(EngineOptions(), max_batch=1, max_seq_len=8, dtype="fp32"))
    assert d["cuda_graphs"] is True and d["prefill_tokens"] == 0 and d["gemm_config"] == ""


def test_from_pretrained_checks_the_option_keywords(tmp_path):
    build("gpt2").save_pretrained(tmp_path / "hf")
    convert(tmp_path / "hf", tmp_path / "wf", 1, "fp32")
    with pytest.raises(ValueError, match="prefill_tokens must be None or a number of tokens"):
        GPT.from_pretrained(tmp_path / "wf", dtype=torch.float32, backend="reference",
                            prefill_tokens=-4)
    with pytest.raises(ValueError, match="cuda_graphs must be True or False"):
        GPT.from_pretrained(tmp_path / "wf", dtype=torch.float32, backend="reference",
                            cuda_graphs="off")
    gpt = GPT.from_pretrained(tmp_path / "wf", dtype=torch.float32, backend="reference",
                              cuda_graphs=False, prefill_tokens=64)
    assert gpt.generate([[5, 6, 7]], 2).tokens
