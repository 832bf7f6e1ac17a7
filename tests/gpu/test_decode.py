"""The C++ generation session (GptModel.decode*): CUDA-graph replay equals eager steps, streaming
equals one-shot decoding, log probs are those of HF's distribution, sampling is reproducible and
independent of batch composition, and session misuse raises clearly."""

from __future__ import annotations

import pytest
import torch
import transformers

import warpformer  # noqa: F401
from warpformer.converters import convert
from warpformer.models.gpt import load_gpt_model
from warpformer.options import EngineOptions

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A peaked random GPT-2 (head size 64) converted to fp32, and its HF model on the GPU."""
    root = tmp_path_factory.mktemp("decode")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=1000, n_embd=128, n_head=2, n_layer=2,
                                  n_positions=256, bos_token_id=1, eos_token_id=2)
    cfg._attn_implementation = "eager"
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        hf.transformer.wte.weight.mul_(4.0)
    hf.save_pretrained(root / "hf")
    convert(root / "hf", root / "wf", 1, "fp32")
    return hf.cuda(), root / "wf" / "1-gpu"


def batch(lengths, vocab=1000, seed=0):
    g = torch.Generator().manual_seed(seed)
    S = max(lengths)
    ids = torch.randint(3, vocab, (len(lengths), S), generator=g, dtype=torch.int32)
    return ids.cuda(), torch.tensor(lengths, dtype=torch.int32, device="cuda")


def opts(**kw):
    return {k: torch.tensor(v) for k, v in kw.items()}


EAGER = EngineOptions(cuda_graphs=False)


def test_graph_replay_equals_eager(tiny):
    _, path = tiny
    model = load_gpt_model(path, dtype=torch.float16, max_batch=4, max_seq_len=128)
    eager_model = load_gpt_model(path, dtype=torch.float16, max_batch=4, max_seq_len=128,
                                 options=EAGER)
    ids, lens = batch([5, 9, 1, 17])
    # The model's first session: its eager steps plan the decode products (cuBLASLt at 4 rows)
    # and may grow the GEMM workspace; the graph is captured after them and replayed from then.
    with_graphs, (_, replays) = _with_graph_calls(
        lambda: model.decode(ids, lens, 40, opts(end_id=999)))
    assert replays >= 30, f"{replays} graph launches in 40 steps"
    eager, calls = _with_graph_calls(lambda: eager_model.decode(ids, lens, 40, opts(end_id=999)))
    assert calls == (0, 0)  # cuda_graphs=False: every kernel launched eagerly
    assert torch.equal(with_graphs["output_ids"], eager["output_ids"])
    greedy, _ = model.generate(ids, lens, 40, 999)
    assert torch.equal(greedy, with_graphs["output_ids"])


def _with_graph_calls(fn):
    """(fn(), (cudaGraphInstantiate calls, cudaGraphLaunch calls) made by it)."""
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        out = fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events()]
    return out, (sum("cudaGraphInstantiate" in n for n in names),
                 sum("cudaGraphLaunch" in n for n in names))


def test_short_sessions_share_a_graph(tiny):
    """Greedy sessions of one batch size share one step graph (their tokens are staged in the
    model's state): short sessions run eagerly until together they have run 6 eager steps
    (kMinGraphSteps), the next captures once, and every later session of that size replays it
    from its first step, whatever its prompts and lengths. A long session of a new batch size
    captures at its third token (its first step plans the products). A sampling session's graph
    dies with it. Tokens and lengths equal an engine without CUDA graphs every time."""
    _, path = tiny
    model = load_gpt_model(path, dtype=torch.float16, max_batch=4, max_seq_len=128)
    eager_model = load_gpt_model(path, dtype=torch.float16, max_batch=4, max_seq_len=128,
                                 options=EAGER)
    # Prompts of at most 8 tokens in all: their prompt passes run on the GEMV path, never as
    # prompt graphs (test_gpt_engine.py), which would add to the counts.
    a = batch([1, 2, 1, 4], seed=5)
    b = batch([2, 1, 3, 1], seed=6)  # same batch size, other prompts and lengths
    c = batch([2, 1, 3], seed=7)     # another batch size: a key of its own

    def run(m, prompt, n, o):
        if o:
            e = m.decode(*prompt, n, opts(**o))
            return e["output_ids"], e["sequence_lengths"]
        return m.generate(*prompt, n, 999)

    def check(prompt, n, want, **o):
        got, calls = _with_graph_calls(lambda: run(model, prompt, n, o))
        assert calls == want, f"output_len {n}: (instantiations, launches) {calls}, want {want}"
        eager = run(eager_model, prompt, n, o)
        assert torch.equal(got[0], eager[0]) and torch.equal(got[1], eager[1])

    # Sampling sessions first (their graphs die with them, so nothing shared is counted), so
    # that no buffer or GEMM workspace grows (and gives the graphs' buffers a new generation) in
    # the counted sessions below: a sampling session's state is the larger.
    for prompt in (a, b, c):
        model.decode(*prompt, 8, opts(top_k=20, top_p=0.9, seed=3, end_id=999))
    # Three sessions of 3 new tokens (the first from the prompt, 2 steps each): 6 eager steps.
    for prompt in (a, a, b):
        check(prompt, 3, (0, 0))
    check(a, 3, (1, 2))  # captured at its first step, replayed for both
    check(b, 3, (0, 2))  # shared: no new capture
    check(b, 8, (0, 7))
    check(c, 8, (1, 6))  # new size: one eager step, captured at the third token
    check(c, 8, (0, 7))
    # Sampling: the options live in the call's tensors, so each session captures its own.
    sampling = dict(top_k=20, top_p=0.9, seed=3, end_id=999)
    check(a, 8, (1, 6), **sampling)
    check(a, 8, (1, 6), **sampling)
    check(a, 3, (0, 0), **sampling)


def _stream(model, ids, lens, n, options, chunk):
    """A session streamed ``chunk`` tokens per decode_step call: (the tokens of every call
    concatenated [B, 1, k], decode_finish's outputs)."""
    model.decode_start(ids, lens, n, options)
    chunks = []
    while True:
        t = model.decode_step(chunk)
        if t.shape[-1] == 0:
            break
        chunks.append(t)
    return torch.cat(chunks, -1), model.decode_finish()


def test_greedy_streaming_sees_each_calls_tokens(tiny):
    """A greedy session's tokens are staged in the model and copied to the caller's outputs after
    every decode_step call: each chunk streamed equals the one-shot tokens at its positions."""
    _, path = tiny
    model = load_gpt_model(path, dtype=torch.float16, max_batch=4, max_seq_len=128)
    ids, lens = batch([6, 13, 2, 9], seed=8)
    for _ in range(3):  # later sessions replay the shared graph
        full, full_lens = model.generate(ids, lens, 20, 999)
        tokens, streamed = _stream(model, ids, lens, 20, opts(end_id=999), 3)
        assert torch.equal(streamed["output_ids"], full)
        assert torch.equal(streamed["sequence_lengths"], full_lens)
        k = tokens.shape[-1]
        assert k >= 16  # every row finished by the first all-finished poll at the earliest
        for r, n in enumerate(lens.tolist()):
            assert tokens[r, 0].tolist() == full[r, 0, n:n + k].tolist()


def test_streaming_equals_decode(tiny):
    _, path = tiny
    model = load_gpt_model(path, dtype=torch.float32, max_batch=3, max_seq_len=128)
    ids, lens = batch([4, 11, 7], seed=2)
    o = opts(top_k=20, top_p=0.9, temperature=0.8, seed=7)
    full = model.decode(ids, lens, 24, o)
    tokens, streamed = _stream(model, ids, lens, 24, o, 5)
    assert torch.equal(streamed["output_ids"], full["output_ids"])
    for b, n in enumerate(lens.tolist()):
        assert tokens[b, 0].tolist() == full["output_ids"][b, 0, n:n + tokens.shape[-1]].tolist()


def test_log_probs_match_hf(tiny):
    hf, path = tiny
    model = load_gpt_model(path, dtype=torch.float32, max_batch=2, max_seq_len=128)
    ids, lens = batch([6, 3], seed=3)
    out = model.decode(ids, lens, 8, opts(return_log_probs=1, return_cum_log_probs=1,
                                          end_id=999))
    for b, n in enumerate(lens.tolist()):
        seq = out["output_ids"][b, 0, : n + 8].long()[None]
        with torch.no_grad():
            lp = torch.log_softmax(hf(seq).logits.float(), -1)[0]
        want = lp[n - 1: n + 7].gather(1, seq[0, n: n + 8, None])[:, 0]
        torch.testing.assert_close(out["output_log_probs"][b, 0], want, atol=2e-4, rtol=2e-4)
        torch.testing.assert_close(out["cum_log_probs"][b, 0], want.sum(), atol=1e-3, rtol=1e-4)


def test_sampling_seeded_and_batch_independent(tiny):
    _, path = tiny
    model = load_gpt_model(path, dtype=torch.float32, max_batch=4, max_seq_len=128)
    ids, lens = batch([5, 8, 3, 12], seed=4)
    o = dict(top_k=50, top_p=0.95, temperature=1.2, end_id=999)
    a = model.decode(ids, lens, 20, opts(seed=11, **o))["output_ids"]
    b = model.decode(ids, lens, 20, opts(seed=11, **o))["output_ids"]
    c = model.decode(ids, lens, 20, opts(seed=12, **o))["output_ids"]
    assert torch.equal(a, b) and not torch.equal(a, c)
    seeds = torch.tensor([11, 11, 11, 11])
    row = model.decode(ids[2:3, :3].contiguous(), lens[2:3], 20,
                       {**opts(**o), "seed": seeds[:1]})["output_ids"]
    assert row[0, 0].tolist() == a[2, 0, :23].tolist()


def test_session_misuse_raises_and_recovers(tiny):
    _, path = tiny
    model = load_gpt_model(path, dtype=torch.float16, max_batch=2, max_seq_len=64)
    ids, lens = batch([3, 4])
    with pytest.raises(RuntimeError, match=r"unknown option 'topk'; known options: "):
        model.decode(ids, lens, 4, opts(topk=3))
    with pytest.raises(RuntimeError, match=r"option 'top_p' must be in \(0, 1\], got 1.5"):
        model.decode(ids, lens, 4, opts(top_p=1.5))
    with pytest.raises(RuntimeError, match=r"option 'top_k' must be 1 .* when 'beam_width' "
                                           r"\(num_beams\) > 1"):
        model.decode(ids, lens, 4, opts(beam_width=2, top_k=5))
    # TorchScript callers reach the engine without warpformer.GPT's checks: NaN or inf options
    # are refused here too (a NaN presence penalty used to yield token 0 forever).
    nan, inf = float("nan"), float("inf")
    for key, value, rule in (("presence_penalty", nan, "finite"),
                             ("frequency_penalty", -inf, "finite"),
                             ("repetition_penalty", nan, "finite and > 0"),
                             ("temperature", inf, "finite and > 0")):
        with pytest.raises(RuntimeError, match=rf"option '{key}' must be {rule}, got"):
            model.decode(ids, lens, 4, opts(**{key: value}))
    for key in ("length_penalty", "diversity_rate"):
        with pytest.raises(RuntimeError, match=rf"option '{key}' must be finite"):
            model.decode(ids, lens, 4, opts(beam_width=2, **{key: nan}))
    with pytest.raises(RuntimeError, match=r"no generation session"):
        model.decode_step(1)
    model.decode_start(ids, lens, 4, {})
    with pytest.raises(RuntimeError, match=r"a generation session is running"):
        model.forward(ids, lens)
    model.decode_step(4)
    model.decode_finish()
    out = model.decode(ids, lens, 4, {})
    assert out["output_ids"].shape == (2, 1, 8)
