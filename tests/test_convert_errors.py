"""Bad converter inputs that used to slip through (issue 49): mis-shaped tensors, missing
config.json keys, unusable output paths, SIGTERM / killed runs and their temporary folders, and
special-token ids outside the vocabulary."""

from __future__ import annotations

import configparser
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from _models import build, megatron_from_gpt2, save_safetensors

from warpformer.cli import main
from warpformer.converters import ConversionError, convert, writer

pytest_plugins = ["_convert_fixtures"]


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _replace_tensor(root: Path, name: str, value: torch.Tensor) -> None:
    """Overwrite tensor ``name`` in the single-file checkpoint under ``root``."""
    if (root / "model.safetensors").is_file():
        from safetensors.torch import load_file, save_file

        sd = load_file(root / "model.safetensors")
        sd[name] = value
        save_file(sd, root / "model.safetensors", metadata={"format": "pt"})
    else:
        sd = torch.load(root / "pytorch_model.bin", weights_only=True)
        sd[name] = value
        torch.save(sd, root / "pytorch_model.bin")


def _edit_config(root: Path, **changes) -> None:
    cfg = json.loads((root / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            del cfg[key]
        else:
            cfg[key] = value
    (root / "config.json").write_text(json.dumps(cfg))


# ----------------------------------------------------------------------------- 6: shapes
@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_wrong_shape_is_named_before_writing(fmt, checkpoint, tmp_path):
    src = _copy(checkpoint("gpt2", fmt), tmp_path / "in")
    _replace_tensor(src, "transformer.h.0.attn.c_attn.weight", torch.zeros(32, 50))
    with pytest.raises(ConversionError) as err:
        convert(src, tmp_path / "out", 1)
    msg = str(err.value)
    file = "model.safetensors" if fmt == "safetensors" else "pytorch_model.bin"
    assert f"{src / file}: tensor 'transformer.h.0.attn.c_attn.weight'" in msg
    assert "has shape [32, 50]" in msg and "expects [32, 96]" in msg  # found, then HF's
    assert not (tmp_path / "out").exists()  # found before anything was written


def test_wrong_shape_without_task_prefix(hf_model, tmp_path):
    """A GPT2Model save names tensors without 'transformer.': HF's shapes are found anyway."""
    src = save_safetensors(hf_model("gpt2").transformer, tmp_path / "in")
    _replace_tensor(src, "h.1.mlp.c_fc.bias", torch.zeros(7))
    with pytest.raises(ConversionError, match=r"tensor 'h\.1\.mlp\.c_fc\.bias' has shape \[7\], "
                                              r"GPT2LMHeadModel with this config\.json expects "
                                              r"\[96\]"):
        convert(src, tmp_path / "out", 1)


def test_transposed_tensor_that_would_reshape_silently(checkpoint, tmp_path):
    """c_attn stored [3h, h] has the right element count: only the comparison with HF's shape
    stops it from becoming a garbage QKV."""
    src = _copy(checkpoint("gpt2"), tmp_path / "in")
    _replace_tensor(src, "transformer.h.1.attn.c_attn.weight", torch.zeros(96, 32))
    with pytest.raises(ConversionError, match=r"has shape \[96, 32\], .* expects \[32, 96\]"):
        convert(src, tmp_path / "out", 1)


def test_name_hf_does_not_know_fails_before_writing(checkpoint, tmp_path):
    """GPT-NeoX's head is 'embed_out' on disk, 'lm_head' in transformers 5: the dry run of the
    transforms on meta tensors still stops it before the first file."""
    src = _copy(checkpoint("gptneox-parallel"), tmp_path / "in")
    _replace_tensor(src, "embed_out.weight", torch.zeros(90, 32))
    with pytest.raises(ConversionError) as err:
        convert(src, tmp_path / "out", 1)
    msg = str(err.value)
    assert "'embed_out.weight'" in msg and "[90, 32]" in msg and "model.safetensors" in msg
    assert not (tmp_path / "out").exists()


def test_transform_error_is_wrapped_and_cleaned_up(checkpoint, tmp_path, monkeypatch):
    """Without HF's shapes (transformers missing) a reshape fails while writing: the error
    names the target, the source, its file and shape; the run leaves nothing behind."""
    from warpformer.converters import checks

    monkeypatch.setattr(checks, "hf_parameter_shapes", lambda root: ({}, "", ""))
    src = _copy(checkpoint("gpt2"), tmp_path / "in")
    _replace_tensor(src, "transformer.h.1.attn.c_attn.weight", torch.zeros(32, 50))
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("not ours")
    with pytest.raises(ConversionError) as err:
        convert(src, out / "new" / "deeper", 2)
    msg = str(err.value)
    assert msg.startswith("tensor layers.1.attention.query_key_value.weight: cannot build it: "
                          "RuntimeError")
    assert (f"'transformer.h.1.attn.c_attn.weight' (shape [32, 50], in "
            f"{src / 'model.safetensors'})") in msg
    # layer 0 was written before; the temporary folder and the folders the run made are gone
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]


def test_megatron_shard_of_wrong_shape(tmp_path):
    src = megatron_from_gpt2(build("gpt2", seed=3), tmp_path / "meg", tp=2)
    path = src / "iter_0000010" / "mp_rank_01" / "model_optim_rng.pt"
    state = torch.load(path, weights_only=False)
    layer = state["model"]["language_model"]["encoder"]
    layer["layers.1.self_attention.dense.weight"] = torch.zeros(32, 19)  # [h, h/tp] is [32, 16]
    torch.save(state, path)
    with pytest.raises(ConversionError) as err:
        convert(src, tmp_path / "out", 1)
    msg = str(err.value)
    assert msg.startswith("tensor layers.1.attention.dense.weight: built shape [35, 32], the "
                          "format expects [32, 32]; built from 'layers.1.attention.dense.weight' "
                          "(shape [32, 35], in ")
    assert "mp_rank_00/model_optim_rng.pt" in msg and "mp_rank_01/model_optim_rng.pt" in msg
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- 7: config keys
def test_missing_config_key_names_key_and_file(checkpoint, tmp_path, capsys):
    src = _copy(checkpoint("gpt2"), tmp_path / "in")
    _edit_config(src, n_head=None)
    with pytest.raises(ConversionError, match=re.escape(f"{src / 'config.json'}: required key "
                                                        "'n_head' is missing")):
        convert(src, tmp_path / "out", 1)
    rc = main(["convert", "-i", str(src), "-o", str(tmp_path / "out"), "--no-progress"])
    assert rc == 2
    assert "error: " in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_missing_bloom_key_uses_the_saved_name(checkpoint, tmp_path):
    src = _copy(checkpoint("bloom"), tmp_path / "in")
    _edit_config(src, n_head=None)
    with pytest.raises(ConversionError, match="required key 'n_head' is missing"):
        convert(src, tmp_path / "out", 1)


def test_missing_megatron_arg(tmp_path):
    src = megatron_from_gpt2(build("gpt2", seed=3), tmp_path / "meg", tp=1)
    path = src / "iter_0000010" / "mp_rank_00" / "model_optim_rng.pt"
    state = torch.load(path, weights_only=False)
    del state["args"].num_layers
    torch.save(state, path)
    with pytest.raises(ConversionError, match=r"mp_rank_00/model_optim_rng\.pt \(its 'args'\): "
                                              r"required key 'num_layers' is missing"):
        convert(src, tmp_path / "out", 1)


# ----------------------------------------------------------------------------- 8: output path
def test_output_dir_is_a_file(checkpoint, tmp_path):
    target = tmp_path / "out"
    target.write_text("a file")
    with pytest.raises(ConversionError, match=re.escape(f"--output-dir {target} exists and is "
                                                        "not a directory")):
        convert(checkpoint("gpt2"), target, 1)
    with pytest.raises(ConversionError, match=re.escape(f"cannot create output directory "
                                                        f"{target / 'x'}: ")):
        convert(checkpoint("gpt2"), target / "x", 1)
    assert target.read_text() == "a file"


# ------------------------------------------------------------------------- 9: signals, leftovers
_SLOW_CHILD = textwrap.dedent('''
    """The real CLI, each transform made 0.5 s slower so that SIGTERM lands mid-conversion."""
    import dataclasses
    import sys
    import time

    import warpformer.converters as conv
    from warpformer.cli import main


    class Slow:  # picklable: the pool's spawn-started workers import this file as __mp_main__
        def __init__(self, fn):
            self.fn = fn

        def __call__(self, cfg, *tensors):
            time.sleep(0.5)
            return self.fn(cfg, *tensors)


    def slow_plan(*args, _build=conv.build_plan, **kwargs):
        plan = _build(*args, **kwargs)
        plan.tasks = [dataclasses.replace(t, transform=Slow(t.transform)) for t in plan.tasks]
        return plan


    if __name__ == "__main__":
        conv.build_plan = slow_plan
        sys.exit(main(["convert", *sys.argv[1:]]))
''')


@pytest.mark.parametrize("processes", [1, 2])
def test_sigterm_removes_the_temporary_folder(processes, checkpoint, tmp_path):
    child = tmp_path / "slow_convert.py"
    child.write_text(_SLOW_CHILD)
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, str(child), "-i", str(checkpoint("gpt2")), "-o", str(out), "-p",
         str(processes), "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        deadline = time.monotonic() + 120
        while not list(out.glob(".1-gpu.tmp-*/model.*.bin")):  # mid-way: a tensor is written
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the conversion never started writing"
            time.sleep(0.02)
        temps = list(out.glob(".1-gpu.tmp-*"))
        assert len(temps) == 1 and f"-{proc.pid}-" in temps[0].name  # host-pid-random
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 2, err
    assert f"error: conversion into {out / '1-gpu'} stopped by SIGTERM" in err
    assert not out.exists()  # the temporary folder, and the output folder the run created


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_temporary_folders(checkpoint, tmp_path):
    host, dead = writer._host(), _dead_pid()
    out = tmp_path / "out"
    stale = out / f".1-gpu.tmp-{host}-{dead}-abc_12"
    (stale / "sub").mkdir(parents=True)
    (stale / "sub" / "model.wte.bin").write_bytes(b"\0" * 3 * 2**20)
    trash = out / f".2-gpu.old-{host}-{dead}-zz9"  # --force's trash, swap had completed
    (trash / "old").mkdir(parents=True)
    (out / "2-gpu").mkdir()
    kept = [
        out / f".1-gpu.tmp-{host}-{os.getpid()}-live",  # a live pid: maybe a running conversion
        out / f".1-gpu.tmp-other-host.example-{dead}-far",  # another host's: its pids are not ours
        out / ".1-gpu.tmp-k3j4h5g6",  # the old naming: nothing proves it dead
        out / f".1-gpu.tmp-{host}-0-zero",  # pid 0 would signal our own process group
    ]
    for folder in kept:
        folder.mkdir()
    with pytest.warns(UserWarning) as record:
        convert(checkpoint("gpt2"), out, 1)
    messages = [str(w.message) for w in record]
    assert any(f"removed {stale} (3.0 MiB)" in m and f"pid {dead}" in m for m in messages)
    assert any(f"removed {trash} (0.0 MiB)" in m for m in messages)
    assert not stale.exists() and not trash.exists()
    assert all(folder.is_dir() for folder in kept)
    assert (out / "1-gpu" / "config.ini").is_file()


def test_trash_holding_the_previous_output_is_kept(checkpoint, tmp_path):
    """Killed between --force's two renames: the trash holds the only copy of '<N>-gpu'."""
    out = tmp_path / "out"
    trash = out / f".1-gpu.old-{writer._host()}-{_dead_pid()}-abc"
    (trash / "old").mkdir(parents=True)
    with pytest.warns(UserWarning, match=re.escape(f"{trash} holds the previous 1-gpu output")):
        convert(checkpoint("gpt2"), out, 1)
    assert (trash / "old").is_dir()


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_output_folder_mode_follows_umask(mask, checkpoint, tmp_path):
    old = os.umask(mask)
    try:
        final = convert(checkpoint("gpt2"), tmp_path / "out", 1).output_dir
        assert final.stat().st_mode & 0o777 == 0o777 & ~mask
        assert (final / "config.ini").stat().st_mode & 0o777 == 0o666 & ~mask
        assert writer._umask() == mask and os.umask(mask) == mask  # read, left unchanged
    finally:
        os.umask(old)


# ----------------------------------------------------------------------------- 10: token ids
def _ini(final: Path) -> configparser.SectionProxy:
    cfg = configparser.ConfigParser()
    cfg.read(final / "config.ini")
    return cfg["gpt"]


def test_token_ids_outside_vocabulary_warn_and_fall_back(checkpoint, tmp_path):
    src = _copy(checkpoint("gpt2"), tmp_path / "in")
    _edit_config(src, bos_token_id=50256, eos_token_id=[500, 50256])
    with pytest.warns(UserWarning) as record:
        final = convert(src, tmp_path / "out", 1).output_dir
    messages = " | ".join(str(w.message) for w in record)
    assert "bos_token_id = 50256 is outside the vocabulary [0, 96)" in messages
    assert "eos_token_id = [500, 50256] is outside the vocabulary [0, 96)" in messages
    assert "pass end_id= to generate" in messages
    assert _ini(final)["start_id"] == "95" and _ini(final)["end_id"] == "95"


def test_first_in_vocabulary_eos_of_a_list_is_used(checkpoint, tmp_path, recwarn):
    src = _copy(checkpoint("gpt2"), tmp_path / "in")
    _edit_config(src, eos_token_id=[500, 7, 9])
    final = convert(src, tmp_path / "out", 1).output_dir
    assert _ini(final)["end_id"] == "7"
    assert not [w for w in recwarn if "token_id" in str(w.message)]


def test_cli_shows_the_token_id_warning(checkpoint, tmp_path):
    src = _copy(checkpoint("gpt2"), tmp_path / "in")
    _edit_config(src, eos_token_id=1000)
    proc = subprocess.run(
        [sys.executable, "-m", "warpformer.converters", "-i", str(src), "-o", str(tmp_path / "o"),
         "--no-progress"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "UserWarning" in proc.stderr and "eos_token_id = 1000 is outside" in proc.stderr
    assert "must be `None` or an integer within the vocabulary" not in proc.stderr  # HF's, muted
