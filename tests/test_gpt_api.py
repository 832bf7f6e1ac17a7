"""warpformer.GPT on CPU through the reference backend: argument validation, inputs, FT word lists,
greedy / sampling / penalties / min_length / bad and stop words / beam search against independent
implementations (a naive no-cache loop here, HF transformers' generate for beam search)."""

from __future__ import annotations

import warnings

import pytest
import torch
from _models import build

import warpformer  # noqa: F401
from warpformer.converters import convert
from warpformer.gpt import GPT, words_to_ft
from warpformer.reference import GptReference
from warpformer.reference_generation import parse_ft_words

VOCAB = 96  # tests/_models.py


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(HF model, converted dir) of a tiny random GPT-2 (fp32)."""
    root = tmp_path_factory.mktemp("gpt_api")
    hf = build("gpt2", seed=3)
    hf.save_pretrained(root / "hf")
    convert(root / "hf", root / "wf", 1, "fp32")
    return hf, root / "wf" / "1-gpu"


@pytest.fixture(scope="module")
def gpt(tiny):
    return GPT.from_pretrained(tiny[1], dtype=torch.float32, max_batch=8, max_seq_len=32,
                               backend="reference")


@pytest.fixture(scope="module")
def ref(tiny):
    return GptReference.from_dir(tiny[1])


PROMPTS = [[5, 17, 42, 9, 33], [7, 3], [60, 61, 62, 11, 12, 13, 14]]


# ---------------------------------------------------------------------------- validation
# The engine's rules (torch.ops.warpformer.generation_options), as GPT.generate raises them.
OPT = "GptModel.decode: option "
BEAMS = r"when 'beam_width' \(num_beams\) > 1"


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(top_p=0.0, do_sample=True), r"'top_p' must be in \(0, 1\], got 0 \(row 0\)"),
    (dict(top_p=1.5, do_sample=True), r"'top_p' must be in \(0, 1\], got 1.5"),
    (dict(top_k=-1, do_sample=True), r"'top_k' must be in \[0, 1024\], got -1"),
    (dict(top_k=1025, do_sample=True), r"'top_k' must be in \[0, 1024\]"),
    (dict(top_k=2**40, do_sample=True), r"'top_k' must be a 32-bit integer, got 1099511627776"),
    (dict(temperature=0.0), r"'temperature' must be finite and > 0, got 0"),
    (dict(num_beams=0), r"'beam_width' \(num_beams\) must be in \[1, 16\], got 0"),
    (dict(num_beams=17), r"'beam_width' \(num_beams\) must be in \[1, 16\], got 17"),
    (dict(num_beams=2.0), r"'beam_width' \(num_beams\) must be an integer tensor, got Float"),
    (dict(num_beams=2, do_sample=True), r"'top_k' must be 1 \(greedy; do_sample=False\) " + BEAMS),
    (dict(num_beams=2, stop_words=[[5]]), r"'stop_words' is not supported " + BEAMS),
    (dict(repetition_penalty=0.0), r"'repetition_penalty' must be finite and > 0, got 0"),
    (dict(min_length=-1), r"'min_length' must be >= 0, got -1"),
    (dict(temperature=[1.0, 2.0]),
     r"'temperature' must be a scalar or have one value per row \(3\), got shape \[2\]"),
    (dict(end_id=VOCAB), r"'end_id' must be in \[0, 96\), got 96 \(row 0\)"),
    (dict(end_id=[1, 2, -1]), r"'end_id' must be in \[0, 96\), got -1 \(row 2\)"),
    (dict(top_k=True, do_sample=True), r"'top_k' must be an integer tensor, got Bool"),
    (dict(min_length=0.0), r"'min_length' must be an integer tensor, got Float"),
    (dict(temperature=True), r"'temperature' must be a real tensor, got Bool"),
    (dict(seed=-3, do_sample=True), r"'seed' must be >= 0, got -3"),
    (dict(seed=[1, 2], do_sample=True), r"'seed' must be a scalar or have one value per row"),
    (dict(bad_words=[[VOCAB]]), r"'bad_words' token 96 is outside the vocabulary \[0, 96\)"),
    (dict(bad_words=[[[1]], [[2]]]), r"'bad_words' must have shape \[2, L\] or \[3, 2, L\]"),
    (dict(return_cum_log_probs=3), r"'return_cum_log_probs' must be 0, 1 or 2, got 3"),
    # NaN or inf would pass the range rules (or none exists) and turn every logit into NaN.
    (dict(presence_penalty=float("nan")), r"'presence_penalty' must be finite, got nan"),
    (dict(frequency_penalty=float("-inf")), r"'frequency_penalty' must be finite, got -inf"),
    (dict(repetition_penalty=float("inf")), r"'repetition_penalty' must be finite and > 0"),
    (dict(repetition_penalty=[1.0, float("nan"), 1.0]),
     r"'repetition_penalty' must be finite and > 0, got nan \(row 1\)"),
    (dict(temperature=float("nan")), r"'temperature' must be finite and > 0, got nan"),
    (dict(temperature=float("inf"), do_sample=True), r"'temperature' must be finite and > 0"),
    (dict(top_p=float("nan"), do_sample=True), r"'top_p' must be in \(0, 1\], got nan"),
    (dict(num_beams=2, length_penalty=float("nan")), r"'length_penalty' must be finite, got nan"),
    (dict(num_beams=2, diversity_rate=float("inf")), r"'diversity_rate' must be finite, got inf"),
])
def test_option_errors_name_the_argument(gpt, kwargs, pattern):
    with pytest.raises(ValueError, match="^" + OPT + pattern):
        gpt.generate(PROMPTS, 4, **kwargs)


# Python values that are no tensor: GPT's conversion names the argument.
@pytest.mark.parametrize("kwargs, pattern", [
    (dict(length_penalty="1"), r"length_penalty must be a number or a list of numbers, got '1'"),
    (dict(seed=2**64, do_sample=True), r"seed must be a number or a list of numbers"),
    (dict(temperature=[1.0, [2.0]]), r"temperature must be a number or a list"),
    (dict(stop_words="abc"), r"stop_words must be a list of token lists"),
    (dict(stop_words=[1, 2]), r"stop_words must be a list of token lists"),
    (dict(bad_words=[[]]), r"bad_words contains an empty word"),
])
def test_option_conversion_errors_name_the_argument(gpt, kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        gpt.generate(PROMPTS, 4, **kwargs)


@pytest.mark.parametrize("kwargs, options", [
    (dict(top_k=-1, do_sample=True, seed=1), dict(top_k=-1, seed=1)),
    (dict(num_beams=17), dict(beam_width=17)),
    (dict(end_id=[1, 2, VOCAB]), dict(end_id=[1, 2, VOCAB])),
    (dict(presence_penalty=float("nan")), dict(presence_penalty=float("nan"))),
    (dict(bad_words=[[3, VOCAB + 1]]), dict(bad_words=[[3, VOCAB + 1], [2, -1]])),
    (dict(num_beams=2, stop_words=[[5]]), dict(beam_width=2, stop_words=[[5], [1]])),
])
def test_gpt_and_the_op_agree(gpt, kwargs, options):
    # One set of rules: GPT.generate (either backend), the reference engine's decode and the
    # op TorchScript users may call all raise the op's message.
    options = {k: torch.tensor(v) for k, v in options.items()}
    with pytest.raises(RuntimeError) as op_error:
        torch.ops.warpformer.generation_options(options, 3, VOCAB, gpt.end_id)
    message = str(op_error.value)
    assert message.startswith(OPT)
    with pytest.raises(ValueError) as gpt_error:
        gpt.generate(PROMPTS, 4, **kwargs)
    assert str(gpt_error.value) == message
    ids = torch.ones(3, 2, dtype=torch.int32)
    with pytest.raises(RuntimeError) as engine_error:
        gpt.engine.decode(ids, torch.full((3,), 2, dtype=torch.int32), 4, options)
    assert str(engine_error.value) == message


@pytest.mark.parametrize("n", ["5", None, 2.0, True, -1])
def test_max_new_tokens_of_the_wrong_type_is_named(gpt, n):
    for call in (lambda: gpt.generate(PROMPTS, n),
                 lambda: gpt.generate(PROMPTS, n, do_sample=True, seed=1),
                 lambda: next(gpt.generate_stream(PROMPTS, n)),
                 lambda: next(iter(gpt.generate_batches([PROMPTS], n)))):
        with pytest.raises(ValueError, match=r"max_new_tokens must be an integer >= 1"):
            call()
    assert gpt.generate(PROMPTS, 2).tokens  # still usable


@pytest.mark.parametrize("ids, n, pattern", [
    ([], 4, r"input_ids is an empty batch"),
    ([[1, 2], []], 4, r"input_ids row 1 is empty"),
    (torch.zeros(0, 3, dtype=torch.long), 4, r"empty batch"),
    (torch.zeros(2, 0, dtype=torch.long), 4, r"empty rows"),
    ([[1, 2]], 0, r"max_new_tokens must be an integer >= 1"),
    ([[1, VOCAB]], 4, r"input_ids\[0, 1\] = 96 is outside the vocabulary \[0, 96\)"),
    ([[1, -1]], 4, r"input_ids\[0, 1\] = -1 is outside the vocabulary"),
    ([[1] * 30], 3, r"input length 30 \+ max_new_tokens 3 = 33 exceeds max_seq_len \(32\)"),
    ([[1]] * 9, 2, r"batch size 9 exceeds max_batch \(8\)"),
    (torch.ones(2, 3, dtype=torch.float32), 2, r"input_ids must hold integers"),
    ([[1, 2.5]], 2, r"input_ids row 0 must hold ints"),
    ([[1, 2], [3, True]], 2, r"input_ids row 1 must hold ints"),
])
def test_input_errors(gpt, ids, n, pattern):
    with pytest.raises(ValueError, match=pattern):
        gpt.generate(ids, n)


def test_input_lengths_errors(gpt):
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    with pytest.raises(ValueError, match=r"input_lengths must have 2 entries"):
        gpt.generate(ids, 2, input_lengths=[3])
    with pytest.raises(ValueError, match=r"input_lengths: row 1 is empty"):
        gpt.generate(ids, 2, input_lengths=[3, 0])
    with pytest.raises(ValueError, match=r"input_lengths must be <= S = 3"):
        gpt.generate(ids, 2, input_lengths=[4, 1])
    with pytest.raises(ValueError, match=r"input_lengths is only accepted with a tensor"):
        gpt.generate([[1, 2]], 2, input_lengths=[2])


def test_from_pretrained_errors(tiny):
    with pytest.raises(ValueError, match=r"backend must be 'auto', 'cuda' or 'reference'"):
        GPT.from_pretrained(tiny[1], backend="tpu")
    with pytest.raises(ValueError, match=r"dtype must be torch.float32"):
        GPT.from_pretrained(tiny[1], dtype=torch.int8, backend="reference")
    with pytest.raises(ValueError, match=r"max_seq_len \(64\) exceeds the model's position table"):
        GPT.from_pretrained(tiny[1], max_seq_len=64, backend="reference")
    with pytest.raises(ValueError, match=r"need backend='cuda'"):
        GPT.from_pretrained(tiny[1], tensor_para_size=2, backend="reference")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"backend='cuda' needs a CUDA device"):
            GPT.from_pretrained(tiny[1], backend="cuda")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_auto_backend_warns_and_falls_back(tiny):
    with pytest.warns(UserWarning, match=r"no CUDA device visible; using the plain-PyTorch"):
        g = GPT.from_pretrained(tiny[1], max_seq_len=32)
    assert g.backend == "reference" and g.dtype == torch.float32  # fp16 computed in fp32 on CPU


# ---------------------------------------------------------------------------- FT word lists
def test_words_to_ft_shared_and_per_row():
    t = words_to_ft([[5, 6], [7]], batch_size=2)
    assert t.dtype == torch.int32 and t.shape == (2, 2, 3)
    assert t[0].tolist() == [[5, 6, 7], [2, 3, -1]] and torch.equal(t[0], t[1])
    t = words_to_ft([[[5, 6]], [[7], [8, 9, 10]]], batch_size=2)
    assert t.shape == (2, 2, 4)
    assert t[0].tolist() == [[5, 6, -1, -1], [2, -1, -1, -1]]
    assert t[1].tolist() == [[7, 8, 9, 10], [1, 4, -1, -1]]
    assert words_to_ft([[1, 2, 3]]).tolist() == [[1, 2, 3], [3, -1, -1]]  # [2, L]
    assert words_to_ft([], batch_size=1).tolist() == [[[-1], [-1]]]
    assert words_to_ft([[[5, 6]], [[7]]]).shape == (2, 2, 2)  # per row, no batch_size: [rows, ...]
    assert parse_ft_words(words_to_ft([[[5, 6]], [[7], [8, 9]]], 2), 2) == [
        [[5, 6]], [[7], [8, 9]]]
    assert parse_ft_words(torch.tensor([[5, 6, 7], [1, -1, 3]]), 2) == [[[5]], [[5]]]


# ---------------------------------------------------------------------------- inputs, greedy
def test_list_and_tensor_inputs_agree(gpt):
    a = gpt.generate(PROMPTS, 6)
    ids = torch.zeros(3, 7, dtype=torch.long)
    for b, p in enumerate(PROMPTS):
        ids[b, : len(p)] = torch.tensor(p)
    b = gpt.generate(ids, 6, input_lengths=torch.tensor([5, 2, 7]))
    assert torch.equal(a.sequences, b.sequences) and a.tokens == b.tokens
    one = gpt.generate(torch.tensor(PROMPTS[0]), 6)  # a 1-D tensor is one row
    assert one.tokens[0] == a.tokens[0]
    assert a.sequences.shape == (3, 1, 7 + 6) and a.sequences.dtype == torch.long
    assert a.sequence_lengths[:, 0].tolist() == [len(p) + len(t[0]) for p, t in
                                                  zip(PROMPTS, a.tokens, strict=True)]


class _Calls:
    """An engine proxy that records which generation entry point a GPT call used."""

    def __init__(self, engine) -> None:
        self.engine, self.calls = engine, []

    def __getattr__(self, name):
        if name in ("generate", "decode"):
            self.calls.append(name)
        return getattr(self.engine, name)


def test_plain_greedy_takes_generate_and_equals_decode(gpt):
    """Default options go to the engine's generate (no option arrays); anything else, even
    options spelled out at their defaults per row, to decode; both give the same tokens."""
    proxy = _Calls(gpt.engine)
    routed = GPT(proxy, gpt.config, gpt.backend, gpt.dtype, gpt.device)
    for end_id in (None, 40):
        fast = routed.generate(PROMPTS, 9, end_id=end_id)
        assert proxy.calls[-1] == "generate"
        slow = routed.generate(PROMPTS, 9, end_id=end_id if end_id is None else [end_id] * 3,
                               temperature=[1.0] * 3)
        assert proxy.calls[-1] == "decode"
        assert torch.equal(fast.sequences, slow.sequences) and fast.tokens == slow.tokens
        assert torch.equal(fast.sequence_lengths, slow.sequence_lengths)
    for kwargs in (dict(do_sample=True, seed=1), dict(num_beams=2), dict(min_length=2),
                   dict(repetition_penalty=1.1), dict(return_log_probs=True),
                   dict(stop_words=[[5]]), dict(end_id=[40, 41, 42])):
        routed.generate(PROMPTS, 3, **kwargs)
        assert proxy.calls[-1] == "decode", kwargs


def test_greedy_equals_generate_greedy(gpt, ref):
    ids = torch.tensor([[5, 17, 42, 9, 33, 0, 0], [7, 3, 0, 0, 0, 0, 0],
                        [60, 61, 62, 11, 12, 13, 14]])
    lens = torch.tensor([5, 2, 7])
    for end_id in (2, 40, NO_END):
        want, want_len = ref.generate_greedy(ids, lens, 12, end_id=end_id)
        got = gpt.generate(ids, 12, input_lengths=lens, end_id=end_id)
        for b in range(3):
            n = int(want_len[b])
            assert got.sequences[b, 0, :n].tolist() == want[b, :n].tolist()
            assert int(got.sequence_lengths[b, 0]) == n


def test_logits_match_hf(gpt, tiny):
    hf = tiny[0]
    out = gpt.logits([[5, 17, 42, 9], [7, 3]])
    with torch.no_grad():
        want = hf(input_ids=torch.tensor([[5, 17, 42, 9]])).logits[0]
    assert out.shape == (2, 4, VOCAB)
    torch.testing.assert_close(out[0], want, rtol=1e-4, atol=1e-4)
    assert float(out[1, 2:].abs().max()) == 0.0


# ---------------------------------------------------------------------------- naive oracle
def naive(ref, prompt, n, *, rep=1.0, pres=0.0, freq=0.0, min_len=0, bad=(), stop=(),
          end_id=None, temperature=1.0):
    """Greedy without a KV cache, applying every option by hand (the oracle)."""
    seq, out, lps = list(prompt), [], []
    for step in range(n):
        logits = ref.forward(torch.tensor([seq]))[0, -1].clone()
        for tok in set(seq):
            count = seq.count(tok)
            logits[tok] = logits[tok] * rep if logits[tok] < 0 else logits[tok] / rep
            logits[tok] -= pres + freq * count
        if end_id is not None and step < min_len:
            logits[end_id] = float("-inf")
        for word in bad:
            if len(word) == 1 or seq[len(seq) - len(word) + 1:] == list(word[:-1]):
                logits[word[-1]] = float("-inf")
        logits = logits / temperature
        tok = int(logits.argmax())
        lps.append(float(torch.log_softmax(logits, -1)[tok]))
        seq.append(tok)
        out.append(tok)
        if tok == end_id or any(seq[len(seq) - len(w):] == list(w) for w in stop):
            break
    return out, lps


NO_END = 95  # a token the tiny model never picks first; used as end_id where ends would interfere


def test_naive_oracle_equals_plain_greedy(gpt, ref):
    for p in PROMPTS:
        assert gpt.generate([p], 10, end_id=NO_END).tokens[0][0] == naive(ref, p, 10,
                                                                          end_id=NO_END)[0]


@pytest.mark.parametrize("opt, kw", [
    (dict(repetition_penalty=3.0), dict(rep=3.0)),
    (dict(repetition_penalty=0.5), dict(rep=0.5)),
    (dict(presence_penalty=2.0), dict(pres=2.0)),
    (dict(frequency_penalty=1.5), dict(freq=1.5)),
    (dict(repetition_penalty=[1.0, 4.0, 2.0], presence_penalty=[0.5, 0.0, 1.0]), None),
])
def test_penalties(gpt, ref, opt, kw):
    out = gpt.generate(PROMPTS, 12, end_id=NO_END, **opt)
    plain = gpt.generate(PROMPTS, 12, end_id=NO_END)
    assert out.tokens != plain.tokens, "the penalty changed nothing: test is vacuous"
    for b, p in enumerate(PROMPTS):
        if kw is None:  # per-row values
            kw_b = dict(rep=opt["repetition_penalty"][b], pres=opt["presence_penalty"][b])
        else:
            kw_b = kw
        assert out.tokens[b][0] == naive(ref, p, 12, end_id=NO_END, **kw_b)[0], f"row {b}"


def test_min_length_and_per_row_end_id(gpt, ref):
    plain = gpt.generate(PROMPTS, 8, end_id=NO_END)
    # each row ends at its first greedy token that is new after position 0
    cut = [next(i for i in range(1, 8) if t[0][i] not in t[0][:i]) for t in plain.tokens]
    ends = [t[0][i] for t, i in zip(plain.tokens, cut, strict=True)]
    stopped = gpt.generate(PROMPTS, 8, end_id=ends)
    assert [len(t[0]) for t in stopped.tokens] == [i + 1 for i in cut]
    assert [t[0][-1] for t in stopped.tokens] == ends
    held = gpt.generate(PROMPTS, 8, end_id=ends, min_length=5)
    for b, p in enumerate(PROMPTS):
        got = held.tokens[b][0]
        assert len(got) >= 5 and ends[b] not in got[:5] and got != plain.tokens[b][0]
        assert got == naive(ref, p, 8, end_id=ends[b], min_len=5)[0]
        tail = held.sequences[b, 0, int(held.sequence_lengths[b, 0]):]
        assert bool((tail == ends[b]).all())  # end_id past the end


def test_bad_words(gpt, ref):
    plain = gpt.generate(PROMPTS, 10, end_id=NO_END)
    t = plain.tokens[0][0]
    bad = [[t[0]], [t[2], t[3]]]  # a single token and a two-token word of row 0's output
    out = gpt.generate(PROMPTS, 10, end_id=NO_END, bad_words=bad)
    got = out.tokens[0][0]
    assert got != t and t[0] not in got
    assert all(got[i:i + 2] != bad[1] for i in range(len(got) - 1))
    for b, p in enumerate(PROMPTS):
        assert out.tokens[b][0] == naive(ref, p, 10, end_id=NO_END, bad=bad)[0]


def _until(tokens: list[int], word: list[int]) -> list[int]:
    """``tokens`` cut after the first occurrence of ``word``."""
    for i in range(len(tokens) - len(word) + 1):
        if tokens[i:i + len(word)] == word:
            return tokens[: i + len(word)]
    return tokens


def test_stop_words_per_row(gpt):
    plain = gpt.generate(PROMPTS, 10, end_id=NO_END)
    rows = [t[0] for t in plain.tokens]
    stop = [[rows[0][2:4]], [rows[1][4:5]], [[NO_END - 1, NO_END - 2]]]
    out = gpt.generate(PROMPTS, 10, end_id=NO_END, stop_words=stop)
    assert out.tokens[0][0] == _until(rows[0], rows[0][2:4]) and len(out.tokens[0][0]) <= 4
    assert out.tokens[1][0] == _until(rows[1], rows[1][4:5]) and len(out.tokens[1][0]) <= 5
    assert out.tokens[2][0] == rows[2]  # its stop word never appears
    shared = gpt.generate(PROMPTS, 10, end_id=NO_END, stop_words=[rows[0][2:4]])
    assert shared.tokens[0][0] == out.tokens[0][0]
    assert int(shared.sequence_lengths[0, 0]) == len(PROMPTS[0]) + len(out.tokens[0][0])


def test_log_probs(gpt, ref):
    out = gpt.generate(PROMPTS[:1], 6, end_id=NO_END, temperature=0.7, return_log_probs=True,
                       return_cum_log_probs=1)
    want_tokens, want_lp = naive(ref, PROMPTS[0], 6, end_id=NO_END, temperature=0.7)
    assert out.tokens[0][0] == want_tokens
    torch.testing.assert_close(out.log_probs[0, 0], torch.tensor(want_lp), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out.cum_log_probs[0, 0], torch.tensor(sum(want_lp)), rtol=1e-4,
                               atol=1e-4)
    both = gpt.generate(PROMPTS[:1], 6, end_id=NO_END, temperature=0.7, return_cum_log_probs=2)
    with torch.no_grad():
        lp = torch.log_softmax(ref.forward(torch.tensor(PROMPTS[:1]))[0, :-1], -1)
    ctx = float(lp.gather(1, torch.tensor(PROMPTS[0][1:])[:, None]).sum())
    torch.testing.assert_close(both.cum_log_probs[0, 0], torch.tensor(sum(want_lp) + ctx),
                               rtol=1e-4, atol=1e-4)
    assert gpt.generate(PROMPTS[:1], 2).cum_log_probs is None


# ---------------------------------------------------------------------------- sampling
def test_sampling_seeds(gpt):
    kw = dict(do_sample=True, top_k=0, temperature=1.5, end_id=NO_END)
    a = gpt.generate(PROMPTS, 12, seed=7, **kw)
    b = gpt.generate(PROMPTS, 12, seed=7, **kw)
    c = gpt.generate(PROMPTS, 12, seed=8, **kw)
    assert a.tokens == b.tokens
    assert a.tokens != c.tokens
    # a row's tokens depend on its seed only, not on the rest of the batch
    alone = gpt.generate(PROMPTS[1:2], 12, seed=[7], **kw)
    assert alone.tokens[0] == a.tokens[1]
    mixed = gpt.generate(PROMPTS, 12, seed=[1, 7, 2], **kw)
    assert mixed.tokens[1] == a.tokens[1]
    torch.manual_seed(0)
    d = gpt.generate(PROMPTS, 12, **kw)  # no seed: drawn from torch's generator
    torch.manual_seed(0)
    assert gpt.generate(PROMPTS, 12, **kw).tokens == d.tokens


def test_top_k_top_p_filters(gpt, ref):
    with torch.no_grad():
        logits = ref.forward(torch.tensor([PROMPTS[0]]))[0, -1]
    top3 = set(logits.topk(3).indices.tolist())
    firsts = {gpt.generate(PROMPTS[:1], 1, do_sample=True, top_k=3, seed=s).tokens[0][0][0]
              for s in range(60)}
    assert firsts <= top3 and len(firsts) > 1
    probs = torch.softmax(logits, -1)
    order = probs.argsort(descending=True)
    mass = float(probs[order[:2]].sum())  # top_p just above the top-2 mass keeps 3 tokens
    nucleus = set(order[:3].tolist())
    firsts = {gpt.generate(PROMPTS[:1], 1, do_sample=True, top_p=mass + 1e-4, seed=s
                           ).tokens[0][0][0] for s in range(60)}
    assert firsts <= nucleus and len(firsts) > 1
    greedy = int(logits.argmax())
    assert {gpt.generate(PROMPTS[:1], 1, do_sample=True, top_p=1e-6, seed=s).tokens[0][0][0]
            for s in range(10)} == {greedy}


def test_sampling_distribution_chi_square(gpt, ref):
    """2,000 draws of the first token with top_k=6, temperature 0.8: chi-square against the
    filtered softmax (df 5, critical value 20.5 at p = 0.001)."""
    with torch.no_grad():
        logits = ref.forward(torch.tensor([PROMPTS[2]]))[0, -1] / 0.8
    top = logits.topk(6)
    expect = torch.softmax(top.values, -1) * 2000
    counts = dict.fromkeys(top.indices.tolist(), 0)
    for s in range(0, 2000, 8):
        out = gpt.generate([PROMPTS[2]] * 8, 1, do_sample=True, top_k=6, temperature=0.8,
                           seed=list(range(s, s + 8)))
        for row in out.tokens:
            counts[row[0][0]] += 1
    observed = torch.tensor([counts[i] for i in top.indices.tolist()], dtype=torch.float32)
    chi2 = float(((observed - expect) ** 2 / expect).sum())
    assert chi2 < 20.5, f"chi-square {chi2:.1f}: {observed.tolist()} vs {expect.tolist()}"


def test_greedy_flags_warn(gpt):
    with pytest.warns(UserWarning, match=r"top_k/top_p are ignored without do_sample=True"):
        gpt.generate(PROMPTS, 2, top_k=5)


# ---------------------------------------------------------------------------- streaming
def test_generate_stream_equals_generate(gpt):
    kw = dict(do_sample=True, top_p=0.9, seed=[3, 4, 5], end_id=[NO_END, 2, NO_END])
    full = gpt.generate(PROMPTS, 10, **kw)
    stream = gpt.generate_stream(PROMPTS, 10, **kw)
    steps = []
    while True:
        try:
            steps.append(next(stream))
        except StopIteration as stop:
            final = stop.value
            break
    assert all(s.shape == (3, 1) for s in steps) and len(steps) <= 10
    seen = torch.cat(steps, 1)
    for b in range(3):
        n = len(full.tokens[b][0])
        assert seen[b, :n].tolist() == full.tokens[b][0]
    assert final.tokens == full.tokens and torch.equal(final.sequences, full.sequences)
    chunks = list(gpt.generate_stream(PROMPTS, 10, chunk_size=4, **kw))
    assert [c.shape[1] for c in chunks][0] == 4
    assert torch.equal(torch.cat(chunks, 1), seen)


def test_generate_stream_errors_and_early_close(gpt):
    with pytest.raises(ValueError, match=r"num_beams must be 1 for generate_stream"):
        gpt.generate_stream(PROMPTS, 4, num_beams=2)
    with pytest.raises(ValueError, match=r"option 'top_p' must be in"):
        gpt.generate_stream(PROMPTS, 4, do_sample=True, top_p=2.0)
    s = gpt.generate_stream(PROMPTS, 8)
    next(s)
    s.close()  # releases the call
    assert gpt.generate(PROMPTS, 3).sequences.shape == (3, 1, 10)


# ---------------------------------------------------------------------------- many batches
BATCHES = [PROMPTS, [[9, 8, 7]], [[1, 2, 3, 4], [40, 41]]]


def _same_output(a, b):
    assert a.tokens == b.tokens
    assert torch.equal(a.sequences, b.sequences)
    assert torch.equal(a.sequence_lengths, b.sequence_lengths)
    assert torch.equal(a.input_lengths, b.input_lengths)
    for x, y in ((a.cum_log_probs, b.cum_log_probs), (a.log_probs, b.log_probs)):
        assert (x is None) == (y is None) and (x is None or torch.equal(x, y))


@pytest.mark.parametrize("kw", [
    {},
    dict(do_sample=True, top_k=5, seed=11, return_log_probs=True),
    dict(num_beams=3, return_cum_log_probs=1),
])
def test_generate_batches_equals_generate(gpt, kw):
    counts = [6, 3, 8]
    expected = [gpt.generate(b, n, **kw) for b, n in zip(BATCHES, counts, strict=True)]
    got = list(gpt.generate_batches(BATCHES, counts, in_flight=2, **kw))
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        _same_output(a, b)
    # one count for all batches; a generator of batches; padded tensor pairs
    same = [gpt.generate(b, 4, **kw) for b in BATCHES]
    for a, b in zip(gpt.generate_batches(iter(BATCHES), 4, **kw), same, strict=True):
        _same_output(a, b)
    ids = torch.tensor([[1, 2, 3, 4], [40, 41, 0, 0]])
    (pair,) = gpt.generate_batches([(ids, [4, 2])], 5, **kw)
    _same_output(pair, gpt.generate(ids, 5, input_lengths=[4, 2], **kw))


def test_generate_batches_errors(gpt):
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match=r"in_flight must be an integer >= 1"):
            gpt.generate_batches(BATCHES, 3, in_flight=bad)
    with pytest.raises(ValueError, match=r"max_new_tokens must be an integer >= 1"):
        gpt.generate_batches(BATCHES, 0)
    with pytest.raises(ValueError, match=r"max_new_tokens must be an integer >= 1 or a sequence"):
        gpt.generate_batches(BATCHES, "3")
    with pytest.raises(ValueError, match=r"max_new_tokens\[1\] must be an integer >= 1, got 0"):
        gpt.generate_batches(BATCHES, [3, 0, 2])
    with pytest.raises(ValueError, match=r"max_new_tokens\[0\] must be an integer >= 1, got True"):
        gpt.generate_batches(BATCHES, [True, 1, 2])
    with pytest.raises(ValueError, match=r"max_new_tokens has 2 values for 3 batches"):
        gpt.generate_batches(BATCHES, [3, 2])
    with pytest.raises(TypeError, match=r"unexpected argument"):
        gpt.generate_batches(BATCHES, 3, top_q=0.5)


@pytest.mark.parametrize("in_flight", [1, 2, 3])
def test_generate_batches_errors_come_in_order(gpt, in_flight):
    # Whatever the depth of the queue, an error of batch i comes after batches 0..i-1 (and
    # names the batch), and counts that do not match a generator's batches are reported once
    # it ends or outruns them.
    def run(batches, counts=3, **kw):
        got = []
        with pytest.raises(Exception) as exc:
            for out in gpt.generate_batches(batches, counts, in_flight=in_flight, **kw):
                got.append(out.tokens)
        return got, exc

    want = [gpt.generate(b, 3).tokens for b in BATCHES]
    got, exc = run(BATCHES[:2] + [[[5, VOCAB]]] + BATCHES)
    assert got == want[:2] and exc.type is ValueError
    assert str(exc.value).startswith("batches[2]: input_ids[0, 1] = 96 is outside the vocabulary")
    got, exc = run(BATCHES, top_k=-1, do_sample=True)  # option values are checked per batch
    assert got == [] and "batches[0]: GptModel.decode: option 'top_k' must be in [0, 1024]" in str(
        exc.value)

    def failing():
        yield from BATCHES[:2]
        raise RuntimeError("the batches' source broke")

    got, exc = run(failing())
    assert got == want[:2] and exc.type is RuntimeError and "source broke" in str(exc.value)
    got, exc = run(iter(BATCHES), [3, 3])
    assert got == want[:2]
    assert "max_new_tokens has 2 values but batches has more batches" in str(exc.value)
    got, exc = run(iter(BATCHES), [3, 3, 3, 3])
    assert got == want and "max_new_tokens has 4 values for 3 batches" in str(exc.value)
    with pytest.raises(ValueError, match=r"batches\[0\]: a tensor batch is input_ids or"):
        list(gpt.generate_batches([(torch.ones(1, 2, dtype=torch.long),) * 3], 2))

    # The engine's call fails (out of memory, a check of the C++ engine): after the outputs
    # before it too (at depths 2-3 those were lost before, raised over).
    def failing_call(ids, n, **kw):
        call = prepare(ids, n, **kw)

        def boom(engine):
            raise RuntimeError("the engine failed")
        return boom if ids is BATCHES[2] else call

    prepare = gpt._prepare
    gpt._prepare = failing_call
    try:
        got, exc = run(BATCHES + BATCHES[:1])
    finally:
        del gpt._prepare
    assert got == want[:2] and exc.type is RuntimeError and str(exc.value) == "the engine failed"


def test_generate_batches_warnings_point_at_the_caller(gpt):
    with pytest.warns(UserWarning, match=r"top_k/top_p are ignored") as rec:
        gpt.generate(PROMPTS, 2, top_k=5)
    assert rec[0].filename == __file__
    with pytest.warns(UserWarning, match=r"top_k/top_p are ignored") as rec:
        list(gpt.generate_batches(BATCHES, 2, in_flight=2, top_k=5))
    assert {r.filename for r in rec} == {__file__}


def test_generate_batches_in_flight_needs_one_gpu(tiny):
    # Checked before anything runs: a tensor-parallel model cannot keep batches in flight.
    import dataclasses

    class Engine:  # what GPT reads of an engine: limits at construction, its grid here
        def __init__(self, tp, pp):
            self.tp, self.pp = tp, pp

        def max_batch(self):
            return 8

        def max_seq_len(self):
            return 32

        def tensor_para_size(self):
            return self.tp

        def pipeline_para_size(self):
            return self.pp

    for tp, pp, name in ((2, 1, "tensor_para_size 2"), (1, 3, "pipeline_para_size 3")):
        config = dataclasses.replace(gpt_config(tiny), tensor_para_size=tp)
        model = GPT(Engine(tp, pp), config, "cuda", torch.float16, torch.device("cpu"))
        with pytest.raises(ValueError, match=rf"in_flight=2 needs a model on one GPU; this one "
                                             rf"has {name} \(use in_flight=1\)"):
            model.generate_batches(BATCHES, 3, in_flight=2)


def gpt_config(tiny):
    from warpformer.weights import read_config

    return read_config(tiny[1])


# ---------------------------------------------------------------------------- beam search
def _hf_beam(hf, prompt, n, beams, lp, eos):
    with torch.no_grad():
        return hf.generate(torch.tensor([prompt]), num_beams=beams, num_return_sequences=beams,
                           max_new_tokens=n, do_sample=False, length_penalty=lp,
                           eos_token_id=eos, pad_token_id=eos, output_scores=True,
                           return_dict_in_generate=True)


@pytest.mark.parametrize("lp", [1.0, 0.3])
def test_beam_search_matches_hf(tmp_path, lp):
    hf = build("gpt2", seed=5)
    eos = 2
    with torch.no_grad():  # make end_id likely so that hypotheses finish at different lengths
        hf.lm_head.weight[eos] += 0.6 * hf.lm_head.weight[eos].sign()  # (tied to wte)
    hf.save_pretrained(tmp_path / "hf")
    convert(tmp_path / "hf", tmp_path / "wf", 1, "fp32")
    g = GPT.from_pretrained(tmp_path / "wf", dtype=torch.float32, max_batch=4, max_seq_len=32,
                            backend="reference")
    out = g.generate(PROMPTS, 14, num_beams=4, length_penalty=lp, end_id=eos)
    assert out.sequences.shape == (3, 4, 7 + 14)
    ended = 0
    for b, p in enumerate(PROMPTS):
        want = _hf_beam(hf, p, 14, 4, lp, eos)
        for k in range(4):
            hs = want.sequences[k, len(p):].tolist()
            hs = hs[: hs.index(eos) + 1] if eos in hs else hs
            assert out.tokens[b][k] == hs, f"row {b} beam {k}"
            ended += hs[-1] == eos
        gen = (out.sequence_lengths[b] - len(p)).float()
        torch.testing.assert_close(out.cum_log_probs[b] / gen ** lp, want.sequences_scores,
                                   rtol=1e-4, atol=1e-4)
    assert ended > 0, "no hypothesis ended with end_id: the test does not cover finishing"


def test_beam_search_width_one_is_greedy_and_diversity_changes_beams(gpt):
    greedy = gpt.generate(PROMPTS, 8)
    assert gpt.generate(PROMPTS, 8, num_beams=1).tokens == greedy.tokens
    plain = gpt.generate(PROMPTS, 8, num_beams=4, end_id=NO_END)
    diverse = gpt.generate(PROMPTS, 8, num_beams=4, end_id=NO_END, diversity_rate=5.0)
    assert plain.tokens != diverse.tokens
    # with a large diversity rate, the 4 beams descend from 4 different first tokens more often
    firsts = lambda o: sum(len({t[0] for t in row}) for row in o.tokens)  # noqa: E731
    assert firsts(diverse) >= firsts(plain)


def test_examples_generate_runs_on_reference(tiny, capsys, tmp_path):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "generate.py"
    spec = importlib.util.spec_from_file_location("example_generate", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (tmp_path / "ids.csv").write_text("5,17,42\n7,3\n")
        rc = mod.main(["--ckpt_path", str(tiny[1]), "--output_len", "5", "--data_type", "fp32",
                       "--sample_input_file", str(tmp_path / "ids.csv"),
                       "--top_k", "4", "--random_seed", "1", "--return_cum_log_probs", "1",
                       "--backend", "reference", "--max_seq_len", "32"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "output ids" in text and "cum_log_probs" in text
