"""Prompt embeddings on the CUDA engine against HF transformers' generate(inputs_embeds=...) on the
same weights (fp32 greedy tokens, peaked models): soft prompts before the tokens in a ragged
batch, the whole prompt as embeddings, for learned positions (GPT-2), a narrow projected
embedding (OPT-350m style), an embedding norm (BLOOM) and grouped-query rotary (LLaMA); fp16 runs
the same calls to the same first tokens; context log probs skip the table's positions."""

from __future__ import annotations

import pytest
import torch
from _models import ENGINE_TINY, make_hf

import warpformer  # noqa: F401
from warpformer.converters import convert
from warpformer.gpt import GPT

pytestmark = pytest.mark.gpu
NEW = 10


@pytest.fixture(scope="module", params=["gpt2", "opt-350m-style", "bloom", "llama-gqa"])
def pair(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"prompt_{request.param}")
    hf = make_hf(ENGINE_TINY[request.param](), seed=13, peak=4.0)
    hf.save_pretrained(root / "hf")
    convert(root / "hf", root / "wf", 1, "fp32")
    return hf, root / "wf" / "1-gpu"


def _hf_tokens(hf, embeds: torch.Tensor) -> list[int]:
    with torch.no_grad():
        out = hf.generate(inputs_embeds=embeds[None].cuda(),
                          attention_mask=torch.ones(1, len(embeds), dtype=torch.long,
                                                    device="cuda"),
                          max_new_tokens=NEW, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, -NEW:].tolist()


def _agree(ours: list[int], theirs: list[int], end_id: int) -> bool:
    return ours == theirs[:len(ours)] and (len(ours) == NEW or ours[-1] == end_id)


def test_prompt_embeddings_equal_hf(pair):
    hf, folder = pair
    emb = hf.get_input_embeddings()
    g = torch.Generator().manual_seed(4)
    E = torch.randn(3, 4, emb.weight.shape[1], generator=g) * float(emb.weight.detach().std()) * 2
    rows = [[5, 17, 42, 9, 33, 100], [7, 3], [60, 61, 62, 11, 12, 13, 14, 15, 16]]
    plen = [4, 1, 3]
    gpt = GPT.from_pretrained(folder, dtype=torch.float32, max_batch=4, max_seq_len=64)
    end = gpt.end_id
    out = gpt.generate(rows, NEW, prompt_embeddings=E, prompt_lengths=plen)
    for b in range(3):
        with torch.no_grad():
            full = torch.cat([E[b, :plen[b]].cuda(), emb(torch.tensor(rows[b], device="cuda"))])
        assert _agree(out.tokens[b][0], _hf_tokens(hf, full), end), b
    alone = gpt.generate(None, NEW, inputs_embeds=E, prompt_lengths=[4, 2, 3])
    for b, n in enumerate([4, 2, 3]):
        assert _agree(alone.tokens[b][0], _hf_tokens(hf, E[b, :n]), end), b
    # Sampling options take the general path too; context log probs count token positions only
    # (the reference backend on the same folder computes the same sums).
    ref = GPT.from_pretrained(folder, dtype=torch.float32, max_batch=4, max_seq_len=64,
                              backend="reference", device="cuda")
    kw = dict(prompt_embeddings=E, prompt_lengths=plen, return_cum_log_probs=2)
    got, want = gpt.generate(rows, NEW, **kw), ref.generate(rows, NEW, **kw)
    assert got.tokens == want.tokens
    torch.testing.assert_close(got.cum_log_probs.cpu(), want.cum_log_probs.cpu(), rtol=1e-4,
                               atol=1e-3)
    # fp16: the same calls give the same first tokens.
    half = GPT.from_pretrained(folder, dtype=torch.float16, max_batch=4, max_seq_len=64)
    h = half.generate(rows, NEW, prompt_embeddings=E, prompt_lengths=plen)
    assert [t[0][0] for t in h.tokens] == [t[0][0] for t in out.tokens]
