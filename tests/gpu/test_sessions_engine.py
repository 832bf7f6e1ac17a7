"""Interactive sessions on the CUDA engine: every turn equals GPT.generate over the whole history
in one call (greedy, fp32 and fp16; learned positions, ALiBi, rotary, grouped-query), with two
sessions and plain calls interleaved on one instance, and across a growth of the KV cache (more
slots and positions for a plain call) that must keep the sessions' rows."""

from __future__ import annotations

import pytest
import torch
from _models import ENGINE_TINY, make_hf

import warpformer  # noqa: F401
from warpformer.converters import convert
from warpformer.gpt import GPT

pytestmark = pytest.mark.gpu

TURNS = [
    [[5, 17, 42, 9, 33, 100, 7, 8, 9, 10, 11], [7, 3], [60, 61, 62, 11, 12, 13, 14]],
    [[8, 9], [70, 71, 72, 73, 300, 301, 302, 303, 304], [4]],
    [[20, 21, 22], [23], [24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40]],
]
NEW = 12


@pytest.fixture(scope="module", params=["gpt2", "bloom", "gptj", "llama-gqa"])
def folder(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"sessions_{request.param}")
    make_hf(ENGINE_TINY[request.param](), seed=11, peak=4.0).save_pretrained(root / "hf")
    convert(root / "hf", root / "wf", 1, "fp32")
    return root / "wf" / "1-gpu"


def _same(got, want, what) -> None:
    assert got.tokens == want.tokens, what
    assert torch.equal(got.sequence_lengths.cpu(), want.sequence_lengths.cpu()), what


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_turns_equal_one_shot(folder, dtype):
    gpt = GPT.from_pretrained(folder, dtype=dtype, max_batch=4, max_seq_len=160)
    # An end id that row 0 produces early in turn 1: a row that ends keeps its history.
    end_id = gpt.generate([TURNS[0][0]], NEW).tokens[0][0][4]
    history = [[] for _ in TURNS[0]]
    with gpt.start_session(3, 128) as chat:
        for t, new in enumerate(TURNS):
            full = [h + n for h, n in zip(history, new, strict=True)]
            want = gpt.generate(full, NEW, end_id=end_id)
            got = chat.generate(new, NEW, end_id=end_id)
            _same(got, want, (t, dtype))
            history = chat.history


def test_sessions_interleaved_and_cache_growth(folder):
    """Two sessions and plain calls on one instance; a plain call larger than anything before
    grows the cache (slots and positions) between turns, which must keep the sessions' rows."""
    gpt = GPT.from_pretrained(folder, dtype=torch.float16, max_batch=8, max_seq_len=256)
    a, b = gpt.start_session(2, 64), gpt.start_session(1, 200)
    hist_a, hist_b = [[], []], [[]]
    g = torch.Generator().manual_seed(3)
    for t in range(3):
        new_a, new_b = TURNS[t][:2], TURNS[t][2:]
        want_a = gpt.generate([h + n for h, n in zip(hist_a, new_a, strict=True)], NEW)
        want_b = gpt.generate([h + n for h, n in zip(hist_b, new_b, strict=True)], NEW,
                              do_sample=True, top_k=4, seed=5)
        _same(a.generate(new_a, NEW), want_a, ("a", t))
        # Plain calls between the turns, the second one larger every time (a bigger cache).
        big = torch.randint(3, 500, (2 + 3 * t, 40 + 60 * t), generator=g)
        gpt.generate(big, 16)
        _same(b.generate(new_b, NEW, do_sample=True, top_k=4, seed=5), want_b, ("b", t))
        hist_a, hist_b = a.history, b.history
    a.close()
    # Closing a frees its rows for the next session, which starts from nothing.
    c = gpt.start_session(2, 64)
    _same(c.generate(TURNS[0][:2], NEW), gpt.generate(TURNS[0][:2], NEW), "c")
    c.close()
    b.close()
    # Reopening after closes reuses the freed slots: the cache does not grow call after call.
    held = gpt.engine.memory_bytes()
    for _ in range(5):
        with gpt.start_session(2, 64) as d:
            d.generate(TURNS[0][:2], 4)
        gpt.generate(TURNS[1], 4)
    assert gpt.engine.memory_bytes() == held


def test_memory_len_change_and_close_during_a_call(folder):
    """A turn under another memory_len reuses no cached K/V (they were computed under the old
    window) and equals one-shot generation with the new one; a session does not close while a
    plain streaming call runs in the shared slots (closing could move them)."""
    gpt = GPT.from_pretrained(folder, dtype=torch.float32, max_batch=4, max_seq_len=160)
    with gpt.start_session(2, 128) as chat:
        chat.generate(TURNS[0][:2], NEW)
        full = [h + n for h, n in zip(chat.history, TURNS[1][:2], strict=True)]
        _same(chat.generate(TURNS[1][:2], NEW, memory_len=6),
              gpt.generate(full, NEW, memory_len=6), "window")
        stream = gpt.generate_stream([[5, 6, 7, 8, 9]], 20)
        first = next(stream)
        with pytest.raises(RuntimeError, match=r"close_session: a generation session is running"):
            chat.close()
        assert not chat.closed
        rest = [first] + list(stream)
    got = torch.cat(rest, 1)[0].tolist()
    want = gpt.generate([[5, 6, 7, 8, 9]], 20).tokens[0][0]
    assert got[:len(want)] == want

