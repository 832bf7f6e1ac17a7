"""Hidden states as outputs (return_context_embeddings, return_hidden_states) on the CUDA engine
against the reference backend on the same folder (which tests/test_context_embeddings.py holds
to HF): fp32 closely, fp16 within a loose relative bound; a ragged batch whose prompt pass runs
as a replayed prompt graph; a run of 40 steps, so the decode steps replay a captured graph, with
a row that ends inside it (its later columns stay zero); sampling (the states the engine's own
tokens were chosen from); beam search's context embeddings; a session's turn; and graphs
shared by plain greedy calls around calls with hidden states that keep their results. (Tensor
and pipeline parallelism: tests/gpu/test_parallel_engine.py.)"""

from __future__ import annotations

import pytest
import torch
from _models import ENGINE_TINY, make_hf

import warpformer  # noqa: F401
from warpformer.converters import convert
from warpformer.gpt import GPT

pytestmark = pytest.mark.gpu
NEW = 40  # > 16 steps: the decode steps run from a captured graph
LENGTHS = [11, 4, 19]


@pytest.fixture(scope="module",
                params=["gpt2", "opt-350m-style", "bloom", "gptj", "gptneox-parallel", "llama-gqa"])
def folder(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"hidden_{request.param}")
    hf = make_hf(ENGINE_TINY[request.param](), seed=21, peak=4.0)
    hf.save_pretrained(root / "hf")
    convert(root / "hf", root / "wf", 1, "fp32")
    return root / "wf" / "1-gpu"


def _rows(vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in LENGTHS]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| (fp32)."""
    a, b = a.float().cpu(), b.float().cpu()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-6))


def _load(folder, dtype=torch.float32, backend="cuda"):
    kw = dict(device="cuda") if backend == "reference" else {}
    return GPT.from_pretrained(folder, dtype=dtype, max_batch=4, max_seq_len=128,
                               backend=backend, **kw)


def _ending_early(ref: GPT, rows: list[list[int]]) -> dict:
    """Options that end a row inside the replayed steps, from its token 4 on: an end id at the
    last token its greedy run (the reference's, without an end id) first produces there, the
    other rows' an id their runs never produce. A peaked tiny model may repeat one token from
    the start; then a stop word, the run's first 12 tokens, ends the rows instead (through the
    sampling path's update kernel rather than the greedy one)."""
    ids = torch.zeros(len(rows), max(LENGTHS), dtype=torch.long, device="cuda")
    for b, row in enumerate(rows):
        ids[b, :len(row)] = torch.tensor(row)
    out, _ = ref.engine.model.generate_greedy(ids, torch.tensor(LENGTHS, device="cuda"), NEW)
    runs = [out[b, n:n + NEW].tolist() for b, n in enumerate(LENGTHS)]
    ends = [next(t for t in range(ref.vocab_size) if t not in run) for run in runs]
    for b in (1, 0, 2):
        fresh = [i for i in range(4, NEW - 1) if runs[b][i] not in runs[b][:i]]
        if fresh:
            ends[b] = runs[b][fresh[-1]]
            return dict(end_id=ends)
    return dict(end_id=ends, stop_words=[runs[1][:12]])


def test_engine_equals_reference_fp32(folder):
    gpt, ref = _load(folder), _load(folder, backend="reference")
    rows = _rows(gpt.vocab_size)
    plain = gpt.generate(rows, NEW)  # the shared greedy step graph
    assert plain.tokens == ref.generate(rows, NEW).tokens
    kw = dict(_ending_early(ref, rows), return_context_embeddings=True, return_hidden_states=True)
    want = ref.generate(rows, NEW, **kw)
    assert any(4 < len(t[0]) < NEW for t in want.tokens), want.tokens
    before = gpt.engine.prompt_graph_stats()[1]
    for run in range(3):  # the prompt passes replay the prompt graph (the first ran eagerly)
        got = gpt.generate(rows, NEW, **kw)
        assert got.tokens == want.tokens, run
        ctx, hs = got.context_embeddings, got.hidden_states
        assert ctx.dtype == torch.float32 and ctx.shape == want.context_embeddings.shape
        assert hs.dtype == torch.float32 and hs.shape == (3, 1, NEW, gpt.config.hidden_size)
        assert _rel(ctx, want.context_embeddings) <= 1e-4, run
        assert _rel(hs, want.hidden_states) <= 1e-4, run
        for b, n in enumerate(LENGTHS):  # zeros past the prompt and past the row's end
            assert not ctx[b, n:].any() and not hs[b, 0, len(got.tokens[b][0]):].any(), (run, b)
    assert gpt.engine.prompt_graph_stats()[1] > before
    # Plain greedy calls around those with hidden states share their step graph and keep their
    # tokens; the calls with hidden states ran graphs of their own.
    again = gpt.generate(rows, NEW)
    assert again.tokens == plain.tokens and again.hidden_states is None
    # Beam search returns the prompt's states too.
    beams = gpt.generate(rows, 4, num_beams=2, return_context_embeddings=True)
    assert _rel(beams.context_embeddings, want.context_embeddings) <= 1e-4


def test_sampled_tokens_states(folder):
    """Sampling (the processor and update kernels' path): each column equals the reference's
    final hidden state at the position fed before that token, over the engine's own sequence."""
    gpt, ref = _load(folder), _load(folder, backend="reference")
    rows = _rows(gpt.vocab_size, seed=1)
    out = gpt.generate(rows, NEW, do_sample=True, top_k=20, seed=[3, 4, 5], return_log_probs=True,
                       return_hidden_states=True)
    model = ref.engine.model
    for b, n in enumerate(LENGTHS):
        k = len(out.tokens[b][0])
        seq = out.sequences[b, 0, :n + k - 1].to("cuda").long()
        with torch.no_grad():
            _, states = model._run(seq[None], torch.arange(seq.numel(), device="cuda")[None],
                                   hidden=True)
        assert _rel(out.hidden_states[b, 0, :k], states[0, n - 1:]) <= 1e-4, b
        assert not out.hidden_states[b, 0, k:].any(), b


def test_fp16_within_loose_bound(folder):
    """fp16 against the fp32 reference: the context embeddings, and the generated tokens' states
    while the tokens agree (a near tie may turn fp16's path elsewhere)."""
    half, ref = _load(folder, torch.float16), _load(folder, backend="reference")
    rows = _rows(half.vocab_size, seed=2)
    kw = dict(return_context_embeddings=True, return_hidden_states=True)
    got, want = half.generate(rows, NEW, **kw), ref.generate(rows, NEW, **kw)
    assert got.context_embeddings.dtype == torch.float16
    assert got.hidden_states.dtype == torch.float16
    assert _rel(got.context_embeddings, want.context_embeddings) <= 2e-2
    for b in range(len(rows)):
        ours, theirs = got.tokens[b][0], want.tokens[b][0]
        pairs = enumerate(zip(ours, theirs, strict=False))
        same = next((i for i, (x, y) in pairs if x != y), min(len(ours), len(theirs)))
        # token i's state depends on tokens < i only: columns 0..same agree
        k = min(same + 1, len(ours), len(theirs))
        assert k >= 1
        assert _rel(got.hidden_states[b, 0, :k], want.hidden_states[b, 0, :k]) <= 2e-2, b


def test_session_turn_states(folder):
    """A session's turn (its prompt pass runs the new tokens only, the first token's state coming
    from that shorter pass) returns the states of the same call over the whole history."""
    gpt = _load(folder)
    rows = _rows(gpt.vocab_size, seed=3)
    new = [[5, 6], [7], [8, 9, 10]]
    with gpt.start_session(3, 128) as chat:
        chat.generate(rows, 8)
        history = chat.history
        turn = chat.generate(new, 20, return_hidden_states=True)
    alone = gpt.generate([h + n for h, n in zip(history, new, strict=True)], 20,
                         return_hidden_states=True)
    assert turn.tokens == alone.tokens
    assert _rel(turn.hidden_states, alone.hidden_states) <= 1e-4
