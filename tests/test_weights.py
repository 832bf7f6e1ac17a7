"""warpformer.weights: per-rank loading, pipeline stages, casting, size checks, FT configs."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from _models import rel_err

from warpformer.config import GptConfig
from warpformer.reference import GptReference
from warpformer.weights import (
    WeightFileError,
    expected_shapes,
    load_merged_weights,
    load_weights,
    read_config,
    weight_specs,
)

pytest_plugins = ["_convert_fixtures"]


def test_rank_shapes_and_names(converted):
    out = converted("gpt2", 2)
    cfg = read_config(out)
    shapes = expected_shapes(cfg)
    w = load_weights(out, tp_rank=1)
    assert "layers.0.attention.query_key_value.weight" in w
    assert w["layers.0.attention.query_key_value.weight"].shape == (32, 3, 16)
    assert w["layers.1.attention.query_key_value.bias"].shape == (3, 16)
    assert w["layers.0.mlp.dense_4h_to_h.weight"].shape == (48, 32)
    assert "lm_head.weight" not in w and "wte" in w  # tied
    for name, t in w.items():
        assert tuple(t.shape) == shapes[name], name
        assert t.dtype == torch.float32
    specs = weight_specs(cfg)
    assert set(w) == {n for n, s in specs.items() if not s.optional}


def test_parent_dir_is_resolved(converted):
    out = converted("opt-125m", 4)
    assert load_weights(out.parent, tp_rank=3).keys() == load_weights(out, tp_rank=3).keys()


def test_pipeline_stages(converted):
    out = converted("gptj", 2)  # untied head with bias, 2 layers
    first = load_weights(out, tp_rank=0, pp_rank=0, pipeline_para_size=2)
    last = load_weights(out, tp_rank=0, pp_rank=1, pipeline_para_size=2)
    assert {k.split(".")[1] for k in first if k.startswith("layers.")} == {"0"}
    assert {k.split(".")[1] for k in last if k.startswith("layers.")} == {"1"}
    assert "wte" in first and "wte" not in last
    assert {"final_layernorm.weight", "lm_head.weight", "lm_head.bias"} <= set(last)
    assert not {"final_layernorm.weight", "lm_head.weight"} & set(first)
    tied = load_weights(converted("gpt2", 2), pp_rank=1, pipeline_para_size=2)
    assert "wte" in tied and "wpe" not in tied  # the tied head needs the embedding table
    with pytest.raises(ValueError, match=r"num_layer \(2\) must be divisible by "
                                         r"pipeline_para_size \(3\)"):
        load_weights(out, pp_rank=0, pipeline_para_size=3)
    with pytest.raises(ValueError, match=r"tp_rank \(2\) must be in \[0, tensor_para_size"):
        load_weights(out, tp_rank=2)


def test_cast_and_bf16(converted):
    out16 = converted("bloom", 1, "bf16")
    w = load_weights(out16)
    assert {t.dtype for t in w.values()} == {torch.bfloat16}
    full = load_weights(converted("bloom", 1))
    assert torch.equal(w["wte"], full["wte"].to(torch.bfloat16))
    cast = load_weights(out16, dtype=torch.float32)
    assert torch.equal(cast["wte"], full["wte"].to(torch.bfloat16).float())


def test_merged_equals_tp1(converted):
    _, one = load_merged_weights(converted("gptneox-parallel", 1))
    _, four = load_merged_weights(converted("gptneox-parallel", 4))
    assert one.keys() == four.keys()
    for k in one:
        assert torch.equal(one[k], four[k]), k


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_truncated_file_named_with_sizes(converted, tmp_path):
    out = _copy(converted("gpt2", 2), tmp_path / "2-gpu")
    victim = out / "model.layers.1.mlp.dense_h_to_4h.weight.1.bin"
    victim.write_bytes(victim.read_bytes()[:-4])
    expected = 32 * 48 * 4
    with pytest.raises(WeightFileError, match=rf"{victim.name} has {expected - 4} bytes, "
                                              rf"expected {expected} \(shape \[32, 48\] fp32"):
        load_weights(out, tp_rank=1)
    load_weights(out, tp_rank=0)  # the other rank does not read that file


def test_missing_file(converted, tmp_path):
    out = _copy(converted("opt-350m", 1), tmp_path / "1-gpu")
    (out / "model.project_out.weight.bin").unlink()
    with pytest.raises(WeightFileError, match=r"missing weight file .*model\.project_out\."
                                              r"weight\.bin \(tensor project_out\.weight, "
                                              r"shape \[32, 16\]"):
        load_weights(out)


def test_config_mismatch_detected_before_reading(converted, tmp_path):
    """A config.ini saying fp16 for fp32 files fails on the first file's size, naming it."""
    out = _copy(converted("gpt2", 1), tmp_path / "1-gpu")
    text = (out / "config.ini").read_text().replace("weight_data_type = fp32",
                                                    "weight_data_type = fp16")
    (out / "config.ini").write_text(text)
    with pytest.raises(WeightFileError, match=r"model\.wte\.bin has 12288 bytes, expected 6144"):
        load_weights(out)


def test_no_config(tmp_path):
    with pytest.raises(WeightFileError, match="no config.ini"):
        load_weights(tmp_path)


def test_ft_converted_opt_loads(converted, hf_reference, token_ids, tmp_path):
    """A directory as FT's OPT converter writes it (FT keys only, 'Relu', lm_head written even
    though tied, no tensor_para_size) loads and computes the HF logits."""
    out = _copy(converted("opt-125m", 2), tmp_path / "2-gpu")
    (out / "config.ini").write_text(
        "[gpt]\nmodel_name = opt\nhead_num = 4\nsize_per_head = 8\ninter_size = 96\n"
        "max_pos_seq_len = 32\nnum_layer = 2\nlayernorm_eps = 1e-5\n"
        "layernorm_type = pre_layernorm\nactivation_type = Relu\n"
        "has_post_decoder_layernorm = 1\nvocab_size = 96\nstart_id = 2\nend_id = 2\n"
        "weight_data_type = fp32\nint8 = False\n")
    shutil.copy(out / "model.wte.bin", out / "model.lm_head.weight.bin")
    cfg = read_config(out)
    assert cfg.tensor_para_size == 2 and cfg.activation_type == "relu"
    assert "lm_head.weight" in load_weights(out)
    logits = GptReference.from_dir(out)(token_ids)
    assert rel_err(logits, hf_reference("opt-125m")) < 1e-5


@pytest.mark.parametrize("tp", [2, 4])
def test_ft_converted_gptneox_with_divided_biases_loads(converted, hf_reference, token_ids,
                                                        tmp_path, tp):
    """FT's GPT-NeoX converter writes a [gptneox] section, no tensor_para_size, and the
    row-parallel biases (attention.dense, mlp.dense_4h_to_h) divided by tp: the loader multiplies
    them back, so the model computes HF's logits."""
    ours = converted("gptneox-parallel", tp)
    out = _copy(ours, tmp_path / f"{tp}-gpu")
    cfg = read_config(ours)
    (out / "config.ini").write_text(
        f"[gptneox]\nmodel_name = neox\nhead_num = {cfg.head_num}\n"
        f"size_per_head = {cfg.size_per_head}\ninter_size = {cfg.inter_size}\n"
        f"num_layer = {cfg.num_layer}\nrotary_embedding = {cfg.rotary_embedding_dim}\n"
        f"vocab_size = {cfg.vocab_size}\nstart_id = 0\nend_id = 2\nuse_gptj_residual = 1\n"
        f"weight_data_type = fp32\nrotary_base = {cfg.rotary_base}\n")  # FT: always 1e4
    divided = []
    for f in sorted(out.glob("model.layers.*.bias.bin")):
        if ".attention.dense." in f.name or ".mlp.dense_4h_to_h." in f.name:
            (np.fromfile(f, dtype="<f4") / tp).astype("<f4").tofile(f)
            divided.append(f.name)
    assert len(divided) == 2 * cfg.num_layer
    got = load_weights(out, tp_rank=tp - 1)
    want = load_weights(ours, tp_rank=tp - 1)
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-6, atol=0, msg=name)
    logits = GptReference.from_dir(out)(token_ids)
    assert rel_err(logits, hf_reference("gptneox-parallel")) < 1e-5


def test_non_finite_weights_are_named(converted, tmp_path):
    out = _copy(converted("gpt2", 2), tmp_path / "2-gpu")
    path = out / "model.layers.1.mlp.dense_h_to_4h.weight.1.bin"
    values = np.fromfile(path, dtype="<f4")
    values[[3, 7]] = [np.nan, np.inf]
    values.tofile(path)
    with pytest.raises(WeightFileError, match=rf"weight file {path} \(tensor "
                       r"layers\.1\.mlp\.dense_h_to_4h\.weight\) holds 2 non-finite value"):
        load_weights(out, tp_rank=1)
    assert load_weights(out, tp_rank=0)  # the other rank's files are fine
    # An overflow made by the cast is reported too (fp32 70000 is inf in fp16).
    path = out / "model.wpe.bin"
    values = np.fromfile(path, dtype="<f4")
    values[0] = 7e4
    values.tofile(path)
    with pytest.raises(WeightFileError, match=r"tensor wpe\) holds 1 non-finite value.*float16"):
        load_weights(out, tp_rank=0, dtype=torch.float16)


def test_layer_files_past_num_layer_are_refused(converted, tmp_path):
    out = _copy(converted("gpt2", 1), tmp_path / "1-gpu")
    ini = out / "config.ini"
    ini.write_text(ini.read_text().replace("num_layer = 2", "num_layer = 1"))
    with pytest.raises(WeightFileError, match=r"holds weight files of layer\(s\) 1, but "
                                              r"config.ini says num_layer = 1"):
        load_weights(out)


def test_expected_shapes_table():
    cfg = GptConfig(head_num=8, size_per_head=16, inter_size=512, num_layer=3, vocab_size=1000,
                    max_pos_seq_len=64, tensor_para_size=4, word_embed_proj_dim=64,
                    has_pre_decoder_layernorm=True)
    shapes = expected_shapes(cfg)
    assert shapes["wte"] == (1000, 64) and shapes["lm_head.weight"] == (1000, 64)
    assert shapes["project_in.weight"] == (64, 128) and shapes["project_out.weight"] == (128, 64)
    assert shapes["layers.2.attention.query_key_value.weight"] == (128, 3, 32)
    assert shapes["layers.2.attention.dense.weight"] == (32, 128)
    assert shapes["layers.0.mlp.dense_h_to_4h.bias"] == (128,)
    assert shapes["layers.0.mlp.dense_4h_to_h.bias"] == (128,)
    assert shapes["pre_decoder_layernorm.bias"] == (128,)
    assert weight_specs(cfg)["lm_head.weight"].optional
    assert sum(1 for k in shapes if k.startswith("layers.")) == 3 * 12
    total = sum(int(np.prod(s)) for s in shapes.values())
    assert total > 0


def test_table_is_the_engines_and_format_level():
    """weight_specs is the engine's table (torch.ops.warpformer.gpt_weight_table): splits,
    layers and stages as the format says, also for a head size the kernels are not built for
    (16: it converts and runs on the reference backend), which the engine itself refuses."""
    cfg = GptConfig(head_num=8, size_per_head=16, inter_size=512, num_layer=2, vocab_size=1000,
                    max_pos_seq_len=64, tensor_para_size=2, parallel_residual=True,
                    parallel_shared_layernorm=True, has_attention_bias=False,
                    has_lm_head_bias=True)
    specs = weight_specs(cfg)
    assert specs["layers.1.attention.query_key_value.weight"].split_axis == -1
    assert specs["layers.1.attention.dense.weight"].split_axis == 0
    assert specs["layers.1.mlp.dense_4h_to_h.bias"].split_axis is None
    assert specs["layers.1.mlp.dense_h_to_4h.bias"].layer == 1
    assert (specs["wte"].stage, specs["lm_head.bias"].stage) == ("first", "last")
    assert "layers.0.post_attention_layernorm.weight" not in specs  # GPT-J's shared norm
    assert "layers.0.attention.dense.bias" not in specs
    with pytest.raises(RuntimeError, match="size_per_head must be one of 32, 48"):
        torch.classes.warpformer.GptModel(cfg.to_json(), {}, "{}")


@pytest.mark.parametrize("kind", ["gpt2", "gptj"])
def test_vocabulary_rows_padded_in_storage(kind, tmp_path, converted):
    """An odd vocabulary's ``wte`` and ``lm_head.weight`` load as ``[V, e]`` views of zeroed
    buffers of a multiple of 8 rows (the engine multiplies its lm_head at that width in place),
    holding the file's values, in any dtype; no other tensor carries padding."""
    import transformers

    from warpformer.converters import convert

    if kind == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=101, n_embd=32, n_head=2, n_layer=1,
                                      n_positions=64, bos_token_id=1, eos_token_id=2)
        model, padded = transformers.GPT2LMHeadModel, ["wte"]
    else:
        cfg = transformers.GPTJConfig(vocab_size=101, n_embd=32, n_head=2, n_layer=1,
                                      rotary_dim=8, n_positions=64, bos_token_id=1,
                                      eos_token_id=2)
        model, padded = transformers.GPTJForCausalLM, ["wte", "lm_head.weight"]
    torch.manual_seed(0)
    hf = model(cfg)
    hf.save_pretrained(tmp_path / "hf")
    out = convert(tmp_path / "hf", tmp_path / "wf", 1, "fp32").output_dir
    sd = hf.state_dict()
    source = {"wte": sd["transformer.wte.weight"], "lm_head.weight": sd.get("lm_head.weight")}
    for dtype in (torch.float32, torch.float16):
        w = load_weights(out, dtype=dtype)
        assert [n for n, t in w.items() if t.untyped_storage().nbytes() != t.nbytes] == padded
        for name in padded:
            t = w[name]
            assert t.shape == (101, 32) and t.is_contiguous() and t.dtype == dtype
            assert t.untyped_storage().nbytes() == 104 * 32 * t.element_size()
            assert torch.equal(t, source[name].to(dtype))
            rows = torch.as_strided(t, (104, 32), t.stride(), t.storage_offset())
            assert not rows[101:].any()
    # Tensor-parallel ranks get exact tensors (the engine copies each rank's padded slice), and
    # a vocabulary of a multiple of 8 (96) needs no padding.
    split = convert(tmp_path / "hf", tmp_path / "wf2", 2, "fp32").output_dir
    for rank in (0, 1):
        assert all(t.untyped_storage().nbytes() == t.nbytes
                   for t in load_weights(split, tp_rank=rank).values())
    even = load_weights(converted(kind))
    assert all(t.untyped_storage().nbytes() == t.nbytes for t in even.values())
