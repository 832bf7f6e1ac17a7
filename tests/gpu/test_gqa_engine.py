"""The engine with grouped-query attention (kv_head_num < head_num) against the reference backend
on the same random weights: a GPT-NeoX-style block (pre-norm LayerNorm, "half" rotary on the
whole head) whose QKV holds 8 query heads and 1, 2 or 4 key/value heads, at tensor_para_size 1.
It isolates the attention path from LLaMA's other switches: prompt logits (the context kernels)
and greedy tokens (decode steps, the unfused QKV preparation, CUDA graphs)."""

from __future__ import annotations

import pytest
import torch

import warpformer  # noqa: F401
from warpformer.config import GptConfig
from warpformer.models.gpt import build_gpt_model
from warpformer.reference import GptReference
from warpformer.weights import weight_specs

pytestmark = pytest.mark.gpu


def _config(kv: int) -> GptConfig:
    return GptConfig(head_num=8, size_per_head=64, inter_size=1024, num_layer=2, vocab_size=512,
                     model_variant="gptneox", has_positional_encoding=False,
                     rotary_embedding_dim=64, rotary_style="half", kv_head_num=kv,
                     end_id=511, weight_data_type="fp32")


def _weights(cfg: GptConfig, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, spec in weight_specs(cfg).items():
        if spec.optional:
            continue
        t = torch.randn(*spec.shape, generator=g)
        if name.endswith("layernorm.weight"):
            t = 1 + 0.1 * t
        elif len(spec.shape) == 1:  # biases
            t = 0.1 * t
        elif name != "wte":
            t = t / spec.shape[0] ** 0.5
        out[name] = t
    out["wte"] = out["wte"] * 4  # peaked logits (tied head): greedy without near ties
    return out


@pytest.mark.parametrize("kv", [1, 2, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_grouped_query_engine_equals_reference(kv, dtype):
    cfg = _config(kv)
    w = _weights(cfg, seed=kv)
    ref = GptReference(cfg, {k: v.cuda() for k, v in w.items()})
    engine = build_gpt_model(cfg, {k: v.to(dtype).cuda() for k, v in w.items()}, dtype=dtype,
                             max_batch=4, max_seq_len=96)
    g = torch.Generator().manual_seed(7)
    lengths = [30, 7, 19]
    ids = torch.randint(0, 511, (3, max(lengths)), generator=g).cuda()
    lens = torch.tensor(lengths, dtype=torch.int32).cuda()
    want = ref(ids, lens)
    got = engine.forward(ids.int(), lens).float()
    for b, n in enumerate(lengths):
        err = float((got[b, :n] - want[b, :n]).abs().max() / want[b, :n].abs().max())
        assert err <= (1e-5 if dtype == torch.float32 else 5e-3), (kv, b, err)
    if dtype == torch.float32:
        out, seq = engine.generate(ids.int(), lens, 24, -1)
        ref_out, ref_len = ref.generate_greedy(ids, lens, 24, end_id=cfg.end_id)
        for b, n in enumerate(lengths):
            assert out[b, 0, n:n + 24].tolist() == ref_out[b, n:n + 24].tolist(), (kv, b)
