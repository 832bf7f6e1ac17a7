"""Interactive sessions (GPT.start_session) on CPU through the reference backend: every turn equals
GPT.generate over the whole history in one call (greedy and sampled, rows ending early, two
sessions on one instance), a turn runs the prompt pass over its new tokens only, the engine-level
option reuses the longest cached prefix of any ids, and bad requests get clear errors."""

from __future__ import annotations

import pytest
import torch
from _models import build

import warpformer  # noqa: F401
from warpformer.converters import convert
from warpformer.gpt import GPT

TURNS = [  # three turns of new tokens for three rows (ragged)
    [[5, 17, 42, 9, 33], [7, 3], [60, 61, 62, 11, 12, 13, 14]],
    [[8, 9], [70, 71, 72, 73], [4]],
    [[20, 21, 22], [23], [24, 25]],
]


@pytest.fixture(scope="module", params=["gpt2", "bloom", "gptj"])
def gpt(request, tmp_path_factory):
    """A tiny random model of each position scheme: learned positions, ALiBi, rotary."""
    root = tmp_path_factory.mktemp(f"sessions_{request.param}")
    build(request.param, seed=5).save_pretrained(root / "hf")
    convert(root / "hf", root / "wf", 1, "fp32")
    return GPT.from_pretrained(root / "wf" / "1-gpu", dtype=torch.float32, max_batch=4,
                               max_seq_len=32, backend="reference")


def _same(got, want) -> None:
    assert torch.equal(got.sequences, want.sequences)
    assert torch.equal(got.sequence_lengths, want.sequence_lengths)
    assert got.tokens == want.tokens


def _prefill_tokens(gpt, monkeypatch) -> list[int]:
    """Records the token count of every call of the reference model from now on (a prompt pass
    in a session runs per row; a decode step runs one token per row)."""
    seen: list[int] = []
    model = gpt.engine.model
    run = model._run

    def counting(ids, pos, caches=None, **kw):
        seen.append(int(ids.shape[1]))
        return run(ids, pos, caches, **kw)

    monkeypatch.setattr(model, "_run", counting)
    return seen


def test_turns_equal_one_shot_generation(gpt, monkeypatch):
    """Greedy turns: each equals generate(history + new ids); from turn 2 on, a row's prompt pass
    runs its new tokens plus the last generated token only (the history comes from its cache)."""
    # An end id that row 0 produces at its third step in turn 1: a row ending early keeps its
    # history up to and including that token.
    first = gpt.generate([TURNS[0][0]], 6)
    end_id = first.tokens[0][0][2]
    history = [[] for _ in TURNS[0]]
    with gpt.start_session(3, 32) as chat:
        for t, new in enumerate(TURNS):
            full = [h + n for h, n in zip(history, new, strict=True)]
            want = gpt.generate(full, 6, end_id=end_id)
            seen = _prefill_tokens(gpt, monkeypatch)
            got = chat.generate(new, 6, end_id=end_id)
            monkeypatch.undo()
            _same(got, want)
            if t > 0:  # one prompt call per row: its new tokens + the pending last token
                assert seen[:3] == [len(n) + 1 for n in new], (t, seen)
            history = [got.sequences[b, 0, :int(got.sequence_lengths[b, 0])].tolist()
                       for b in range(3)]
            assert chat.history == history
        assert end_id in chat.history[0][:len(TURNS[0][0]) + 6]


def test_sampled_turns_equal_one_shot(gpt):
    """Sampling with seeds, penalties and a stop word: the turn is the same call as one-shot
    generation over the history (penalties count the whole history, as they do there)."""
    opts = dict(do_sample=True, top_k=8, seed=[1, 2, 3], temperature=0.9,
                repetition_penalty=1.3, stop_words=[[11, 12]])
    history = [[] for _ in TURNS[0]]
    with gpt.start_session(3, 32) as chat:
        for new in TURNS:
            full = [h + n for h, n in zip(history, new, strict=True)]
            want = gpt.generate(full, 5, **opts)
            got = chat.generate(new, 5, **opts)
            _same(got, want)
            history = chat.history


def test_two_sessions_do_not_see_each_other(gpt):
    """Interleaved turns of two sessions (and a plain generate between them) on one instance."""
    a, b = gpt.start_session(2, 32), gpt.start_session(1, 28)
    hist_a, hist_b = [[], []], [[]]
    for t in range(3):
        new_a, new_b = TURNS[t][:2], TURNS[t][2:]
        want_a = gpt.generate([h + n for h, n in zip(hist_a, new_a, strict=True)], 4)
        want_b = gpt.generate([h + n for h, n in zip(hist_b, new_b, strict=True)], 4)
        _same(a.generate(new_a, 4), want_a)
        gpt.generate([[1, 2, 3, 4, 5, 6]], 3)  # a call outside both sessions
        _same(b.generate(new_b, 4), want_b)
        hist_a, hist_b = a.history, b.history
    a.close()
    b.close()
    a.close()  # idempotent


def test_engine_option_reuses_the_longest_cached_prefix(gpt):
    """The engine-level option: ids that share only part of what the session row holds (an
    edited history) still give the results of the call without the session."""
    eng = gpt.engine
    handle = eng.open_session(1, 32)
    session = {"session": torch.tensor(handle), "end_id": torch.tensor(0)}
    plain = {"end_id": torch.tensor(0)}
    first = torch.tensor([[5, 17, 42, 9, 33, 8, 2]], dtype=torch.int32)
    edited = torch.tensor([[5, 17, 42, 1, 1, 1, 1, 1]], dtype=torch.int32)
    for ids in (first, edited, first):
        lens = torch.tensor([ids.shape[1]], dtype=torch.int32)
        got = eng.decode(ids, lens, 4, session)
        want = eng.decode(ids, lens, 4, plain)
        assert torch.equal(got["output_ids"], want["output_ids"])
    eng.close_session(handle)


def test_session_errors(gpt):
    with pytest.raises(ValueError, match=r"batch must be in \[1, max_batch = 4\], got 5"):
        gpt.start_session(5, 16)
    with pytest.raises(ValueError, match=r"max_len must be in \[2, max_seq_len = 32\], got 33"):
        gpt.start_session(1, 33)
    chat = gpt.start_session(2, 12)
    with pytest.raises(ValueError, match=r"new_ids has 1 rows; the session has 2"):
        chat.generate([[1, 2]], 3)
    with pytest.raises(ValueError, match=r"num_beams must be 1 in a session"):
        chat.generate([[1], [2]], 3, num_beams=2)
    with pytest.raises(ValueError, match=r"row 1 has no tokens"):
        chat.generate([[1], []], 3)
    chat.generate([[1, 2, 3], [4]], 3)
    assert chat.history[0][:3] == [1, 2, 3] and len(chat.history[0]) == 6
    with pytest.raises(ValueError, match=r"row 0: history 6 \+ new tokens 4 \+ max_new_tokens 3 "
                                         r"= 13 exceeds the session's max_len \(12\)"):
        chat.generate([[5, 6, 7, 8], [9]], 3)
    assert len(chat.history[0]) == 6  # a refused turn changes nothing
    chat.close()
    with pytest.raises(ValueError, match=r"the session is closed"):
        chat.generate([[1], [2]], 3)
    eng = gpt.engine
    ids, lens = torch.tensor([[1, 2]], dtype=torch.int32), torch.tensor([2], dtype=torch.int32)
    with pytest.raises(RuntimeError, match=r"option session = 99 is not an open session"):
        eng.decode(ids, lens, 2, {"session": torch.tensor(99)})
    with pytest.raises(RuntimeError, match=r"no open session 99"):
        eng.close_session(99)
    with pytest.raises(ValueError, match=r"'session' must be an open_session handle"):
        gpt._checked({"session": torch.tensor(-1)}, 1)
    # The instance stays usable.
    assert gpt.generate([[1, 2]], 2).tokens[0][0]


def test_memory_len_change_recomputes_and_close_waits(gpt):
    """K/V cached under one attention window are not reused under another: a turn with a new
    memory_len equals one-shot generation with it. A session cannot close while any call runs
    (closing may move the slots a running call uses)."""
    with gpt.start_session(2, 32) as chat:
        chat.generate(TURNS[0][:2], 5)
        full = [h + n for h, n in zip(chat.history, TURNS[1][:2], strict=True)]
        want = gpt.generate(full, 5, memory_len=4)
        _same(chat.generate(TURNS[1][:2], 5, memory_len=4), want)
        full = [h + n for h, n in zip(chat.history, TURNS[2][:2], strict=True)]
        _same(chat.generate(TURNS[2][:2], 5), gpt.generate(full, 5))
        stream = gpt.generate_stream([[1, 2, 3]], 4)
        next(stream)
        with pytest.raises(RuntimeError, match=r"close_session: a generation session is running"):
            chat.close()
        assert not chat.closed
        list(stream)
    assert chat.closed
    eng = gpt.engine
    handle = eng.open_session(1, 8)
    ids = torch.tensor([[1, 2, 0, 0, 0, 0]], dtype=torch.int32)
    with pytest.raises(RuntimeError, match=r"input_ids' width 6 \+ output_len 3 = 9 exceeds the "
                                           r"session's max_len \(8\)"):
        eng.decode(ids, torch.tensor([2], dtype=torch.int32), 3, {"session": torch.tensor(handle)})
    eng.close_session(handle)

