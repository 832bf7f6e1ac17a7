"""Prompt embeddings (GPT.generate(prompt_embeddings=..., inputs_embeds=...)) on CPU through the
reference backend against HF transformers' generate(inputs_embeds=...) on the same weights:
learned positions (GPT-2), a projected narrow embedding (OPT-350m), an embedding norm (BLOOM),
rotary (GPT-J); ragged rows; and the errors of bad requests."""

from __future__ import annotations

import pytest
import torch
from _models import build

import warpformer  # noqa: F401
from warpformer.converters import convert
from warpformer.gpt import GPT

NEW = 8


@pytest.fixture(scope="module", params=["gpt2", "opt-350m", "bloom", "gptj"])
def pair(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"prompt_{request.param}")
    hf = build(request.param, seed=9)
    hf.save_pretrained(root / "hf")
    convert(root / "hf", root / "wf", 1, "fp32")
    gpt = GPT.from_pretrained(root / "wf" / "1-gpu", dtype=torch.float32, max_batch=4,
                              max_seq_len=32, backend="reference")
    return hf, gpt


def _embeddings(hf, b: int, p: int, seed: int) -> torch.Tensor:
    wte = hf.get_input_embeddings().weight
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, p, wte.shape[1], generator=g) * float(wte.detach().std()) * 2


def _hf_tokens(hf, embeds: torch.Tensor) -> list[int]:
    """HF greedy tokens from one row of input embeddings [T, E]."""
    with torch.no_grad():
        out = hf.generate(inputs_embeds=embeds[None], attention_mask=torch.ones(1, len(embeds),
                                                                                dtype=torch.long),
                          max_new_tokens=NEW, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, -NEW:].tolist()


def _agree(ours: list[int], hf_tokens: list[int]) -> bool:
    """Our tokens (ended at end id 0, which HF was not told about) are HF's up to our end."""
    return ours == hf_tokens[:len(ours)] and (len(ours) == NEW or ours[-1] == 0)


def test_prompt_embeddings_equal_hf_inputs_embeds(pair):
    """Soft prompts before the tokens, ragged (row 1 uses 2 of the 3 vectors and fewer tokens):
    each row's greedy tokens equal HF's on inputs_embeds = [vectors; token embeddings]."""
    hf, gpt = pair
    E = _embeddings(hf, 2, 3, seed=1)
    rows = [[5, 17, 42, 9], [7, 3]]
    plen = [3, 2]
    out = gpt.generate(rows, NEW, prompt_embeddings=E, prompt_lengths=plen, end_id=0)
    emb = hf.get_input_embeddings()
    V = gpt.vocab_size
    for b in range(2):
        with torch.no_grad():
            full = torch.cat([E[b, :plen[b]], emb(torch.tensor(rows[b]))])
        assert _agree(out.tokens[b][0], _hf_tokens(hf, full)), b
        # The vectors' positions hold the ids vocab_size + j (row-major over the rows).
        first = sum(plen[:b])
        assert out.sequences[b, 0, :plen[b]].tolist() == list(range(V + first, V + first +
                                                                    plen[b]))
        assert int(out.input_lengths[b]) == plen[b] + len(rows[b])


def test_inputs_embeds_alone(pair):
    """The whole prompt as embeddings (HF's inputs_embeds), ragged through prompt_lengths."""
    hf, gpt = pair
    E = _embeddings(hf, 2, 5, seed=2)
    out = gpt.generate(None, NEW, inputs_embeds=E, prompt_lengths=[5, 3], end_id=0)
    for b, n in enumerate([5, 3]):
        assert _agree(out.tokens[b][0], _hf_tokens(hf, E[b, :n])), b


def test_prompt_embedding_errors(pair):
    hf, gpt = pair
    width = gpt.config.embedding_dim
    E = torch.zeros(1, 2, width)
    with pytest.raises(ValueError, match=rf"last dimension, got {width + 1}"):
        gpt.generate([[1, 2]], 2, prompt_embeddings=torch.zeros(1, 2, width + 1))
    with pytest.raises(ValueError, match=r"must be a floating tensor \[B, P, "):
        gpt.generate([[1, 2]], 2, prompt_embeddings=torch.zeros(2, width))
    with pytest.raises(ValueError, match=r"prompt_lengths must be 1 values in \[0, 2\], got \[3\]"):
        gpt.generate([[1, 2]], 2, prompt_embeddings=E, prompt_lengths=[3])
    with pytest.raises(ValueError, match=r"prompt_lengths needs prompt_embeddings"):
        gpt.generate([[1, 2]], 2, prompt_lengths=[1])
    with pytest.raises(ValueError, match=r"inputs_embeds replaces input_ids"):
        gpt.generate([[1, 2]], 2, inputs_embeds=E)
    with pytest.raises(ValueError, match=r"prompt_embeddings has 1 rows; input_ids has 2"):
        gpt.generate([[1, 2], [3]], 2, prompt_embeddings=E)
    with pytest.raises(ValueError, match=r"input length 2 \+ max_new_tokens 31"):
        gpt.generate(None, 31, inputs_embeds=E)
    # The engine-level rules: a table id needs its table; no table in a session.
    eng = gpt.engine
    V = gpt.vocab_size
    ids, lens = torch.tensor([[V, 1]], dtype=torch.int32), torch.tensor([2], dtype=torch.int32)
    with pytest.raises((RuntimeError, ValueError), match=r"input_ids"):
        eng.decode(ids, lens, 2, {})
    handle = eng.open_session(1, 16)
    with pytest.raises(RuntimeError, match=r"'prompt_table' cannot be combined with 'session'"):
        eng.decode(ids, lens, 2, {"session": torch.tensor(handle),
                                  "prompt_table": torch.zeros(1, width)})
    with pytest.raises(RuntimeError, match=rf"word embedding width {width}, got {width + 2}"):
        eng.decode(ids, lens, 2, {"prompt_table": torch.zeros(1, width + 2)})
    eng.close_session(handle)
    # Still usable, and a table id decodes with its table.
    out = eng.decode(ids, lens, 2, {"prompt_table": torch.zeros(1, width)})
    assert out["output_ids"][0, 0, 0] == V
