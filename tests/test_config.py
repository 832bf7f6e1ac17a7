"""GptConfig: ini/dict/JSON round trips, FT compatibility, validation messages."""

from __future__ import annotations

import json

import pytest

from warpformer.config import ConfigError, GptConfig, normalize_activation

BASE = dict(head_num=4, size_per_head=8, inter_size=96, num_layer=2, vocab_size=96,
            max_pos_seq_len=32)


def make(**kw) -> GptConfig:
    return GptConfig(**{**BASE, **kw})


def test_ini_round_trip(tmp_path):
    cfg = make(model_variant="gptj", rotary_embedding_dim=4, rotary_style="interleaved",
               parallel_residual=True, parallel_shared_layernorm=True, has_attention_bias=False,
               has_lm_head_bias=True, has_positional_encoding=False, tensor_para_size=2,
               weight_data_type="bf16", layernorm_eps=1e-6, rotary_base=5e5,
               extra={"int8": "False"})
    cfg.to_ini(tmp_path / "config.ini")
    text = (tmp_path / "config.ini").read_text()
    assert text.startswith("[gpt]")
    assert "parallel_residual = 1" in text and "has_attention_bias = 0" in text
    assert "int8 = False" in text
    back = GptConfig.from_ini(tmp_path / "config.ini")
    assert back == cfg


def test_dict_and_json_round_trip():
    cfg = make(activation_type="relu", layernorm_type="post_layernorm", word_embed_proj_dim=16)
    assert GptConfig.from_dict(cfg.to_dict()) == cfg
    data = json.loads(cfg.to_json())
    assert data["has_positional_encoding"] is True and data["head_num"] == 4
    assert "extra" not in data
    assert GptConfig.from_json(cfg.to_json()) == cfg
    assert cfg.hidden_size == 32 and cfg.embedding_dim == 16


def test_from_dict_strictness():
    with pytest.raises(ConfigError, match="unknown config keys: bogus"):
        GptConfig.from_dict({**BASE, "bogus": 1})
    assert GptConfig.from_dict({**BASE, "bogus": 1}, strict=False).extra == {"bogus": "1"}
    with pytest.raises(ConfigError, match="missing required config keys: vocab_size"):
        GptConfig.from_dict({k: v for k, v in BASE.items() if k != "vocab_size"})


@pytest.mark.parametrize("name, canon", [
    ("Gelu", "gelu_tanh"), ("gelu", "gelu_tanh"), ("GELU_ERF", "gelu_erf"), ("Relu", "relu"),
    ("gelu_tanh", "gelu_tanh"), ("SiLU", "silu"), ("gelu_new", "gelu_tanh"),
])
def test_activation_names(name, canon):
    assert normalize_activation(name) == canon
    assert make(activation_type=name).activation_type == canon


def test_ft_gpt_ini_with_defaults(tmp_path):
    """What FT's HF GPT-2 / OPT / BLOOM converters wrote: few keys, legacy names, True/False."""
    d = tmp_path / "2-gpu"
    d.mkdir()
    (d / "config.ini").write_text(
        "[gpt]\nmodel_name = gpt2\nhead_num = 4\nsize_per_head = 8\ninter_size = 96\n"
        "max_pos_seq_len = 32\nnum_layer = 2\nvocab_size = 96\nstart_id = 50\nend_id = 50\n"
        "weight_data_type = fp16\nactivation_type = Gelu\nint8 = False\n")
    cfg = GptConfig.from_ini(d / "config.ini")
    assert cfg.tensor_para_size == 2  # from the "<N>-gpu" folder name
    assert cfg.activation_type == "gelu_tanh" and cfg.model_variant == "gpt2"
    assert cfg.layernorm_type == "pre_layernorm" and cfg.has_post_decoder_layernorm
    assert cfg.extra == {"int8": "False"}

    (d / "config.ini").write_text(
        "[gpt]\nmodel_name=bigscience/bloom\nnum_layer=2\nhead_num=4\ninter_size=128\n"
        "size_per_head=8\nvocab_size=96\ntensor_para_size=1\nweight_data_type=fp32\n"
        "model_variant=bloom-pre\nlayernorm_eps=1e-05\nlayernorm_type=pre_layernorm\n"
        "activation_type=Gelu\nhas_positional_encoding=False\nhas_pre_decoder_layernorm=True\n"
        "has_post_decoder_layernorm=True\nuse_attention_linear_bias=True\nstart_id=1\nend_id=2\n")
    cfg = GptConfig.from_ini(d / "config.ini")
    assert cfg.model_variant == "bloom" and cfg.use_attention_linear_bias
    assert not cfg.has_positional_encoding and cfg.max_pos_seq_len == 0


def test_ft_legacy_gptj_section(tmp_path):
    (tmp_path / "config.ini").write_text(
        "[gptj]\nmodel_name = gptj\nhead_num = 4\nsize_per_head = 8\ninter_size = 128\n"
        "num_layer = 2\nrotary_embedding = 4\nvocab_size = 96\nstart_id = 1\nend_id = 2\n"
        "weight_data_type = fp32\n")
    cfg = GptConfig.from_ini(tmp_path / "config.ini")
    assert cfg.rotary_embedding_dim == 4 and cfg.rotary_style == "interleaved"
    assert cfg.parallel_residual and cfg.parallel_shared_layernorm
    assert not cfg.has_attention_bias and cfg.has_lm_head_bias and cfg.model_variant == "gptj"


def test_ft_legacy_gptneox_tp2_marks_divided_biases(tmp_path):
    d = tmp_path / "2-gpu"
    d.mkdir()
    (d / "config.ini").write_text(
        "[gptneox]\nhead_num = 4\nsize_per_head = 8\ninter_size = 128\nnum_layer = 2\n"
        "rotary_embedding = 4\nvocab_size = 96\nstart_id = 1\nend_id = 2\nuse_gptj_residual = 1\n"
        "weight_data_type = fp16\n")
    cfg = GptConfig.from_ini(d / "config.ini")  # the loader multiplies the biases back
    assert cfg.row_parallel_bias_divided and cfg.tensor_para_size == 2
    (d / "config.ini").write_text((d / "config.ini").read_text().replace("2-gpu", "")
                                  + "tensor_para_size = 1\n")
    assert not GptConfig.from_ini(d / "config.ini").row_parallel_bias_divided


@pytest.mark.parametrize("kw, message", [
    (dict(tensor_para_size=3), r"head_num \(4\) must be divisible by tensor_para_size \(3\)"),
    (dict(inter_size=90, tensor_para_size=4), r"inter_size \(90\) must be divisible"),
    (dict(activation_type="gelu_fast2"), r"activation_type 'gelu_fast2' is not supported"),
    (dict(weight_data_type="int8"), r"weight_data_type must be one of fp32, fp16, bf16"),
    (dict(layernorm_type="sandwich"), r"layernorm_type must be one of"),
    (dict(rotary_embedding_dim=10), r"rotary_embedding_dim \(10\) must be even and at most"),
    (dict(rotary_embedding_dim=4, rotary_style="full"), r"rotary_style must be one of"),
    (dict(head_num=0), r"head_num must be positive"),
    (dict(head_num="four"), r"head_num must be an integer, got 'four'"),
    (dict(has_positional_encoding="maybe"), r"has_positional_encoding must be a boolean"),
    (dict(max_pos_seq_len=0), r"max_pos_seq_len must be positive when has_positional_encoding"),
    (dict(parallel_shared_layernorm=True), r"requires parallel_residual = 1"),
    (dict(parallel_residual=True, layernorm_type="post_layernorm"), r"requires a pre-norm"),
    (dict(end_id=96), r"end_id \(96\) must be in \[0, vocab_size\)"),
    (dict(model_variant="falcon"), r"model_variant must be one of"),
])
def test_validation_messages(kw, message):
    with pytest.raises(ConfigError, match=message):
        make(**kw)


def test_ini_errors(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        GptConfig.from_ini(tmp_path / "missing.ini")
    (tmp_path / "c.ini").write_text("[other]\na = 1\n")
    with pytest.raises(ConfigError, match=r"no \[gpt\] section \(found: other\)"):
        GptConfig.from_ini(tmp_path / "c.ini")
    (tmp_path / "c.ini").write_text("[gpt]\nhead_num = 4\nsize_per_head = 8\n")
    with pytest.raises(ConfigError, match=r"c\.ini: missing required config keys: inter_size"):
        GptConfig.from_ini(tmp_path / "c.ini")
    (tmp_path / "c.ini").write_text("[gpt]\nhead_num = 4\nsize_per_head = x\ninter_size = 8\n"
                                    "num_layer = 1\nvocab_size = 8\nmax_pos_seq_len = 8\n")
    with pytest.raises(ConfigError, match=r"c\.ini: size_per_head must be an integer"):
        GptConfig.from_ini(tmp_path / "c.ini")
