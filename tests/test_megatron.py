"""Synthetic Megatron-LM GPT checkpoints (built from a tiny GPT-2, trained tp 2) convert to tp 1
and tp 4 with identical reference logits, equal to the GPT-2 they were built from."""

from __future__ import annotations

import configparser

import pytest
import torch
from _models import build, hf_logits, megatron_from_gpt2, rel_err

from warpformer.converters import ConversionError, convert, detect
from warpformer.reference import GptReference


@pytest.fixture(scope="module")
def gpt2():
    return build("gpt2", seed=3)


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 96, (2, 13), generator=torch.Generator().manual_seed(5))


def _tp1_tp4(src, tmp_path, ids):
    a = GptReference.from_dir(convert(src, tmp_path / "out", 1).output_dir)(ids)
    b = GptReference.from_dir(convert(src, tmp_path / "out", 4).output_dir)(ids)
    return a, b


@pytest.mark.parametrize("version", [0, 1.0, 2.0, 3.0])
def test_versions_tp2_to_tp1_and_tp4(version, gpt2, ids, tmp_path):
    src = megatron_from_gpt2(gpt2, tmp_path / "meg", tp=2, version=version)
    assert detect(src)[0] == "Megatron-LM GPT"
    a, b = _tp1_tp4(src, tmp_path, ids)
    assert torch.equal(a, b)
    assert rel_err(a, hf_logits(gpt2, ids)) < 1e-5  # the direct computation


def test_pipeline_stages_and_untied_head(ids, tmp_path):
    model = build("gpt2", seed=4)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(torch.randn(model.lm_head.weight.shape) * 0.5)
    src = megatron_from_gpt2(model, tmp_path / "meg", tp=2, pp=2, version=2.0, untie=True)
    assert (src / "iter_0000010" / "mp_rank_01_001" / "model_optim_rng.pt").is_file()
    a, b = _tp1_tp4(src, tmp_path, ids)
    assert torch.equal(a, b)
    assert (tmp_path / "out" / "4-gpu" / "model.lm_head.weight.bin").is_file()
    assert rel_err(a, hf_logits(model, ids)) < 1e-5


def test_exact_gelu_when_fusion_and_openai_gelu_are_off(ids, tmp_path):
    model = build("gpt2", seed=6)
    model.config.activation_function = "gelu"  # HF: exact erf form
    for block in model.transformer.h:
        block.mlp.act = torch.nn.GELU()
    src = megatron_from_gpt2(model, tmp_path / "meg", tp=2, openai_gelu=False)
    out = convert(src, tmp_path / "out", 2).output_dir
    ini = configparser.ConfigParser()
    ini.read(out / "config.ini")
    assert ini["gpt"]["activation_type"] == "gelu_erf"
    assert ini["gpt"]["model_variant"] == "megatron"
    assert rel_err(GptReference.from_dir(out)(ids), hf_logits(model, ids)) < 1e-5


def test_default_fused_bias_gelu_is_tanh(gpt2, tmp_path):
    src = megatron_from_gpt2(gpt2, tmp_path / "meg", tp=2, openai_gelu=False)
    for path in src.glob("iter_*/mp_rank_*/model_optim_rng.pt"):
        sd = torch.load(path, weights_only=False)
        del sd["args"].bias_gelu_fusion  # absent = Megatron's default (on)
        torch.save(sd, path)
    out = convert(src, tmp_path / "out", 1).output_dir
    ini = configparser.ConfigParser()
    ini.read(out / "config.ini")
    assert ini["gpt"]["activation_type"] == "gelu_tanh"


def test_missing_rank_file(gpt2, tmp_path):
    src = megatron_from_gpt2(gpt2, tmp_path / "meg", tp=2)
    (src / "iter_0000010" / "mp_rank_01" / "model_optim_rng.pt").unlink()
    with pytest.raises(ConversionError, match=r"missing checkpoint file .*mp_rank_01"):
        convert(src, tmp_path / "out", 1)
    assert not (tmp_path / "out" / "1-gpu").exists()


def test_truncated_rank_file(gpt2, tmp_path):
    src = megatron_from_gpt2(gpt2, tmp_path / "meg", tp=2)
    path = src / "iter_0000010" / "mp_rank_01" / "model_optim_rng.pt"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(ConversionError, match=r"mp_rank_01/model_optim_rng\.pt: cannot read "
                                              r"Megatron checkpoint \(truncated or corrupt"):
        convert(src, tmp_path / "out", 1)
    assert not (tmp_path / "out" / "1-gpu").exists()


def test_unsupported_options(gpt2, tmp_path):
    src = megatron_from_gpt2(gpt2, tmp_path / "meg", tp=1)
    path = src / "iter_0000010" / "mp_rank_00" / "model_optim_rng.pt"
    sd = torch.load(path, weights_only=False)
    sd["args"].swiglu = True
    sd["args"].position_embedding_type = "rope"
    torch.save(sd, path)
    with pytest.raises(ConversionError, match=r"unsupported options: swiglu, "
                                              r"position_embedding_type"):
        convert(src, tmp_path / "out", 1)


def test_unsafe_pickle_needs_opt_in(gpt2, tmp_path):
    src = megatron_from_gpt2(gpt2, tmp_path / "meg", tp=1)
    path = src / "iter_0000010" / "mp_rank_00" / "model_optim_rng.pt"
    sd = torch.load(path, weights_only=False)
    sd["opt_param_scheduler"] = _Custom()
    torch.save(sd, path)
    with pytest.raises(ConversionError, match="--allow-unsafe-pickle"):
        convert(src, tmp_path / "out", 1)
    convert(src, tmp_path / "out", 1, allow_unsafe_pickle=True)


class _Custom:
    """A class outside torch's weights_only allow-list."""
