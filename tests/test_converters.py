"""HF checkpoints -> converted dirs -> warpformer.reference logits == HF logits; format details;
every converter error message; atomic output."""

from __future__ import annotations

import configparser
import copy
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from _models import MODELS, hf_logits, rel_err, save_safetensors

from warpformer.cli import main
from warpformer.config import ConfigError
from warpformer.converters import ConversionError, convert, supported_architectures
from warpformer.reference import GptReference

pytest_plugins = ["_convert_fixtures"]
ALL = list(MODELS)


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
@pytest.mark.parametrize("name", ALL)
def test_fp32_matches_hf(name, fmt, tp, checkpoint, hf_reference, token_ids, tmp_path):
    out = convert(checkpoint(name, fmt), tmp_path, tp).output_dir
    assert out == tmp_path / f"{tp}-gpu"
    logits = GptReference.from_dir(out)(token_ids)
    assert rel_err(logits, hf_reference(name)) < 1e-5


@pytest.mark.parametrize("fmt", ["safetensors-sharded", "bin-sharded"])
@pytest.mark.parametrize("name", ["gpt2", "gptj", "opt-350m"])
def test_sharded_checkpoints(name, fmt, checkpoint, hf_reference, token_ids, tmp_path):
    src = checkpoint(name, fmt)
    assert list(src.glob("*.index.json")) and len(list(src.glob("*-of-*"))) > 1
    out = convert(src, tmp_path, 2).output_dir
    assert rel_err(GptReference.from_dir(out)(token_ids), hf_reference(name)) < 1e-5


@pytest.mark.parametrize("name", ALL)
def test_fp16_on_disk(name, converted, hf_model, hf_reference, token_ids):
    out = converted(name, 2, "fp16")
    assert {p.stat().st_size % 2 for p in out.glob("*.bin")} == {0}
    logits = GptReference.from_dir(out)(token_ids)
    # Exactly HF with its weights rounded to fp16 ...
    rounded = copy.deepcopy(hf_model(name))
    with torch.no_grad():
        for p in rounded.parameters():
            p.copy_(p.half().float())
    assert rel_err(logits, hf_logits(rounded, token_ids)) < 1e-5
    # ... which is within fp16 noise of the fp32 model, also when computing in fp16.
    eps = torch.finfo(torch.float16).eps
    assert rel_err(logits, hf_reference(name)) < 5 * eps
    half = GptReference.from_dir(out, dtype=torch.float16)(token_ids)
    assert rel_err(half, hf_reference(name)) < 10 * eps


@pytest.mark.parametrize("name", ["gpt2", "bloom", "gptneox-parallel"])
def test_bf16_on_disk(name, converted, hf_reference, token_ids):
    out = converted(name, 1, "bf16")
    cfg = configparser.ConfigParser()
    cfg.read(out / "config.ini")
    assert cfg["gpt"]["weight_data_type"] == "bf16"
    logits = GptReference.from_dir(out)(token_ids)
    assert rel_err(logits, hf_reference(name)) < 5 * torch.finfo(torch.bfloat16).eps


def test_processes_give_identical_files(checkpoint, tmp_path):
    one = convert(checkpoint("gptneox-parallel"), tmp_path / "a", 2).output_dir
    two = convert(checkpoint("gptneox-parallel"), tmp_path / "b", 2, processes=2)
    files = sorted(p.name for p in one.iterdir())
    assert files == sorted(p.name for p in two.output_dir.iterdir())
    for f in files:
        assert (one / f).read_bytes() == (two.output_dir / f).read_bytes(), f
    tensors = {re.sub(r"(\.\d+)?\.bin$", "", f) for f in files if f.endswith(".bin")}
    assert two.tensors == len(tensors) and two.files == len(files) - 1  # minus config.ini


# ----------------------------------------------------------------------------- format details
def test_gpt2_layout(converted, hf_model):
    out = converted("gpt2", 2)
    model = hf_model("gpt2")
    h = model.config.n_embd
    names = {p.name for p in out.iterdir()}
    assert "model.lm_head.weight.bin" not in names  # tied
    assert {"model.wte.bin", "model.wpe.bin", "model.final_layernorm.weight.bin"} <= names
    assert "model.layers.0.attention.dense.bias.bin" in names  # replicated, no rank suffix
    qkv = np.fromfile(out / "model.layers.1.attention.query_key_value.weight.1.bin", "<f4")
    qkv = torch.from_numpy(qkv).reshape(h, 3, h // 2)
    c_attn = model.transformer.h[1].attn.c_attn.weight.detach()  # [in, out] = [h, 3h]
    assert torch.equal(qkv, c_attn.reshape(h, 3, h)[:, :, h // 2:])  # heads 2..3 of Q, K, V
    dense = np.fromfile(out / "model.layers.0.attention.dense.weight.0.bin", "<f4")
    assert torch.equal(torch.from_numpy(dense).reshape(h // 2, h),
                       model.transformer.h[0].attn.c_proj.weight.detach()[: h // 2])


def test_opt_layout_and_config(converted, hf_model):
    out = converted("opt-350m", 1)
    model = hf_model("opt-350m")
    cfg = configparser.ConfigParser()
    cfg.read(out / "config.ini")
    gpt = cfg["gpt"]
    assert gpt["activation_type"] == "relu" and gpt["layernorm_type"] == "post_layernorm"
    assert gpt["word_embed_proj_dim"] == "16" and gpt["has_post_decoder_layernorm"] == "0"
    assert gpt["model_variant"] == "opt" and "position_offset" not in gpt
    pos = model.model.decoder.embed_positions.weight.detach()
    wpe = torch.from_numpy(np.fromfile(out / "model.wpe.bin", "<f4")).reshape(-1, 32)
    assert wpe.shape[0] == model.config.max_position_embeddings
    assert torch.equal(wpe, pos[2:])  # FT's convention: OPT's 2-row offset dropped
    proj_in = np.fromfile(out / "model.project_in.weight.bin", "<f4").reshape(16, 32)
    assert torch.equal(torch.from_numpy(proj_in),
                       model.model.decoder.project_in.weight.detach().t())


def test_gptj_config_and_head(converted):
    out = converted("gptj", 4)
    cfg = configparser.ConfigParser()
    cfg.read(out / "config.ini")
    gpt = cfg["gpt"]
    assert gpt["rotary_embedding_dim"] == "4" and gpt["rotary_style"] == "interleaved"
    assert gpt["parallel_residual"] == "1" and gpt["parallel_shared_layernorm"] == "1"
    assert gpt["has_attention_bias"] == "0" and gpt["has_lm_head_bias"] == "1"
    assert gpt["activation_type"] == "gelu_tanh" and gpt["tensor_para_size"] == "4"
    names = {p.name for p in out.iterdir()}
    assert {"model.lm_head.weight.bin", "model.lm_head.bias.bin"} <= names
    assert not any("post_attention_layernorm" in n or "query_key_value.bias" in n for n in names)


def test_gptneox_config(converted):
    gpt = configparser.ConfigParser()
    gpt.read(converted("gptneox-sequential", 1) / "config.ini")
    assert gpt["gpt"]["rotary_style"] == "half" and gpt["gpt"]["rotary_embedding_dim"] == "4"
    assert gpt["gpt"]["parallel_residual"] == "0" and float(gpt["gpt"]["rotary_base"]) == 1000
    assert gpt["gpt"]["activation_type"] == "gelu_tanh"  # hidden_act gelu_new


# ----------------------------------------------------------------------------- CLI
def test_cli_convert(checkpoint, tmp_path, capsys):
    rc = main(["convert", "--input-dir", str(checkpoint("bloom")), "--output-dir",
               str(tmp_path), "--tensor-para-size", "2", "--data-type", "fp16", "--no-progress"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "wrote" in printed and "tensors" in printed and "MiB" in printed and " s" in printed
    assert (tmp_path / "2-gpu" / "config.ini").is_file()


def test_module_entry_point(checkpoint, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "warpformer.converters", "--input-dir", str(checkpoint("gpt2")),
         "--output-dir", str(tmp_path), "-tp", "1"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "wrote" in proc.stdout and (tmp_path / "1-gpu" / "model.wte.bin").is_file()


def test_cli_reports_errors(tmp_path, capsys):
    rc = main(["convert", "--input-dir", str(tmp_path / "nope"), "--output-dir", str(tmp_path)])
    assert rc == 2
    assert "error:" in capsys.readouterr().err


# ----------------------------------------------------------------------------- errors
def _no_leftovers(out: Path) -> None:
    assert not out.exists() or not [p for p in out.iterdir() if "gpu" in p.name]


def test_unsupported_architecture(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "config.json").write_text(json.dumps(
        {"architectures": ["FalconForCausalLM"], "model_type": "falcon"}))
    with pytest.raises(ConversionError) as err:
        convert(tmp_path / "in", tmp_path / "out", 1)
    msg = str(err.value)
    assert "'FalconForCausalLM'" in msg and "supported:" in msg
    for arch in supported_architectures():
        assert arch in msg
    assert {"GPT2LMHeadModel", "OPTForCausalLM", "BloomForCausalLM", "GPTJForCausalLM",
            "GPTNeoXForCausalLM", "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
            "Megatron-LM GPT"} <= set(supported_architectures())


def test_head_num_not_divisible(checkpoint, tmp_path):
    with pytest.raises(ConfigError, match=r"head_num \(4\) must be divisible by "
                                          r"tensor_para_size \(3\)"):
        convert(checkpoint("gpt2"), tmp_path / "out", 3)
    _no_leftovers(tmp_path / "out")


def test_output_exists_needs_force(checkpoint, tmp_path):
    first = convert(checkpoint("gpt2"), tmp_path, 1).output_dir
    marker = first / "stale.txt"
    marker.write_text("old")
    with pytest.raises(ConversionError, match=r"1-gpu exists; pass --force"):
        convert(checkpoint("gpt2"), tmp_path, 1)
    assert marker.exists()
    convert(checkpoint("gpt2"), tmp_path, 1, force=True)
    assert not marker.exists() and (first / "config.ini").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1-gpu"]


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_missing_shard_file(checkpoint, tmp_path):
    src = _copy(checkpoint("gpt2", "safetensors-sharded"), tmp_path / "in")
    victim = sorted(src.glob("model-*.safetensors"))[1]
    victim.unlink()
    with pytest.raises(ConversionError, match=f"missing checkpoint shard .*{victim.name}"):
        convert(src, tmp_path / "out", 1)
    _no_leftovers(tmp_path / "out")


def test_missing_tensor(hf_model, tmp_path):
    from safetensors.torch import load_file, save_file

    src = save_safetensors(hf_model("gptj"), tmp_path / "in")
    sd = load_file(src / "model.safetensors")
    del sd["transformer.h.1.mlp.fc_out.bias"]
    save_file(sd, src / "model.safetensors")
    with pytest.raises(ConversionError, match=r"lacks tensor 'transformer\.h\.1\.mlp\.fc_out"):
        convert(src, tmp_path / "out", 2)
    _no_leftovers(tmp_path / "out")


def test_truncated_safetensors(checkpoint, tmp_path):
    src = _copy(checkpoint("bloom"), tmp_path / "in")
    path = src / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ConversionError, match=r"model\.safetensors: truncated"):
        convert(src, tmp_path / "out", 1)


def test_truncated_bin(checkpoint, tmp_path):
    src = _copy(checkpoint("gpt2", "bin"), tmp_path / "in")
    path = src / "pytorch_model.bin"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ConversionError, match=r"pytorch_model\.bin: cannot read PyTorch "
                                              r"checkpoint \(truncated or corrupt"):
        convert(src, tmp_path / "out", 1)


@pytest.mark.parametrize("garbage", [b"\x10\x00\x00\x00\x00\x00\x00\x00{not json!!!}xxx",
                                     b"\xff" * 8 + b"{}", b"abc"])
def test_safetensors_header_does_not_parse(checkpoint, tmp_path, garbage):
    src = _copy(checkpoint("gpt2"), tmp_path / "in")
    (src / "model.safetensors").write_bytes(garbage)
    with pytest.raises(ConversionError, match=r"model\.safetensors: safetensors header does "
                                              r"not parse"):
        convert(src, tmp_path / "out", 1)
    _no_leftovers(tmp_path / "out")


def test_wrong_shape_is_refused_before_writing(hf_model, tmp_path):
    """A tensor of the wrong shape is found against HF's own shapes before anything is written
    (the mid-write cleanup is tested in test_convert_errors.py): no '<tp>-gpu' appears."""
    from safetensors.torch import load_file, save_file

    src = save_safetensors(hf_model("gptj"), tmp_path / "in")
    sd = load_file(src / "model.safetensors")
    sd["transformer.h.1.mlp.fc_out.weight"] = torch.zeros(5, 7)
    save_file(sd, src / "model.safetensors", metadata={"format": "pt"})
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ConversionError, match=r"tensor 'transformer\.h\.1\.mlp\.fc_out\.weight' "
                                              r"has shape \[5, 7\], GPTJForCausalLM with this "
                                              r"config\.json expects \[32, 128\]"):
        convert(src, out, 2, processes=1)
    assert list(out.iterdir()) == []


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(ConversionError, match="neither a HF checkpoint"):
        convert(tmp_path, tmp_path / "out", 1)



def test_base_model_checkpoint_without_prefix(hf_model, hf_reference, token_ids, tmp_path):
    """A GPT2Model save (keys without 'transformer.', head tied by definition) converts too."""
    src = save_safetensors(hf_model("gpt2").transformer, tmp_path / "in")
    assert json.loads((src / "config.json").read_text())["architectures"] == ["GPT2Model"]
    out = convert(src, tmp_path / "out", 2).output_dir
    assert rel_err(GptReference.from_dir(out)(token_ids), hf_reference("gpt2")) < 1e-5
