"""CPU smoke test of benchmarks/bench_session.py: its main on the reference backend with the tiny
random model, 3 turns of 4 new tokens (each turn adds 5 tokens to the history: its new tokens
and its generated one), the table and result files it writes, and its argument rules. The timed
run on the engine is on the device machine."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
bench = importlib.import_module("bench_session")


def test_reference_smoke_run(tmp_path, capsys):
    rc = bench.main(["--backend", "reference", "--models", "tiny", "--turns", "3",
                     "--turn-tokens", "4", "--repeats", "2", "--warmup", "1",
                     "--out-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    (md,) = tmp_path.glob("session_cpu_*.md")
    (js,) = tmp_path.glob("session_cpu_*.json")
    lines = md.read_text().splitlines()
    head = "| " + " | ".join(bench.HEADERS) + " |"
    start = lines.index(head)
    body = [line.strip("| ").split(" | ") for line in lines[start + 2:] if line.startswith("|")]
    assert [(r[0], r[1]) for r in body] == [("1", "0"), ("2", "5"), ("3", "10")]
    for r in body:
        assert float(r[2]) > 0 and float(r[3]) > 0 and r[4].endswith("x")
        assert r[5] == "yes"  # the session's turn generated the one-shot call's token
    assert head in out and "### tiny (2 layers)" in out
    payload = json.loads(js.read_text())
    assert payload["benchmark"] == "session" and payload["errors"] == {}
    rows = payload["rows"]
    assert [(r["turn"], r["history"], r["new"]) for r in rows] == [(1, 0, 4), (2, 5, 4),
                                                                    (3, 10, 4)]
    assert all(len(r["session_samples_ms"]) == len(r["recompute_samples_ms"]) == 2 for r in rows)


def test_arguments():
    args = bench.parse_args(["--models", "tiny,gpt-j-6b", "--layers", "2", "--turns", "4",
                             "--turn-tokens", "8"])
    assert [s.name for s in args.shapes] == ["tiny", "gpt-j-6b"]
    assert [s.layers for s in args.shapes] == [2, 2] and args.max_len == 4 * 9
    assert bench.parse_args([]).shapes[0].name == "gpt-j-6b"
    for bad in (["--models", "gpt-5"], ["--turns", "0"], ["--warmup", "-1"],
                ["--models", "gpt2-medium", "--turns", "20", "--turn-tokens", "64"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)
