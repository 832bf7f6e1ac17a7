"""``warpformer demo`` end to end on CPU (reference backend): the random-model default, the
``--model-dir`` path with its conversion cache, and (slow) the full command as users run it."""

from __future__ import annotations

import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import warpformer  # noqa: F401
from warpformer.cli import main as cli_main
from warpformer.demo import build_random_gpt2, default_dataset, run_demo

ROOT = Path(__file__).resolve().parents[1]


def test_demo_default_runs_quickly(capsys, tmp_path):
    res = run_demo(max_samples=16, backend="reference", max_new_tokens=8,
                   work_dir=tmp_path / "work", layers=2)
    out = capsys.readouterr().out
    assert "RANDOM WEIGHTS" in out and "accuracy is meaningless" in out
    assert "reference backend on CPU" in out
    assert re.search(r"greedy:\s+'.+'", out) and "sampled (top_p=0.9" in out
    assert re.search(r"warpformer accuracy: \d+\.\d{4}% \(\d+/16\)", out)
    assert "generated target tokens agree with HF: 100.0000% (16/16)" in out
    assert re.search(r"speedup over HF: [\d.]+x", out)
    assert res.total == 16 and res.agree == 16
    assert (tmp_path / "work" / "converted" / "1-gpu" / "config.ini").is_file()


def test_demo_model_dir_uses_conversion_cache(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WARPFORMER_CACHE", str(tmp_path / "cache"))
    hf_dir = build_random_gpt2(default_dataset(), tmp_path / "my-model", layers=1, hidden=64,
                               heads=2, positions=128)
    rc = cli_main(["demo", "--model-dir", str(hf_dir), "--max-samples", "8",
                   "--backend", "reference", "--max-new-tokens", "4"])
    first = capsys.readouterr().out
    assert rc == 0 and "MODEL: your checkpoint" in first and "converted " in first
    assert "RANDOM WEIGHTS" not in first
    assert len(list((tmp_path / "cache").glob("my-model-fp32-*/1-gpu/config.ini"))) == 1
    rc = cli_main(["demo", "--model-dir", str(hf_dir), "--max-samples", "8",
                   "--backend", "reference", "--max-new-tokens", "4"])
    assert rc == 0 and "using the converted checkpoint cached" in capsys.readouterr().out


def test_demo_errors(tmp_path, capsys):
    rc = cli_main(["demo", "--model-dir", str(tmp_path), "--backend", "reference"])
    assert rc == 2 and "is not a HF checkpoint" in capsys.readouterr().err
    rc = cli_main(["demo", "--dataset-path", str(tmp_path / "none.jsonl")])
    assert rc == 2 and "not found" in capsys.readouterr().err


def test_demo_model_dir_without_tokenizer_is_refused_before_converting(tmp_path, monkeypatch,
                                                                       capsys):
    # A model saved without its tokenizer used to convert, then fail with transformers'
    # traceback (or an empty prompt: "input_ids row 0 is empty").
    monkeypatch.setenv("WARPFORMER_CACHE", str(tmp_path / "cache"))
    hf_dir = build_random_gpt2(default_dataset(), tmp_path / "m", layers=1, hidden=64, heads=2,
                               positions=128)
    for f in hf_dir.iterdir():
        if f.name not in ("config.json", "model.safetensors", "generation_config.json"):
            f.unlink()
    rc = cli_main(["demo", "--model-dir", str(hf_dir), "--backend", "reference"])
    err = capsys.readouterr().err
    assert rc == 2 and f"--model-dir {hf_dir} holds no tokenizer files" in err
    assert not (tmp_path / "cache").exists()  # refused before the conversion


@pytest.mark.slow
def test_demo_command_full_sample():
    """The README command's payload: ``python -m warpformer demo`` on all 200 samples."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        backend = "auto" if torch.cuda.is_available() else "reference"
    res = subprocess.run([sys.executable, "-m", "warpformer", "demo", "--backend", backend],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert re.search(r"warpformer accuracy: \d+\.\d{4}% \(\d+/200\)", res.stdout)
    agree = re.search(r"agree with HF: (\d+\.\d{4})%", res.stdout)
    assert agree and float(agree.group(1)) >= 99.0
