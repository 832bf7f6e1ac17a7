"""warpformer.Seq2Seq (T5 / BART families) on CPU through the reference backend: the encoder and
greedy / beam tokens against HF transformers on tiny random models of each variant, ragged
batches against rows alone, every generation option (against HF where it has the option, else
a naive no-cache loop over the reference's teacher-forced logits), streaming, the options an
encoder-decoder refuses and the input errors."""

from __future__ import annotations

import pytest
import torch
from _seq2seq import (
    SEQ2SEQ_VARIANTS,
    build_seq2seq,
    clear_prefix,
    close,
    converter,
    hf_generate,
    save_models,
    seq2seq_config_changes,
    seq2seq_inputs,
)

import warpformer
from warpformer.converters import convert
from warpformer.reference_seq2seq import Seq2SeqReferenceEngine
from warpformer.seq2seq import Seq2Seq

NAMES = list(SEQ2SEQ_VARIANTS)
LENGTHS = [9, 4, 7]
NEW = 8
MAX_SEQ = 24  # under the BART tables (32 positions)


def _loader(models, root):
    get = converter(models, root, convert)
    cache: dict[str, Seq2Seq] = {}

    def load(name: str) -> Seq2Seq:
        if name not in cache:
            cache[name] = Seq2Seq.from_pretrained(get(name, 1), backend="reference",
                                                  max_batch=4, max_seq_len=MAX_SEQ)
        return cache[name]
    return load


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """name -> (HF model, checkpoint dir)."""
    return save_models(build_seq2seq, NAMES, tmp_path_factory.mktemp("s2s-hf"),
                       seq2seq_config_changes)


@pytest.fixture(scope="module")
def load(hf, tmp_path_factory):
    return _loader(hf, tmp_path_factory.mktemp("s2s-wf"))


@pytest.fixture(scope="module")
def hf_ends(tmp_path_factory):
    """As ``hf`` with the end token made likely (T5: rows end at various lengths)."""
    return save_models(lambda name: build_seq2seq(name, end_boost=0.3 if name == "bart" else 1.0),
                       NAMES, tmp_path_factory.mktemp("s2s-hf-ends"), seq2seq_config_changes)


@pytest.fixture(scope="module")
def load_ends(hf_ends, tmp_path_factory):
    return _loader(hf_ends, tmp_path_factory.mktemp("s2s-wf-ends"))


def _lengths(mask: torch.Tensor) -> torch.Tensor:
    return mask.sum(1)


# ---------------------------------------------------------------------------- HF parity
@pytest.mark.parametrize("name", NAMES)
def test_encode_matches_hf(name, hf, load):
    model, m = hf[name][0], load(name)
    ids, mask = seq2seq_inputs(name, LENGTHS)
    with torch.no_grad():
        want = model.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state
    got = m.encode(ids, input_lengths=_lengths(mask))
    assert got.shape == (3, 9, 32) and got.dtype == torch.float32
    close(got, want * mask[..., None])
    rows = [ids[b, :n].tolist() for b, n in enumerate(LENGTHS)]
    close(m.encode(rows), got)  # lists of token lists: padded the same way


@pytest.mark.parametrize("name", NAMES)
def test_greedy_matches_hf_and_rows_alone(name, hf, load):
    model, m = hf[name][0], load(name)
    ids, mask = seq2seq_inputs(name, LENGTHS)
    want = hf_generate(model, ids, mask, NEW)
    out = m.generate(ids, NEW, input_lengths=_lengths(mask))
    end, start = m.end_id, m.decoder_start_id
    assert out.sequences.shape == (3, 1, 1 + NEW) and out.sequences.dtype == torch.long
    assert out.sequences[:, 0, 0].tolist() == [start] * 3
    assert out.input_lengths.tolist() == LENGTHS
    for b in range(3):
        tokens = out.tokens[b][0]
        n = min(clear_prefix(want.scores, b), len(tokens))
        assert n >= 1
        assert tokens[:n] == want.sequences[b, 1:1 + n].tolist(), b
        assert int(out.sequence_lengths[b, 0]) == 1 + len(tokens)
        assert out.sequences[b, 0, 1:1 + len(tokens)].tolist() == tokens
        assert (out.sequences[b, 0, 1 + len(tokens):] == end).all()
        assert len(tokens) == NEW or tokens[-1] == end
        alone = m.generate([ids[b, :LENGTHS[b]].tolist()], NEW)
        assert alone.tokens[0] == out.tokens[b]


@pytest.mark.parametrize("name, lp", [("t5-small", 0.5), ("t5-v1_1", 0.8), ("mt5", 1.5),
                                      ("ul2", 1.0), ("bart", 1.3), ("mbart", 0.5)])
def test_beam_search_matches_hf(name, lp, hf_ends, load_ends):
    model, m = hf_ends[name][0], load_ends(name)
    end, W, n_new = m.end_id, 4, 10
    ids, mask = seq2seq_inputs(name, LENGTHS)
    want = hf_generate(model, ids, mask, n_new, num_beams=W, num_return_sequences=W,
                       length_penalty=lp)
    out = m.generate(ids, n_new, input_lengths=_lengths(mask), num_beams=W, length_penalty=lp)
    assert out.sequences.shape == (3, W, 1 + n_new)
    assert (out.sequences[:, :, 0] == m.decoder_start_id).all()
    ended = 0
    for b in range(3):
        for k in range(W):
            hs = want.sequences[b * W + k, 1:].tolist()
            hs = hs[: hs.index(end) + 1] if end in hs else hs
            assert out.tokens[b][k] == hs, f"row {b} beam {k}"
            ended += hs[-1] == end
        gen = (out.sequence_lengths[b] - 1).float()
        torch.testing.assert_close(out.cum_log_probs[b] / gen ** lp,
                                   want.sequences_scores[b * W:(b + 1) * W], rtol=1e-4, atol=1e-4)
        alone = m.generate([ids[b, :LENGTHS[b]].tolist()], n_new, num_beams=W, length_penalty=lp)
        assert alone.tokens[0] == out.tokens[b]
        torch.testing.assert_close(alone.cum_log_probs[0], out.cum_log_probs[b], rtol=1e-5,
                                   atol=1e-4)  # (sums in another order)
    if name != "t5-small":  # (its tied head never picks the end token)
        assert ended > 0, "no hypothesis ended with end_id: the test does not cover finishing"


def _teacher_forced_log_probs(m: Seq2Seq, ids, lengths, out, temperature=1.0):
    """Log probs ``[B, beams, N]`` of each generated token under the reference's
    teacher-forced decoder logits (0 past a sequence's end)."""
    ref = m.engine.model
    B, W, T = out.sequences.shape
    enc = ref.encode(ids, lengths)
    lp = torch.zeros(B, W, T - 1)
    for k in range(W):
        logits = ref.decoder_logits(enc, lengths, out.sequences[:, k]) / temperature
        full = torch.log_softmax(logits[:, :-1], -1).gather(
            2, out.sequences[:, k, 1:, None])[..., 0]
        valid = torch.arange(T - 1)[None] < (out.sequence_lengths[:, k, None] - 1)
        lp[:, k] = full * valid
    return lp


@pytest.mark.parametrize("name", ["t5-v1_1", "bart"])
def test_log_probs_match_the_decoder(name, load_ends):
    m = load_ends(name)
    ids, mask = seq2seq_inputs(name, LENGTHS)
    lengths = _lengths(mask)
    out = m.generate(ids, NEW, input_lengths=lengths, temperature=0.7, return_log_probs=True,
                     return_cum_log_probs=1)
    want = _teacher_forced_log_probs(m, ids, lengths, out, temperature=0.7)
    assert out.log_probs.shape == (3, 1, NEW)
    torch.testing.assert_close(out.log_probs, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.cum_log_probs, want.sum(-1), rtol=1e-4, atol=1e-5)
    beams = m.generate(ids, NEW, input_lengths=lengths, num_beams=3, length_penalty=0.6,
                       return_log_probs=True)
    want = _teacher_forced_log_probs(m, ids, lengths, beams)
    torch.testing.assert_close(beams.log_probs, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(beams.cum_log_probs, want.sum(-1), rtol=1e-4, atol=1e-5)
    assert m.generate(ids, 2, input_lengths=lengths).cum_log_probs is None


# ---------------------------------------------------------------------------- options
@pytest.mark.parametrize("name, ours, theirs", [
    ("t5-v1_1", dict(repetition_penalty=1.8), dict(repetition_penalty=1.8)),
    ("mbart", dict(repetition_penalty=1.8), dict(repetition_penalty=1.8)),
    ("ul2", dict(repetition_penalty=0.6), dict(repetition_penalty=0.6)),
    ("bart", dict(repetition_penalty=0.6), dict(repetition_penalty=0.6)),
    ("t5-v1_1", dict(min_length=6), dict(min_new_tokens=6)),
    ("ul2", dict(min_length=6), dict(min_new_tokens=6)),
    ("t5-small", dict(bad_words=None), dict(bad_words_ids=None)),
    ("mbart", dict(bad_words=None), dict(bad_words_ids=None)),
])
def test_options_match_hf(name, ours, theirs, hf, load, hf_ends, load_ends):
    ends = "min_length" in ours  # the models whose rows end early
    model, m = (hf_ends if ends else hf)[name][0], (load_ends if ends else load)(name)
    ids, mask = seq2seq_inputs(name, LENGTHS)
    lengths = _lengths(mask)
    plain = m.generate(ids, NEW, input_lengths=lengths)
    if "bad_words" in ours:  # ban row 0's first token and a two-token word of row 1's output
        words = [[plain.tokens[0][0][0]], plain.tokens[1][0][1:3]]
        assert m.end_id not in sum(words, [])  # (HF drops a bad word [end_id])
        ours, theirs = dict(bad_words=words), dict(bad_words_ids=words)
    if "min_length" in ours:
        assert min(len(t[0]) for t in plain.tokens) < 6, "no row ends early: vacuous"
    out = m.generate(ids, NEW, input_lengths=lengths, **ours)
    assert out.tokens != plain.tokens, "the option changed nothing: the test is vacuous"
    want = hf_generate(model, ids, mask, NEW, **theirs)
    for b in range(3):
        tokens = out.tokens[b][0]
        n = min(clear_prefix(want.scores, b), len(tokens))
        assert tokens[:n] == want.sequences[b, 1:1 + n].tolist(), b
        if "min_length" in ours:
            assert m.end_id not in tokens[:6]


def naive(m: Seq2Seq, row: list[int], n: int, *, pres=0.0, freq=0.0, rep=1.0, stop=(),
          temperature=1.0) -> list[int]:
    """Greedy decoding without a cache, every option applied by hand (the oracle): the
    reference's teacher-forced logits of the whole decoder sequence at each step."""
    ref = m.engine.model
    enc = ref.encode(torch.tensor([row]))
    seq, out = [m.decoder_start_id], []
    for _ in range(n):
        logits = ref.decoder_logits(enc, None, torch.tensor([seq]))[0, -1].clone()
        for tok in set(seq):
            logits[tok] = logits[tok] * rep if logits[tok] < 0 else logits[tok] / rep
            logits[tok] -= pres + freq * seq.count(tok)
        tok = int((logits / temperature).argmax())
        seq.append(tok)
        out.append(tok)
        if tok == m.end_id or any(seq[len(seq) - len(w):] == list(w) for w in stop):
            break
    return out


@pytest.mark.parametrize("name", ["t5-small", "bart"])
@pytest.mark.parametrize("kwargs, oracle", [
    (dict(presence_penalty=1.5), dict(pres=1.5)),
    (dict(frequency_penalty=0.7), dict(freq=0.7)),
    (dict(repetition_penalty=1.5, presence_penalty=0.5, temperature=0.8),
     dict(rep=1.5, pres=0.5, temperature=0.8)),
])
def test_penalties_match_naive(name, kwargs, oracle, load):
    m = load(name)
    ids, mask = seq2seq_inputs(name, LENGTHS)
    out = m.generate(ids, NEW, input_lengths=_lengths(mask), **kwargs)
    assert out.tokens != m.generate(ids, NEW, input_lengths=_lengths(mask)).tokens
    for b, n in enumerate(LENGTHS):
        assert out.tokens[b][0] == naive(m, ids[b, :n].tolist(), NEW, **oracle), b


@pytest.mark.parametrize("name", ["t5-v1_1", "mbart"])
def test_stop_words(name, load):
    m = load(name)
    ids, mask = seq2seq_inputs(name, LENGTHS)
    lengths = _lengths(mask)
    plain = m.generate(ids, NEW, input_lengths=lengths, end_id=95)
    # per row: a two-token word ending at its output's 4th token, one starting with the start
    # token (the decoder's prompt) for row 1, one that never occurs for row 2
    words = [[plain.tokens[0][0][2:4]], [[m.decoder_start_id, plain.tokens[1][0][0]]],
             [[94, 93, 92]]]
    out = m.generate(ids, NEW, input_lengths=lengths, end_id=95, stop_words=words)
    first = next(i for i in range(1, NEW) if plain.tokens[0][0][i - 1:i + 1] == words[0][0])
    assert out.tokens[0][0] == plain.tokens[0][0][:first + 1]
    assert out.tokens[1][0] == plain.tokens[1][0][:1]
    assert out.tokens[2][0] == plain.tokens[2][0]
    assert out.sequence_lengths[:, 0].tolist() == [first + 2, 2, 1 + NEW]
    for b in range(3):
        assert out.tokens[b][0] == naive(m, ids[b, :LENGTHS[b]].tolist(), NEW, stop=words[b])


def test_hidden_states_match_hf(hf, load):
    name = "t5-v1_1"
    model, m = hf[name][0], load(name)
    ids, mask = seq2seq_inputs(name, LENGTHS)
    out = m.generate(ids, NEW, input_lengths=_lengths(mask), return_hidden_states=True)
    want = hf_generate(model, ids, mask, NEW, output_hidden_states=True)
    assert out.hidden_states.shape == (3, 1, NEW, 32)
    for b in range(3):
        n = min(clear_prefix(want.scores, b), len(out.tokens[b][0]))
        for i in range(n):  # HF's last layer state: after the final norm, before the rescale
            close(out.hidden_states[b, 0, i], want.decoder_hidden_states[i][-1][b, -1],
                  want.decoder_hidden_states[i][-1])
        assert float(out.hidden_states[b, 0, len(out.tokens[b][0]):].abs().sum()) == 0


def test_end_id_per_row(load):
    m = load("t5-v1_1")
    ids, mask = seq2seq_inputs("t5-v1_1", LENGTHS)
    plain = m.generate(ids, NEW, input_lengths=_lengths(mask), end_id=95)
    ends = [plain.tokens[0][0][2], 95, plain.tokens[2][0][0]]
    out = m.generate(ids, NEW, input_lengths=_lengths(mask), end_id=ends)
    for b in range(3):
        row = plain.tokens[b][0]
        n = row.index(ends[b]) + 1 if ends[b] in row else len(row)
        assert out.tokens[b][0] == row[:n]
        assert (out.sequences[b, 0, 1 + n:] == ends[b]).all()


def test_sampling_seeds_and_filters(load):
    m = load("t5-small")
    ids, mask = seq2seq_inputs("t5-small", LENGTHS)
    lengths = _lengths(mask)
    kw = dict(do_sample=True, top_k=0, temperature=1.5, end_id=95)
    a = m.generate(ids, NEW, input_lengths=lengths, seed=7, **kw)
    assert a.tokens == m.generate(ids, NEW, input_lengths=lengths, seed=7, **kw).tokens
    assert a.tokens != m.generate(ids, NEW, input_lengths=lengths, seed=8, **kw).tokens
    alone = m.generate([ids[1, :4].tolist()], NEW, seed=[7], **kw)
    assert alone.tokens[0] == a.tokens[1]  # a row's draws depend on its seed only
    ref = m.engine.model
    logits = ref.decoder_logits(ref.encode(ids[:1], lengths[:1]), lengths[:1],
                                torch.tensor([[m.decoder_start_id]]))[0, -1]
    top3 = set(logits.topk(3).indices.tolist())
    firsts = {m.generate([ids[0].tolist()], 1, do_sample=True, top_k=3, seed=s).tokens[0][0][0]
              for s in range(30)}
    assert firsts <= top3 and len(firsts) > 1


def test_generate_stream_equals_generate(load):
    m = load("mt5")
    ids, mask = seq2seq_inputs("mt5", LENGTHS)
    kw = dict(input_lengths=_lengths(mask), do_sample=True, top_p=0.9, seed=[3, 4, 5],
              return_log_probs=True)
    full = m.generate(ids, NEW, **kw)
    stream = m.generate_stream(ids, NEW, **kw)
    steps = []
    while True:
        try:
            steps.append(next(stream))
        except StopIteration as stop:
            final = stop.value
            break
    assert all(s.shape == (3, 1) for s in steps)
    seen = torch.cat(steps, 1)
    for b in range(3):
        assert seen[b, :len(full.tokens[b][0])].tolist() == full.tokens[b][0]
    assert final.tokens == full.tokens and torch.equal(final.sequences, full.sequences)
    torch.testing.assert_close(final.log_probs, full.log_probs)
    chunks = list(m.generate_stream(ids, NEW, chunk_size=3, **kw))
    assert chunks[0].shape[1] == 3 and torch.equal(torch.cat(chunks, 1), seen)
    s = m.generate_stream(ids, NEW, **kw)
    next(s)
    s.close()  # releases the call
    assert m.generate(ids, 2, input_lengths=_lengths(mask)).sequences.shape == (3, 1, 3)
    with pytest.raises(ValueError, match=r"num_beams must be 1 for generate_stream"):
        m.generate_stream(ids, 4, num_beams=2)


# ---------------------------------------------------------------------------- refusals, errors
@pytest.mark.parametrize("kwargs, pattern", [
    (dict(memory_len=4), r"^memory_len is not supported by encoder-decoder models"),
    (dict(return_context_embeddings=True),
     r"^return_context_embeddings is not supported by encoder-decoder models: .*\(encode\)"),
    (dict(return_cum_log_probs=2),
     r"^return_cum_log_probs=2 is not supported by encoder-decoder models: .*\(use 1\)"),
    (dict(prompt_embeddings=torch.zeros(1, 2, 32)), r"^prompt_embeddings is not supported"),
    (dict(inputs_embeds=torch.zeros(1, 2, 32)), r"^inputs_embeds is not supported"),
    (dict(prompt_lengths=[1]), r"^prompt_lengths is not supported"),
])
def test_decoder_only_options_are_refused(load, kwargs, pattern):
    m = load("t5-small")
    with pytest.raises(ValueError, match=pattern):
        m.generate([[5, 6, 7]], 3, **kwargs)
    if "memory_len" in kwargs:
        with pytest.raises(ValueError, match=pattern):
            m.generate_stream([[5, 6, 7]], 3, **kwargs)


@pytest.mark.parametrize("key, value", [
    ("session", torch.tensor(1)), ("memory_len", torch.tensor(3)),
    ("prompt_table", torch.zeros(2, 32)), ("return_context_embeddings", torch.tensor(1)),
    ("return_cum_log_probs", torch.tensor(2)),
])
def test_engine_refuses_decoder_only_options(load, key, value):
    engine = load("t5-small").engine
    ids, lengths = torch.tensor([[5, 6, 7]], dtype=torch.int32), torch.tensor([3])
    with pytest.raises(RuntimeError, match=rf"^Seq2SeqModel\.decode: option '{key}' is not "
                                           "supported by encoder-decoder models"):
        engine.decode(ids, lengths, 3, {key: value})
    assert engine.decode(ids, lengths, 2, {})["output_ids"].shape == (1, 1, 3)  # still usable


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(do_sample=True, top_p=2.0), r"^Seq2SeqModel\.decode: option 'top_p' must be in"),
    (dict(num_beams=17), r"'beam_width' \(num_beams\) must be in \[1, 16\], got 17"),
    (dict(num_beams=2, stop_words=[[5]]), r"'stop_words' is not supported when 'beam_width'"),
    (dict(end_id=96), r"'end_id' must be in \[0, 96\), got 96"),
    (dict(bad_words=[[3, 97]]), r"'bad_words' token 97 is outside the vocabulary"),
])
def test_option_errors_name_the_option(load, kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        load("bart").generate([[5, 6, 2]], 3, **kwargs)


def test_unknown_argument_is_a_type_error(load):
    with pytest.raises(TypeError, match=r"unexpected argument\(s\) \['top_q'\]"):
        load("bart").generate([[5, 6, 2]], 3, top_q=0.5)


@pytest.mark.parametrize("ids, n, lengths, pattern", [
    ([[5, 96]], 3, None, r"input_ids\[0, 1\] = 96 is outside the vocabulary \[0, 96\)"),
    ([[-1, 5]], 3, None, r"input_ids\[0, 0\] = -1 is outside the vocabulary"),
    (torch.tensor([[5, 6, 96]]), 3, [2], None),  # past the row's length: not read
    (torch.tensor([[5, 6, 7]]), 3, [4], r"input_lengths must be <= S = 3"),
    (torch.tensor([[5, 6, 7]]), 3, [0], r"input_lengths: row 0 is empty"),
    ([[5] * (MAX_SEQ + 1)], 3, None, rf"encoder input length {MAX_SEQ + 1} exceeds max_seq_len "
                                     rf"\({MAX_SEQ}\)"),
    ([[5] * MAX_SEQ], MAX_SEQ, None, rf"1 \(the decoder start token\) \+ max_new_tokens "
                                     rf"{MAX_SEQ} = {MAX_SEQ + 1} exceeds max_seq_len"),
    ([[5]] * 5, 3, None, r"batch size 5 exceeds max_batch \(4\)"),
    ([[5, 6], []], 3, None, r"input_ids row 1 is empty"),
    ([[5, 6]], 0, None, r"max_new_tokens must be an integer >= 1"),
    (torch.ones(1, 3), 3, None, r"input_ids must hold integers"),
])
def test_input_errors(load, ids, n, lengths, pattern):
    m = load("t5-small")
    if pattern is None:
        assert m.generate(ids, n, input_lengths=lengths).sequences.shape == (1, 1, 1 + n)
        return
    with pytest.raises(ValueError, match=pattern):
        m.generate(ids, n, input_lengths=lengths)
    if n >= 1 and pattern.startswith(("input", "encoder", "batch")):
        with pytest.raises(ValueError, match=pattern):
            m.encode(ids, lengths)


def test_engine_contract(load):
    m = load("mbart")
    engine = m.engine
    assert isinstance(engine, Seq2SeqReferenceEngine)
    assert (engine.max_batch(), engine.max_seq_len()) == (4, MAX_SEQ)
    ids = torch.tensor([[5, 6, 7, 2], [8, 2, 1, 1]], dtype=torch.int32)
    lengths = torch.tensor([4, 2], dtype=torch.int32)
    out = engine.decode(ids, lengths, 5, {"beam_width": torch.tensor(3),
                                          "return_log_probs": torch.tensor(1)})
    assert set(out) == {"output_ids", "sequence_lengths", "cum_log_probs", "output_log_probs"}
    assert out["output_ids"].shape == (2, 3, 6) and out["output_ids"].dtype == torch.int32
    assert out["sequence_lengths"].dtype == torch.int32
    assert (out["output_ids"][:, :, 0] == m.decoder_start_id).all()
    assert out["output_log_probs"].shape == (2, 3, 5)
    enc = engine.encode(ids, lengths)
    assert enc.shape == (2, 4, 32) and float(enc[1, 2:].abs().max()) == 0
    engine.decode_start(ids, lengths, 4, {})
    first = engine.decode_step(1)
    rest = engine.decode_step(10)
    assert first.shape == (2, 1, 1) and rest.shape[:2] == (2, 1)
    assert engine.decode_step(1).shape == (2, 1, 0)  # ended
    done = engine.decode_finish()
    assert done["output_ids"][:, 0, 1:2].tolist() == first[:, 0].tolist()
    for call, pattern in ((lambda: engine.decode_step(1), r"decode_step called without"),
                          (engine.decode_finish, r"decode_finish called without"),
                          (lambda: engine.decode(ids, lengths, MAX_SEQ, {}),
                           rf"output_len {MAX_SEQ} must be in \[1, max_seq_len - 1"),
                          (lambda: engine.encode(ids, torch.tensor([5, 1])),
                           r"^Seq2SeqModel\.encode: input_lengths must be in \[1, 4\]"),
                          (lambda: engine.decode(ids + 100, lengths, 2, {}),
                           r"input_ids\[0, 0\] = 105 is outside the vocabulary")):
        with pytest.raises(RuntimeError, match=pattern):
            call()


def test_from_pretrained(hf, load, tmp_path):
    m = load("bart")
    path = converter(hf, tmp_path, convert)("bart", 2)  # a TP-2 folder: merged by the reference
    two = Seq2Seq.from_pretrained(path, backend="reference", max_seq_len=MAX_SEQ)
    assert two.generate([[5, 6, 2]], 4).tokens == m.generate([[5, 6, 2]], 4).tokens
    assert two.max_seq_len == MAX_SEQ and two.dtype == torch.float32
    assert Seq2Seq.from_pretrained(path, backend="reference").max_seq_len == 32  # the table
    assert warpformer.T5 is warpformer.Bart is warpformer.Seq2Seq is Seq2Seq
    assert "Seq2Seq(bart" in repr(m)
    for kwargs, pattern in (
            (dict(backend="tpu"), r"backend must be 'auto', 'engine' \(or 'cuda'\) or"),
            (dict(backend="reference", max_seq_len=33),
             r"max_seq_len \(33\) exceeds the model's position tables \(max_pos_seq_len = 32\)"),
            (dict(backend="reference", max_seq_len=1), r"max_seq_len must be an integer >= 2"),
            (dict(backend="reference", max_batch=0), r"max_batch must be a positive integer"),
            (dict(backend="reference", tensor_para_size=2), r"run on one device for now"),
            (dict(dtype=torch.int8), r"dtype must be torch.float32"),
            (dict(backend="reference", prefill_tokens=0), r"prefill_tokens must be None")):
        with pytest.raises(ValueError, match=pattern):
            Seq2Seq.from_pretrained(path, **kwargs)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"backend='engine' needs a CUDA device"):
            Seq2Seq.from_pretrained(path, backend="engine")
        with pytest.warns(UserWarning, match=r"using the plain-PyTorch reference backend"):
            auto = Seq2Seq.from_pretrained(path, max_seq_len=MAX_SEQ)
        assert auto.backend == "reference"
    for call in (lambda: m.generate([[5, 6, 2]], 2, top_k=4),
                 lambda: list(m.generate_stream([[5, 6, 2]], 2, top_k=4))):
        with pytest.warns(UserWarning, match=r"top_k/top_p are ignored") as rec:
            call()
        assert rec[0].filename == __file__  # at the caller


def test_engine_backend_gets_cpu_int32_inputs(load, tmp_path):
    """Through backend="engine" the inputs stay on the CPU as int32 (the engine checks them
    there); results equal the reference's. A GPT folder is refused by its config."""
    m = load("t5-v1_1")
    seen = []

    class Recorder:  # an engine stand-in that records what Seq2Seq hands the engine
        def __getattr__(self, name):
            method = getattr(m.engine, name)

            def call(*args):
                seen.append((name, [(a.device.type, a.dtype) for a in args[:2]
                                    if isinstance(a, torch.Tensor)]))
                return method(*args)
            return call

    e = Seq2Seq(Recorder(), m.config, "engine", torch.float32, torch.device("cpu"))
    rows = [[5, 6, 7, 8], [9, 10]]
    assert e.generate(rows, 5, num_beams=2).tokens == m.generate(rows, 5, num_beams=2).tokens
    assert torch.equal(e.encode(rows), m.encode(rows))
    for name, args in seen:
        if name in ("decode", "encode"):
            assert args == [("cpu", torch.int32)] * 2, name
    assert {name for name, _ in seen} >= {"decode", "encode"}
    (tmp_path / "config.ini").write_text("[gpt]\nmodel_name = gpt2\n")
    with pytest.raises(ValueError, match=r"no \[encoder\] or \[decoder\] section"):
        Seq2Seq.from_pretrained(tmp_path, backend="reference")
