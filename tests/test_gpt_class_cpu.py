"""CPU checks of torch.classes.warpformer.GptModel: registration, config parsing and the weight
validation that runs before anything touches a GPU (presence, kind and shape by name)."""

from __future__ import annotations

import json

import pytest
import torch

import warpformer  # noqa: F401
from warpformer.config import GptConfig
from warpformer.weights import expected_shapes

Make = torch.classes.warpformer.GptModel


def options(max_batch: int = 2, max_seq_len: int = 64, dtype: str = "", tensor_para_rank: int = 0,
            pipeline_para_size: int = 1, pipeline_para_rank: int = 0) -> str:
    """The class's options JSON (what warpformer.options.model_options_json writes)."""
    return json.dumps(dict(max_batch=max_batch, max_seq_len=max_seq_len, dtype=dtype,
                           tensor_para_rank=tensor_para_rank,
                           pipeline_para_size=pipeline_para_size,
                           pipeline_para_rank=pipeline_para_rank))


def config(**kw) -> GptConfig:
    base = dict(head_num=2, size_per_head=64, inter_size=512, num_layer=2, vocab_size=100,
                max_pos_seq_len=64, end_id=2)
    base.update(kw)
    return GptConfig(**base)


def weights(cfg: GptConfig) -> dict[str, torch.Tensor]:
    return {k: torch.randn(s) for k, s in expected_shapes(cfg).items() if k != "lm_head.weight"}


def test_class_scriptable() -> None:
    """TorchScript resolves the class and its methods' schemas (this compiles on CPU)."""

    @torch.jit.script
    def run(m: torch.classes.warpformer.GptModel, ids: torch.Tensor,
            lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        logits = m.forward(ids, lengths)
        out, seq = m.generate(ids, lengths, 4, -1)
        return logits, out, seq, m.memory_bytes() + m.max_batch() + m.max_seq_len()

    graph = str(run.graph)
    assert "prim::CallMethod[name=\"generate\"]" in graph
    assert "prim::CallMethod[name=\"forward\"]" in graph


def test_cpu_weights_rejected_with_clear_message() -> None:
    cfg = config()
    with pytest.raises(RuntimeError, match=r"weight 'wte' must be a CUDA tensor, got device cpu"):
        Make(cfg.to_json(), weights(cfg), options(dtype="fp16"))


def test_missing_and_misshaped_weights_named() -> None:
    cfg = config()
    w = weights(cfg)
    del w["layers.1.attention.dense.bias"]
    with pytest.raises(RuntimeError, match=r"missing weight 'layers.1.attention.dense.bias' "
                                           r"\(shape \[128\]\)"):
        Make(cfg.to_json(), w, options())
    w = weights(cfg)
    w["layers.0.mlp.dense_h_to_4h.weight"] = torch.randn(512, 128)
    with pytest.raises(RuntimeError, match=r"'layers.0.mlp.dense_h_to_4h.weight' must have "
                                           r"shape \[128, 512\] for tensor_para_size 1, "
                                           r"got \[512, 128\]"):
        Make(cfg.to_json(), w, options())
    w = weights(cfg)
    w["wpe"] = torch.zeros(64, 128, dtype=torch.int32)
    with pytest.raises(RuntimeError, match=r"weight 'wpe' must be a floating tensor"):
        Make(cfg.to_json(), w, options())


def test_tensor_parallel_shapes_expected_per_rank() -> None:
    cfg = config(tensor_para_size=2)
    w = {k: torch.randn(s) for k, s in expected_shapes(cfg).items() if k != "lm_head.weight"}
    # rank 1 of 2: shapes are the per-rank ones, so validation reaches the device check
    with pytest.raises(RuntimeError, match=r"must be a CUDA tensor"):
        Make(cfg.to_json(), w, options(tensor_para_rank=1))
    with pytest.raises(RuntimeError, match=r"tensor_para_rank must be in \[0, 2\), got 2"):
        Make(cfg.to_json(), w, options(tensor_para_rank=2))


@pytest.mark.parametrize(
    "text, pattern",
    [
        ("{", r"invalid JSON at offset 1"),
        ('{"head_num": [1]}', r"value of key 'head_num' must be a number, string or boolean"),
        ('{"head_num": 2}', r"required key 'size_per_head' is missing"),
        (config(size_per_head=64).to_json().replace('"size_per_head": 64', '"size_per_head": 40'),
         r"size_per_head must be one of 32, 48, 64, 80, 96, 112, 128, 144, 160, 192, 224, 256 "
         r"\(the attention kernels' head sizes\), got 40"),
        (config().to_json().replace('"num_layer": 2', '"num_layer": 3'),
         r"num_layer \(3\) must be divisible by pipeline_para_size \(2\)"),
    ],
)
def test_config_errors(text: str, pattern: str) -> None:
    with pytest.raises(RuntimeError, match=pattern):
        Make(text, weights(config()), options(pipeline_para_size=2))


def test_bad_dtype_argument() -> None:
    cfg = config()
    w = {k: v.cuda() if torch.cuda.is_available() else v for k, v in weights(cfg).items()}
    with pytest.raises(RuntimeError, match=r"dtype must be one of fp32, fp16, bf16; got 'int8'"):
        Make(cfg.to_json(), w, options(dtype="int8"))


@pytest.mark.parametrize("text, pattern", [
    ('{"max_batch": 2, "prefill_token": 5}',
     r"GptModel options: unknown key 'prefill_token'; known keys: max_batch, max_seq_len, dtype"),
    ('{"prefill_tokens": -1}', r"prefill_tokens must be a positive number of tokens"),
    ('{"cuda_graphs": "no"}', r"'cuda_graphs' must be a boolean"),
    ('{"max_seq_len": 0}', r"max_seq_len must be positive"),
    ('[1]', r"GptModel options: invalid JSON"),
])
def test_options_json_checked_by_name(text: str, pattern: str) -> None:
    # The options are parsed before anything else: TorchScript callers get the same errors.
    with pytest.raises(RuntimeError, match=pattern):
        Make(config().to_json(), weights(config()), text)
