"""``examples/chat_session.py`` on CPU (reference backend): a tiny random GPT-2 with the demo's
word-level tokenizer (built offline), converted once; the replies of ``--turns`` and of turns on
stdin equal ``GPT.generate`` over the whole conversation, and bad input gets ``error: ...``."""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path

import pytest
import torch
import transformers

import warpformer  # noqa: F401
from warpformer.converters import convert
from warpformer.demo import build_random_gpt2, default_dataset
from warpformer.gpt import GPT

ROOT = Path(__file__).resolve().parents[1]
TURNS = ["The old lighthouse keeper", "She said", "He looked at the"]
N = 6  # new tokens a turn


def _load_example():
    spec = importlib.util.spec_from_file_location("example_chat_session",
                                                  ROOT / "examples" / "chat_session.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat_session")
    hf = build_random_gpt2(default_dataset(), root / "hf", layers=1, hidden=64, heads=2,
                           positions=128)
    convert(hf, root / "wf", 1, "fp32")
    gpt = GPT.from_pretrained(root / "wf" / "1-gpu", dtype=torch.float32, max_batch=1,
                              max_seq_len=128, backend="reference")
    tok = transformers.AutoTokenizer.from_pretrained(hf)
    return dict(hf=hf, ckpt=root / "wf" / "1-gpu", gpt=gpt, tok=tok, example=_load_example())


def expected(w, turns: list[str], template: str = "{text}") -> list[str]:
    """Each turn's reply from GPT.generate over the whole conversation so far."""
    gpt, tok, history, replies = w["gpt"], w["tok"], [], []
    for i, text in enumerate(turns):
        history += tok.encode(template.format(text=text), add_special_tokens=i == 0)
        reply = gpt.generate([history], N).tokens[0][0]
        history += reply
        shown = reply[:-1] if reply and reply[-1] in gpt.end_ids else reply
        replies.append(tok.decode(shown))
    return replies


def run(w, capsys, *argv: str) -> tuple[int, str, str]:
    rc = w["example"].main(["--ckpt_path", str(w["ckpt"]), "--tokenizer_path", str(w["hf"]),
                            "--backend", "reference", "--dtype", "fp32", "--max_len", "128",
                            "--max_new_tokens", str(N), *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_turns_reply_as_one_shot_generation(world, capsys):
    rc, out, err = run(world, capsys, "--turns", *TURNS)
    assert rc == 0, err
    assert out.splitlines() == expected(world, TURNS)
    status = [line for line in err.splitlines() if line.startswith("[turn ")]
    assert len(status) == 3
    first = len(world["tok"].encode(TURNS[0]))
    assert status[0].startswith(f"[turn 1] prompt tokens {first}, history 0, new tokens ")
    assert status[0].endswith(" ms")


def test_template_and_stdin(world, capsys, monkeypatch):
    template = "She said {text}"
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(TURNS[:2]) + "\n\n" + TURNS[2]))
    rc, out, err = run(world, capsys, "--template", template)
    assert rc == 0, err
    assert out.splitlines() == expected(world, TURNS[:2], template)  # the empty line ends it


def test_sampling_is_seeded(world, capsys):
    argv = ("--top_k", "4", "--random_seed", "3", "--turns", *TURNS[:2])
    first, second = run(world, capsys, *argv), run(world, capsys, *argv)
    assert first[0] == 0 and first[1] == second[1] and len(first[1].splitlines()) == 2


def test_errors(world, capsys, tmp_path):
    rc, _, err = run(world, capsys, "--template", "no placeholder", "--turns", "x")
    assert rc == 2 and "error: --template must contain {text}" in err
    rc = world["example"].main(["--ckpt_path", str(world["ckpt"]), "--backend", "reference",
                                "--turns", "x"])
    assert rc == 2 and "holds no tokenizer: pass --tokenizer_path" in capsys.readouterr().err
    # a conversation longer than --max_len stops with the session's error
    rc, out, err = run(world, capsys, "--max_len", "16", "--turns", *TURNS)
    assert rc == 2 and "error: turn " in err and "exceeds the session's max_len (16)" in err
