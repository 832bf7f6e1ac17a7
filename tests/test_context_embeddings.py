"""Hidden states as generation outputs (issue 53: FT's context_embeddings, and the states the
generated tokens were chosen from) on CPU through the reference backend, against HF
transformers on the same weights in fp32: GPT-2, OPT-350m (project_out: ours are the states
before it), BLOOM, GPT-J, GPT-NeoX and Llama; ragged batches, rows ending early, sampling,
streaming and sessions; and the refused combinations. (The CUDA engine against the reference:
tests/gpu/test_context_embeddings_engine.py.)"""

from __future__ import annotations

import pytest
import torch
import transformers
from _models import build, randomize

import warpformer  # noqa: F401
from warpformer.converters import convert
from warpformer.gpt import GPT

NEW = 6
ROWS = [[5, 17, 42, 9, 33], [7, 3], [60, 61, 62, 11, 12, 13, 14]]
TOL = dict(rtol=1e-4, atol=1e-5)


def _llama() -> transformers.PreTrainedModel:
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=48,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64,
                                   bos_token_id=1, eos_token_id=2)
    cfg._attn_implementation = "eager"
    torch.manual_seed(5)
    return randomize(transformers.LlamaForCausalLM(cfg), seed=5)


@pytest.fixture(scope="module",
                params=["gpt2", "opt-350m", "bloom", "gptj", "gptneox-parallel", "llama"])
def pair(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"hidden_{request.param}")
    hf = _llama() if request.param == "llama" else build(request.param, seed=3)
    hf.save_pretrained(root / "hf")
    convert(root / "hf", root / "wf", 1, "fp32")
    gpt = GPT.from_pretrained(root / "wf" / "1-gpu", dtype=torch.float32, max_batch=4,
                              max_seq_len=32, backend="reference")
    return hf, gpt


def _as_hf(hf, states: torch.Tensor) -> torch.Tensor:
    """Our final hidden states as HF reports its last hidden state: OPT's decoder reports its
    output after project_out (ours are before it); the other families report ours."""
    project_out = getattr(getattr(getattr(hf, "model", None), "decoder", None), "project_out",
                          None)
    if project_out is None:
        return states
    with torch.no_grad():
        return project_out(states)


def _hf_last_hidden(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0]


def test_context_embeddings_equal_hf(pair):
    """A ragged batch: each row's states equal HF's hidden_states[-1] of the row alone; zeros past
    each row's length; [B, S, hidden_size] in the model dtype."""
    hf, gpt = pair
    out = gpt.generate(ROWS, NEW, return_context_embeddings=True)
    ctx = out.context_embeddings
    S = max(map(len, ROWS))
    assert ctx.shape == (len(ROWS), S, gpt.config.hidden_size) and ctx.dtype == torch.float32
    assert out.hidden_states is None
    for b, row in enumerate(ROWS):
        torch.testing.assert_close(_as_hf(hf, ctx[b, :len(row)]), _hf_last_hidden(hf, row), **TOL)
        assert not ctx[b, len(row):].any(), b
    # Beam search returns them too (one per batch entry), and the same.
    beams = gpt.generate(ROWS, NEW, num_beams=2, return_context_embeddings=True)
    torch.testing.assert_close(beams.context_embeddings, ctx, rtol=0, atol=0)


def test_hidden_states_equal_hf_generate(pair):
    """Greedy, per-row end ids chosen so that row 1 ends early: column i of each row equals HF
    generate(output_hidden_states=True)'s hidden_states[i][-1][:, -1] up to the row's end, and
    is zero after it; the tokens are HF's."""
    hf, gpt = pair
    theirs = []
    for row in ROWS:
        with torch.no_grad():
            g = hf.generate(torch.tensor([row]), max_new_tokens=NEW, do_sample=False,
                            output_hidden_states=True, return_dict_in_generate=True,
                            eos_token_id=None, pad_token_id=0)
        theirs.append((g.sequences[0, len(row):].tolist(),
                       torch.stack([h[-1][0, -1] for h in g.hidden_states])))
    # row 1 ends early, at its first new token after the first; the others at an id their rows
    # never produce
    ends = [next(t for t in range(gpt.vocab_size) if t not in tokens) for tokens, _ in theirs]
    first = theirs[1][0]
    ends[1] = next((t for i, t in enumerate(first) if i > 0 and t not in first[:i]), first[0])
    out = gpt.generate(ROWS, NEW, end_id=ends, return_hidden_states=True)
    hs = out.hidden_states
    assert hs.shape == (len(ROWS), 1, NEW, gpt.config.hidden_size) and hs.dtype == torch.float32
    assert out.context_embeddings is None
    for b, (tokens, states) in enumerate(theirs):
        n = tokens.index(ends[b]) + 1 if ends[b] in tokens else NEW
        assert out.tokens[b][0] == tokens[:n], b
        torch.testing.assert_close(_as_hf(hf, hs[b, 0, :n]), states[:n], **TOL)
        assert not hs[b, 0, n:].any(), b
    assert len(out.tokens[1][0]) < NEW
    # Streaming returns the same outputs at the end.
    stream = gpt.generate_stream(ROWS, NEW, end_id=ends, return_hidden_states=True,
                                 return_context_embeddings=True)
    try:
        while True:
            next(stream)
    except StopIteration as stop:
        final = stop.value
    torch.testing.assert_close(final.hidden_states, hs, rtol=0, atol=0)
    ctx = gpt.generate(ROWS, NEW, return_context_embeddings=True).context_embeddings
    torch.testing.assert_close(final.context_embeddings, ctx, rtol=0, atol=0)


def test_hidden_states_of_sampled_tokens(pair):
    """Sampling: column i is the state at the position of the token fed before generated token i
    in HF's forward over our own output sequence."""
    hf, gpt = pair
    out = gpt.generate(ROWS, NEW, do_sample=True, top_k=0, temperature=1.5, seed=[1, 2, 3],
                       return_hidden_states=True, return_context_embeddings=True)
    for b, row in enumerate(ROWS):
        n = len(out.tokens[b][0])
        seq = out.sequences[b, 0, :len(row) + n - 1].tolist()
        want = _hf_last_hidden(hf, seq)
        torch.testing.assert_close(_as_hf(hf, out.hidden_states[b, 0, :n]),
                                   want[len(row) - 1:], **TOL)
        torch.testing.assert_close(_as_hf(hf, out.context_embeddings[b, :len(row)]),
                                   want[:len(row)], **TOL)


def test_defaults_and_refusals(pair):
    hf, gpt = pair
    for kw in ({}, {"do_sample": True, "seed": 1}, {"num_beams": 2}):
        out = gpt.generate(ROWS, 2, **kw)
        assert out.context_embeddings is None and out.hidden_states is None, kw
    with pytest.raises(ValueError, match=r"option 'return_hidden_states' is not supported when "
                                         r"'beam_width' \(num_beams\) > 1"):
        gpt.generate(ROWS, 2, num_beams=2, return_hidden_states=True)
    eng = gpt.engine
    ids, lens = torch.tensor([[5, 6, 7]], dtype=torch.int32), torch.tensor([3], dtype=torch.int32)
    with pytest.raises(RuntimeError, match=r"'return_hidden_states' is not supported when "
                                           r"'beam_width' \(num_beams\) > 1"):
        eng.decode(ids, lens, 2, {"beam_width": torch.tensor(2),
                                  "return_hidden_states": torch.tensor(1)})
    with gpt.start_session(1, 16) as chat:
        with pytest.raises(ValueError, match=r"'return_context_embeddings' cannot be combined "
                                             r"with 'session'"):
            chat.generate([[5, 6, 7]], 2, return_context_embeddings=True)


def test_hidden_states_in_a_session(pair):
    """A session's second turn (its prompt pass runs the new tokens only) returns the states of
    the same call over the whole history."""
    hf, gpt = pair
    with gpt.start_session(2, 32) as chat:
        chat.generate([[5, 17, 42], [7, 3]], 3)
        history = chat.history
        turn = chat.generate([[9, 33], [11]], NEW, return_hidden_states=True)
    full = [h + n for h, n in zip(history, [[9, 33], [11]], strict=True)]
    alone = gpt.generate(full, NEW, return_hidden_states=True)
    assert turn.tokens == alone.tokens
    torch.testing.assert_close(turn.hidden_states, alone.hidden_states, **TOL)
