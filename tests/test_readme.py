"""The README's CPU instructions run as written: the "Without a GPU" snippet on a converted tiny
GPT-2, and the set-up knobs it names exist in the scripts that read them."""

from __future__ import annotations

import contextlib
import io
import re
import warnings
from pathlib import Path

import pytest
import torch
import transformers

from warpformer.converters import convert

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _section(title: str) -> str:
    start = README.index(title)
    end = README.find("\n#", start + len(title))
    return README[start: end if end > 0 else None]


def test_cpu_snippet_runs_on_the_reference_backend(tmp_path, monkeypatch):
    code = re.search(r"```python\n(.*?)```", _section("### Without a GPU"), re.S).group(1)
    # A GPT-2 with random weights, wide enough a vocabulary for the snippet's ids, converted to
    # the path the snippet loads.
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=8000, n_embd=32, n_head=2, n_layer=1,
                                  n_positions=64)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "hf")
    with pytest.warns(UserWarning, match="outside the vocabulary"):  # GPT-2's 50256 is
        convert(tmp_path / "hf", tmp_path / "gpt2-wf", 1, "fp16")  # past 8000: end_id 7999
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(out):
        warnings.simplefilter("ignore")
        exec(compile(code, "README.md", "exec"), {})
    tokens, dtype = out.getvalue().rsplit(" ", 1)
    assert len(eval(tokens)) == 8
    assert dtype.strip() == "torch.float32"  # fp16 asked, fp32 computed on the CPU


@pytest.mark.parametrize("knob, where", [
    ("WARPFORMER_NO_APT", "tools/setup_env.sh"),
    ("WARPFORMER_TORCH", "tools/setup_env.sh"),
    ("WARPFORMER_VENV", "tools/setup_env.sh"),
    ("WARPFORMER_CACHE", "python/warpformer/_cache.py"),
])
def test_documented_knobs_are_read(knob, where):
    assert knob in README
    assert knob in (ROOT / where).read_text(), f"README documents {knob}, {where} ignores it"


def test_cpu_section_names_the_gpu_only_features():
    text = _section("### Without a GPU")
    for feature in ("backend=\"reference\"", "fp16 is computed in fp32", "GPU-only",
                    "tensor and pipeline parallelism"):
        assert feature in text, feature
