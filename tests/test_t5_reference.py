"""T5 family (issue 51, CPU part): the converter into FT's T5 layout, its config and the
plain-PyTorch seq2seq reference, checked against HF on tiny random models of each variant."""

from __future__ import annotations

import configparser
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from _models import randomize
from _seq2seq import (
    check_encoder_decoder,
    check_greedy,
    converter,
    edit_ini,
    edit_json,
    edit_tensors,
    save_models,
)

from warpformer.cli import main
from warpformer.config import ConfigError
from warpformer.converters import ConversionError, convert
from warpformer.reference_seq2seq import Seq2SeqReference
from warpformer.t5_config import T5Config
from warpformer.t5_weights import load_t5_weights, t5_weight_specs

LENGTHS = torch.tensor([9, 4, 7])
NEW_TOKENS = 8

# name -> (model class, config kwargs, untied head)
VARIANTS = {
    "t5-relu-tied": ("T5", dict(feed_forward_proj="relu"), False),
    "t5v11-gated-gelu": ("T5", dict(feed_forward_proj="gated-gelu"), True),
    "mt5": ("MT5", dict(feed_forward_proj="gated-gelu"), True),
    "ul2-gated-silu": ("T5", dict(feed_forward_proj="gated-silu", num_decoder_layers=3), True),
    "odd-vocab": ("T5", dict(feed_forward_proj="gelu", vocab_size=101), False),
}


def _build(name: str) -> transformers.PreTrainedModel:
    kind, kw, untied = VARIANTS[name]
    cfg = dict(vocab_size=96, d_model=32, d_kv=6, d_ff=40, num_layers=2, num_heads=4,
               relative_attention_num_buckets=8, relative_attention_max_distance=12,
               decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    cfg.update(kw)
    if untied:
        cfg["tie_word_embeddings"] = False  # v1.1: no rescale before the head
    config_cls = getattr(transformers, f"{kind}Config")
    model_cls = getattr(transformers, f"{kind}ForConditionalGeneration")
    torch.manual_seed(0)
    model = model_cls(config_cls(**cfg))
    if untied:  # transformers 5 ties every T5 head; give it its own, as v1.1 checkpoints have
        model.lm_head.weight = torch.nn.Parameter(torch.empty(cfg["vocab_size"], 32))
    model.config._attn_implementation = "eager"
    return randomize(model, seed=1)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """name -> (HF model, checkpoint dir); checkpoints saved as a v1.1 hub folder looks."""
    return save_models(_build, list(VARIANTS), tmp_path_factory.mktemp("t5-checkpoints"),
                       lambda name: {"tie_word_embeddings": False} if VARIANTS[name][2] else {})


@pytest.fixture(scope="module")
def converted(models, tmp_path_factory):
    return converter(models, tmp_path_factory.mktemp("t5-converted"), convert)


def _inputs(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(2, vocab, (3, 9), generator=torch.Generator().manual_seed(3))
    mask = (torch.arange(9)[None, :] < LENGTHS[:, None]).long()
    return ids, mask


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_encoder_and_decoder_match_hf(name, tp, models, converted):
    model = models[name][0]
    check_encoder_decoder(model, Seq2SeqReference.from_dir(converted(name, tp)),
                          *_inputs(model.config.vocab_size))


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_greedy_tokens_match_hf(name, tp, models, converted):
    model = models[name][0]
    # use_cache=False: HF's cache mis-sizes num_decoder_layers != num_layers
    check_greedy(model, Seq2SeqReference.from_dir(converted(name, tp)),
                 *_inputs(model.config.vocab_size), NEW_TOKENS, use_cache=False)


def test_layout_names_split_and_config(models, converted):
    path = converted("t5v11-gated-gelu", 2)
    files = {p.name for p in path.iterdir()}
    for name in ("shared.weight_T.bin", "lm_head.weight.bin", "encoder.final_layer_norm.weight.bin",
                 "encoder.block.0.layer.0.SelfAttention.q.weight.1.bin",
                 "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight.0.bin",
                 "decoder.block.1.layer.0.SelfAttention.qkv.weight.1.bin",
                 "decoder.block.1.layer.1.EncDecAttention.v.weight.0.bin",
                 "decoder.block.1.layer.2.DenseReluDense.wi2.weight.1.bin",
                 "decoder.block.1.layer.2.DenseReluDense.wo.weight.0.bin"):
        assert name in files
    assert not any(f.startswith("model.") or f.startswith(".") for f in files)
    ini = configparser.ConfigParser()
    ini.read(path / "config.ini")
    assert set(ini.sections()) == {"encoder", "decoder", "structure"}
    assert ini["encoder"]["relative_attention_num_buckets_or_max_pos_seq_len"] == "8"
    assert ini["structure"]["use_gated_activation"] == "true"
    assert ini["decoder"]["tie_word_embeddings"] == "False"
    config = T5Config.from_ini(path / "config.ini")
    assert (config.tensor_para_size, config.decoder.gated, config.decoder.activation) == \
        (2, True, "gelu_tanh")
    shard = load_t5_weights(path, 1)
    assert shard["decoder.block.0.layer.0.SelfAttention.qkv.weight"].shape == (32, 3, 12)
    assert shard["encoder.block.0.layer.0.SelfAttention.o.weight"].shape == (12, 32)
    assert shard["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"].shape \
        == (2, 8)
    hf_q = models["t5v11-gated-gelu"][0].state_dict()[
        "encoder.block.0.layer.0.SelfAttention.q.weight"]
    torch.testing.assert_close(shard["encoder.block.0.layer.0.SelfAttention.q.weight"],
                               hf_q.t()[:, 12:], rtol=0, atol=0)


@pytest.mark.parametrize("data_type,dtype", [("fp16", np.float16), ("bf16", np.int16)])
def test_half_conversion_writes_half_files(data_type, dtype, models, converted):
    path = converted("t5-relu-tied", 1, data_type)
    config = T5Config.from_ini(path / "config.ini")
    assert config.weight_data_type == data_type
    raw = np.fromfile(path / "encoder.block.0.layer.1.DenseReluDense.wi.weight.0.bin", dtype=dtype)
    hf = models["t5-relu-tied"][0].state_dict()["encoder.block.0.layer.1.DenseReluDense.wi.weight"]
    want = hf.t().contiguous().to(torch.float16 if data_type == "fp16" else torch.bfloat16)
    got = torch.from_numpy(raw)
    got = got if data_type == "fp16" else got.view(torch.bfloat16)
    assert torch.equal(got.reshape(want.shape), want)
    ref = Seq2SeqReference.from_dir(path)  # runs in fp32 on the rounded weights
    ids, _ = _inputs(96)
    assert torch.isfinite(ref.encode(ids, LENGTHS)).all()


def test_cli_detects_t5(models, tmp_path, capsys):
    rc = main(["convert", "--input-dir", str(models["mt5"][1]), "--output-dir",
               str(tmp_path / "out"), "--tensor-para-size", "4", "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    assert T5Config.from_ini(tmp_path / "out" / "4-gpu" / "config.ini").model_type == "mt5"


def test_ft_converted_directory_loads(models, converted, tmp_path):
    """FT's converter writes str(value) keys, '0' position type, an unread shared.weight.bin
    and (older versions) no lm_head.weight.bin for a tied head."""
    src = converted("t5-relu-tied", 1)
    ft = shutil.copytree(src, tmp_path / "1-gpu")
    (ft / "lm_head.weight.bin").unlink()
    (ft / "shared.weight.bin").write_bytes(b"\0" * 16)
    ini = configparser.ConfigParser()
    ini.read(ft / "config.ini")
    del ini["encoder"]["tensor_para_size"]
    ini["decoder"]["bos_token_id"] = "None"
    ini["decoder"]["is_encoder_decoder"] = "True"
    ini["structure"] = {"t5_with_bias": "0", "position_embedding_type": "0"}
    with open(ft / "config.ini", "w") as f:
        ini.write(f)
    ids, _ = _inputs(96)
    torch.testing.assert_close(Seq2SeqReference.from_dir(ft).encode(ids, LENGTHS),
                               Seq2SeqReference.from_dir(src).encode(ids, LENGTHS), rtol=0, atol=0)
    dec = torch.zeros(3, 2, dtype=torch.long)
    a, b = Seq2SeqReference.from_dir(ft), Seq2SeqReference.from_dir(src)
    enc = a.encode(ids, LENGTHS)
    torch.testing.assert_close(a.decoder_logits(enc, LENGTHS, dec),
                               b.decoder_logits(enc, LENGTHS, dec), rtol=0, atol=0)


# ----------------------------------------------------------------------------- errors
def _copy_checkpoint(models, name: str, tmp_path: Path) -> Path:
    return shutil.copytree(models[name][1], tmp_path / "ckpt")


def test_missing_tensor_is_named(models, tmp_path):
    path = _copy_checkpoint(models, "t5v11-gated-gelu", tmp_path)
    edit_tensors(path, lambda sd: sd.pop("decoder.block.1.layer.1.EncDecAttention.k.weight"))
    with pytest.raises(ConversionError, match=r"lacks tensor 'decoder\.block\.1\.layer\.1\."
                                              r"EncDecAttention\.k\.weight'"):
        convert(path, tmp_path / "out", 1)
    assert not (tmp_path / "out").exists()


def test_untied_head_must_be_present(models, tmp_path):
    path = _copy_checkpoint(models, "t5v11-gated-gelu", tmp_path)
    edit_tensors(path, lambda sd: sd.pop("lm_head.weight"))
    with pytest.raises(ConversionError, match=r"lacks tensor 'lm_head\.weight'"):
        convert(path, tmp_path / "out", 1)


def test_wrong_shape_is_named(models, tmp_path):
    path = _copy_checkpoint(models, "ul2-gated-silu", tmp_path)
    name = "encoder.block.1.layer.1.DenseReluDense.wi_1.weight"
    edit_tensors(path, lambda sd: sd.__setitem__(name, torch.zeros(36, 32)))
    with pytest.raises(ConversionError, match=rf"model\.safetensors: tensor '{name}' has shape "
                                              r"\[36, 32\].*expects \[40, 32\]"):
        convert(path, tmp_path / "out", 1)


@pytest.mark.parametrize("change,message", [
    ({"d_model": None}, r"config\.json: required key 'd_model' is missing"),
    ({"feed_forward_proj": "gated-swoosh", "dense_act_fn": "swoosh"},
     r"config\.json: .*dense_act_fn 'swoosh'.*not supported"),
    ({"num_heads": 6}, r"num_heads \(6\) must be divisible by tensor_para_size \(4\)"),
])
def test_bad_config_json_is_named(change, message, models, tmp_path):
    path = _copy_checkpoint(models, "t5-relu-tied", tmp_path)
    edit_json(path, change)
    with pytest.raises(ConversionError, match=message):
        convert(path, tmp_path / "out", 4)


@pytest.mark.parametrize("section,key,value,message", [
    ("encoder", "d_model", None, r"\[encoder\] missing required key\(s\): d_model"),
    ("decoder", "feed_forward_proj", "gated-relu-x",
     r"\[decoder\] feed_forward_proj 'gated-relu-x'"),
    ("decoder", "dense_act_fn", "swoosh", r"\[decoder\] dense_act_fn 'swoosh'"),
    ("structure", "t5_with_bias", "true", r"\[structure\] t5_with_bias = true.*not supported"),
    ("structure", "position_embedding_type", "absolute",
     r"\[structure\] position_embedding_type 'absolute'"),
    ("decoder", "num_heads", "x", r"\[decoder\] num_heads must be an integer"),
    ("encoder,decoder", "weight_data_type", "int3", r"weight_data_type must be one of"),
])
def test_bad_config_ini_is_named(section, key, value, message, converted, tmp_path):
    path = shutil.copytree(converted("t5-relu-tied", 1), tmp_path / "1-gpu")
    edit_ini(path, section, key, value)
    with pytest.raises(ConfigError, match=rf"config\.ini: {message}"):
        T5Config.from_ini(path / "config.ini")


def test_weight_table_matches_written_sizes(converted):
    path = converted("ul2-gated-silu", 2)
    config = T5Config.from_ini(path / "config.ini")
    specs = t5_weight_specs(config)
    assert sum(1 if s.split_axis is None else 2 for s in specs.values()) == \
        len(list(path.glob("*.bin")))
    (path.parent / "copy").mkdir()
    broken = shutil.copytree(path, path.parent / "copy" / "2-gpu")
    (broken / "decoder.block.2.layer.2.DenseReluDense.wo.weight.1.bin").write_bytes(b"\0" * 8)
    from warpformer.weights import WeightFileError

    with pytest.raises(WeightFileError, match=r"wo\.weight\.1\.bin has 8 bytes, expected"):
        load_t5_weights(broken, 1)
