"""BART family (issue 51, CPU part): the converter into FT's BART layout, its config and the
plain-PyTorch seq2seq reference, checked against HF on tiny random BART (post-LN) and mBART
(pre-LN, scaled embeddings) models."""

from __future__ import annotations

import configparser
import shutil

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
POSITIONS = 20

# name -> (model class prefix, config overrides)
VARIANTS = {
    "bart": ("Bart", dict(decoder_layers=3)),
    "mbart-odd-vocab": ("MBart", dict(vocab_size=101, scale_embedding=True, decoder_ffn_dim=56,
                                      activation_function="relu")),
}


def _build(name: str) -> transformers.PreTrainedModel:
    kind, kw = VARIANTS[name]
    cfg = dict(vocab_size=96, d_model=32, encoder_layers=2, decoder_layers=2,
               encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=40,
               decoder_ffn_dim=48, max_position_embeddings=POSITIONS, pad_token_id=1,
               bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
               forced_eos_token_id=None)
    cfg.update(kw)
    torch.manual_seed(0)
    model = getattr(transformers, f"{kind}ForConditionalGeneration")(
        getattr(transformers, f"{kind}Config")(**cfg))
    model.config._attn_implementation = "eager"
    model = randomize(model, seed=1)
    with torch.no_grad():  # a buffer, which randomize leaves at zero
        model.final_logits_bias.normal_(generator=torch.Generator().manual_seed(2))
    return model


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """name -> (HF model, checkpoint dir)."""
    return save_models(_build, list(VARIANTS), tmp_path_factory.mktemp("bart-checkpoints"))


@pytest.fixture(scope="module")
def converted(models, tmp_path_factory):
    return converter(models, tmp_path_factory.mktemp("bart-converted"), convert)


def _inputs(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(3, vocab, (3, 9), generator=torch.Generator().manual_seed(3))
    ids[torch.arange(3), LENGTHS - 1] = 2  # BART inputs end with </s>
    mask = (torch.arange(9)[None, :] < LENGTHS[:, None]).long()
    return ids * mask + (1 - mask), mask  # pad id 1 after each row


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
    check_greedy(model, Seq2SeqReference.from_dir(converted(name, tp)),
                 *_inputs(model.config.vocab_size), NEW_TOKENS, no_repeat_ngram_size=0,
                 forced_bos_token_id=None, forced_eos_token_id=None)


def test_layout_names_split_and_config(models, converted):
    path = converted("mbart-odd-vocab", 2)
    files = {p.name for p in path.iterdir()}
    for name in ("encoder.embed_tokens.weight.bin", "decoder.embed_tokens.weight.bin",
                 "decoder.lm_head.weight.bin", "decoder.final_logits_bias.bin",
                 "encoder.embed_positions.weight.bin", "encoder.final_layer_norm.bias.bin",
                 "decoder.layer_norm.weight.bin", "encoder.1.layer.SelfAttention.q.weight.1.bin",
                 "encoder.1.layer.SelfAttention.q.bias.1.bin",
                 "encoder.0.layer.SelfAttention.out_proj.bias.1.bin",
                 "encoder.0.layer.SelfAttention.attn_layer_norm.bias.bin",
                 "decoder.1.layer.SelfAttention.qkv.bias.0.bin",
                 "decoder.1.layer.CrossAttention.v.weight.0.bin",
                 "decoder.1.layer.CrossAttention.attn_layer_norm.weight.bin",
                 "decoder.1.layer.SelfAttention.fc2.bias.0.bin",
                 "decoder.1.layer.SelfAttention.final_layer_norm.weight.bin"):
        assert name in files, name
    specs = t5_weight_specs(T5Config.from_ini(path / "config.ini"))
    assert sum(2 if s.ranked else 1 for s in specs.values()) == len(files) - 1  # + config.ini
    ini = configparser.ConfigParser()
    ini.read(path / "config.ini")
    assert (ini["encoder"]["model_name"], ini["encoder"]["mbart"]) == ("bart", "true")
    assert ini["decoder"]["max_pos_seq_len"] == str(POSITIONS)
    assert ini["structure"]["position_embedding_type"] == "absolute"
    assert "relative_attention_num_buckets_or_max_pos_seq_len" not in ini["encoder"]
    config = T5Config.from_ini(path / "config.ini")
    assert (config.model_type, config.pre_layernorm, config.decoder.activation) == \
        ("mbart", True, "relu")
    hf = models["mbart-odd-vocab"][0].state_dict()
    shard = load_t5_weights(path, 1)
    torch.testing.assert_close(shard["encoder.embed_positions.weight"],
                               hf["model.encoder.embed_positions.weight"][2:], rtol=0, atol=0)
    torch.testing.assert_close(shard["decoder.embed_tokens.weight"],
                               hf["model.shared.weight"] * 32 ** 0.5)
    torch.testing.assert_close(shard["decoder.1.layer.SelfAttention.qkv.bias"],
                               torch.stack([hf[f"model.decoder.layers.1.self_attn.{m}_proj.bias"]
                                            for m in "qkv"])[:, 16:], rtol=0, atol=0)
    torch.testing.assert_close(shard["decoder.0.layer.CrossAttention.out_proj.bias"],
                               hf["model.decoder.layers.0.encoder_attn.out_proj.bias"],
                               rtol=0, atol=0)


def test_half_conversion_writes_half_files(models, converted):
    path = converted("bart", 1, "fp16")
    assert T5Config.from_ini(path / "config.ini").weight_data_type == "fp16"
    name = "encoder.0.layer.SelfAttention.fc1.weight.0.bin"
    raw = np.fromfile(path / name, dtype=np.float16)
    want = models["bart"][0].state_dict()["model.encoder.layers.0.fc1.weight"].t().half()
    assert torch.equal(torch.from_numpy(raw).reshape(want.shape), want)
    ids, _ = _inputs(96)
    assert torch.isfinite(Seq2SeqReference.from_dir(path).encode(ids, LENGTHS)).all()


def test_cli_detects_bart_by_model_type(models, tmp_path, capsys):
    src = shutil.copytree(models["bart"][1], tmp_path / "ckpt")
    edit_json(src, {"architectures": None})
    rc = main(["convert", "--input-dir", str(src), "--output-dir", str(tmp_path / "out"),
               "--tensor-para-size", "4", "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    assert T5Config.from_ini(tmp_path / "out" / "4-gpu" / "config.ini").model_type == "bart"


def test_ft_converted_directory_loads(converted, tmp_path):
    """FT's BART converter writes [encoder]/[decoder] only: no [structure], model_type,
    tensor_para_size, pad id or epsilon; model_name and mbart mark the family."""
    src = converted("bart", 1)
    ft = shutil.copytree(src, tmp_path / "1-gpu")
    ini = configparser.ConfigParser()
    ini.read(ft / "config.ini")
    keep = {"encoder": ("model_name", "mbart", "num_heads", "d_kv", "d_model", "d_ff",
                        "num_layers", "vocab_size", "max_pos_seq_len", "feed_forward_proj",
                        "weight_data_type"),
            "decoder": ("num_heads", "d_kv", "d_model", "d_ff", "num_layers", "vocab_size",
                        "max_pos_seq_len", "decoder_start_token_id", "eos_token_id",
                        "weight_data_type")}
    out = configparser.ConfigParser()
    for section, keys in keep.items():
        out[section] = {k: ini[section][k] for k in keys}
    with open(ft / "config.ini", "w") as f:
        out.write(f)
    a, b = Seq2SeqReference.from_dir(ft), Seq2SeqReference.from_dir(src)
    assert (a.config.pad_token_id, a.config.encoder.layer_norm_epsilon) == (1, 1e-5)
    ids, _ = _inputs(96)
    enc = a.encode(ids, LENGTHS)
    torch.testing.assert_close(enc, b.encode(ids, LENGTHS), rtol=0, atol=0)
    dec = torch.full((3, 2), 2)
    torch.testing.assert_close(a.decoder_logits(enc, LENGTHS, dec),
                               b.decoder_logits(enc, LENGTHS, dec), rtol=0, atol=0)


# ----------------------------------------------------------------------------- errors
def test_missing_tensor_is_named(models, tmp_path):
    path = shutil.copytree(models["bart"][1], tmp_path / "ckpt")
    name = "model.decoder.layers.2.encoder_attn.k_proj.bias"
    edit_tensors(path, lambda sd: sd.pop(name))
    with pytest.raises(ConversionError, match=rf"lacks tensor '{name}'"):
        convert(path, tmp_path / "out", 1)
    assert not (tmp_path / "out").exists()


def test_wrong_shape_is_named(models, tmp_path):
    path = shutil.copytree(models["mbart-odd-vocab"][1], tmp_path / "ckpt")
    name = "model.encoder.layers.1.fc1.weight"
    edit_tensors(path, lambda sd: sd.__setitem__(name, torch.zeros(36, 32)))
    with pytest.raises(ConversionError, match=rf"model\.safetensors: tensor '{name}' has shape "
                                              r"\[36, 32\].*expects \[40, 32\]"):
        convert(path, tmp_path / "out", 2)


@pytest.mark.parametrize("change,message", [
    ({"max_position_embeddings": None},
     r"config\.json: required key 'max_position_embeddings' is missing"),
    ({"activation_function": "tanh"},
     r"config\.json: \[encoder\] activation_function 'tanh'.*not supported"),
    ({"decoder_attention_heads": 6},
     r"d_model \(32\) must be divisible by decoder_attention_heads \(6\)"),
    ({"encoder_ffn_dim": 42}, r"\[encoder\] d_ff \(42\) must be divisible by tensor_para_size"),
])
def test_bad_config_json_is_named(change, message, models, tmp_path):
    path = shutil.copytree(models["bart"][1], tmp_path / "ckpt")
    edit_json(path, change)
    with pytest.raises(ConversionError, match=message):
        convert(path, tmp_path / "out", 4)


@pytest.mark.parametrize("section,key,value,message", [
    ("decoder", "max_pos_seq_len", None, r"\[decoder\] max_pos_seq_len .* must be >= 1, got 0"),
    ("structure", "position_embedding_type", "relative",
     r"\[structure\] position_embedding_type 'relative' is not supported"),
    ("structure", "bart_with_bias", "false", r"\[structure\] bart_with_bias = false"),
    ("encoder", "mbart", "maybe", r"\[encoder\] mbart must be a boolean"),
    ("encoder,decoder", "feed_forward_proj", "gated-gelu",
     r"\[encoder\] feed_forward_proj 'gated-gelu': the BART family has no gated FFN"),
])
def test_bad_config_ini_is_named(section, key, value, message, converted, tmp_path):
    path = shutil.copytree(converted("bart", 1), tmp_path / "1-gpu")
    edit_ini(path, section, key, value)
    with pytest.raises(ConfigError, match=rf"config\.ini: {message}"):
        T5Config.from_ini(path / "config.ini")


def test_positions_beyond_the_table_are_refused(converted):
    ref = Seq2SeqReference.from_dir(converted("bart", 1))
    with pytest.raises(ValueError, match=rf"encoder position {POSITIONS} is beyond "
                                         rf"max_pos_seq_len \({POSITIONS}\)"):
        ref.encode(torch.full((1, POSITIONS + 1), 5))
