"""torch.classes.warpformer.Seq2SeqModel's construction checks, which run before any GPU work:
every weight of the engine's table is looked up by name, its kind and per-rank shape checked, the
config and options parsed; errors name the weight (or key) and the rule."""

from __future__ import annotations

import pytest
import torch

import warpformer  # noqa: F401
from warpformer.options import EngineOptions, model_options_json
from warpformer.t5_config import T5Config, T5StackConfig
from warpformer.t5_weights import t5_weight_specs

OPTIONS = model_options_json(EngineOptions(), max_batch=2, max_seq_len=32, dtype="fp32")


def _config(**kw) -> T5Config:
    stack = dict(vocab_size=40, d_model=64, d_kv=32, d_ff=96, num_layers=1, num_heads=2)
    return T5Config(encoder=T5StackConfig(**stack), decoder=T5StackConfig(**stack), **kw)


def _weights(config: T5Config, tp: int = 1) -> dict[str, torch.Tensor]:
    return {name: torch.zeros(spec.shard_shape(tp))
            for name, spec in t5_weight_specs(config).items()}


def _build(config: T5Config, weights: dict[str, torch.Tensor], options: str = OPTIONS):
    return torch.classes.warpformer.Seq2SeqModel(config.to_json(), weights, options)


def test_every_weight_is_checked_by_name():
    config = _config()
    weights = _weights(config)
    name = "decoder.block.0.layer.1.EncDecAttention.k.weight"
    missing = {k: v for k, v in weights.items() if k != name}
    with pytest.raises(RuntimeError, match=rf"Seq2SeqModel: missing weight '{name}' "
                                           r"\(shape \[64, 64\]\)"):
        _build(config, missing)
    bad = dict(weights, **{name: torch.zeros(64, 32)})
    with pytest.raises(RuntimeError, match=rf"weight '{name}' must have shape \[64, 64\] for "
                                           r"tensor_para_size 1, got \[64, 32\]"):
        _build(config, bad)
    ints = dict(weights, **{name: torch.zeros(64, 64, dtype=torch.int32)})
    with pytest.raises(RuntimeError, match=rf"weight '{name}' must be a floating tensor"):
        _build(config, ints)


def test_cpu_weights_and_parallel_options_are_refused():
    config = _config()
    with pytest.raises(RuntimeError, match=r"must be a CUDA tensor, got device cpu"):
        _build(config, _weights(config))
    pp = model_options_json(EngineOptions(), max_batch=2, max_seq_len=32, dtype="fp32",
                            pipeline_para_size=2)
    with pytest.raises(RuntimeError, match=r"pipeline parallelism is not supported for "
                                           r"encoder-decoder models"):
        _build(config, _weights(config), pp)


def test_head_size_the_kernels_lack_is_refused():
    stack = dict(vocab_size=40, d_model=64, d_kv=8, d_ff=96, num_layers=1, num_heads=2)
    config = T5Config(encoder=T5StackConfig(**stack), decoder=T5StackConfig(**stack))
    with pytest.raises(RuntimeError, match=r"d_kv"):
        _build(config, _weights(config))


@pytest.mark.parametrize("stack_kw, pattern", [
    (dict(relative_attention_num_buckets=2),
     r"relative_attention_num_buckets \(2\) must be >= 4 and below 2 x "
     r"relative_attention_max_distance"),
    (dict(relative_attention_num_buckets=32, relative_attention_max_distance=16),
     r"relative_attention_num_buckets \(32\) must be >= 4 and below 2 x"),
    (dict(relative_attention_max_distance=70000),
     r"relative_attention_max_distance must be <= 65535, got 70000"),
])
def test_relative_bias_the_buckets_cannot_form_is_refused(stack_kw, pattern):
    stack = dict(vocab_size=40, d_model=64, d_kv=32, d_ff=96, num_layers=1, num_heads=2)
    config = T5Config(encoder=T5StackConfig(**stack, **stack_kw),
                      decoder=T5StackConfig(**stack))
    with pytest.raises(RuntimeError, match=pattern):
        _build(config, _weights(config))


def test_cross_attention_wider_than_the_encoder_is_refused():
    enc = dict(vocab_size=40, d_model=64, d_kv=32, d_ff=96, num_layers=1, num_heads=1)
    dec = dict(enc, num_heads=2)
    config = T5Config(encoder=T5StackConfig(**enc), decoder=T5StackConfig(**dec))
    with pytest.raises(RuntimeError, match=r"2 x decoder_num_heads x decoder_d_kv \(128\) must be "
                                           r"<= 3 x encoder_num_heads x encoder_d_kv \(96\)"):
        _build(config, _weights(config))


def test_class_scriptable() -> None:
    """TorchScript resolves the class and its methods' schemas (this compiles on CPU): a
    scripted module can encode and generate with it."""

    @torch.jit.script
    def run(m: torch.classes.warpformer.Seq2SeqModel, ids: torch.Tensor,
            lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        enc = m.encode(ids, lengths)
        options: dict[str, torch.Tensor] = {"beam_width": torch.tensor(2)}
        out = m.decode(ids, lengths, 4, options)
        return enc, out["output_ids"], m.memory_bytes() + m.max_batch() + m.max_seq_len()

    graph = str(run.graph)
    for method in ("encode", "decode"):
        assert f"prim::CallMethod[name=\"{method}\"]" in graph
