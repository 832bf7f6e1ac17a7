"""Weight-only int8/int4 (issue 52), the CPU half: the quantizer's round trip, the converter's
files and TP split, the loader and the reference oracle on the dequantized weights, and every bad
request's message, and the engine's checks of quantized weights that need no GPU (its oracle
tests: tests/gpu/test_gemm_quant.py, tests/gpu/test_quant_engine.py)."""

from __future__ import annotations

import configparser
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from _models import rel_err

from warpformer import GPT
from warpformer.cli import main
from warpformer.config import ConfigError, GptConfig, QuantScheme
from warpformer.converters import ConversionError, convert
from warpformer.converters.quantize import (
    dequantize,
    dequantize_int4,
    pack_int4,
    quantize,
    quantize_int4,
    quantize_int8,
    unpack_int4,
)
from warpformer.reference import GptReference
from warpformer.weight_quant import quantize_kernel
from warpformer.weights import (
    WeightFileError,
    load_merged_weights,
    load_weights,
    quantized_kernels,
    read_config,
    stored_specs,
)

pytest_plugins = ["_convert_fixtures"]

# (mode, asymmetric); int4 groups of 16 fit the tiny models' widths (32, 96) at tp 1 and 2.
SCHEMES = {"int8": QuantScheme("int8"), "int4": QuantScheme("int4", 16),
           "int4-asym": QuantScheme("int4", 16, asymmetric=True)}
KERNELS = ("attention.query_key_value", "attention.dense", "mlp.dense_h_to_4h",
           "mlp.dense_4h_to_h")


# ----------------------------------------------------------------------------- the quantizer
def _steps(q, group: int) -> torch.Tensor:
    """Each element's quantization step (its column's or group's stored scale), fp32."""
    scale = q.scale.float()
    return scale.expand(q.data.shape) if q.mode == "int8" else scale.repeat_interleave(group, 0)


def _inputs() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    normal = torch.randn(256, 3, 24, generator=gen)
    zeros = normal.clone()
    zeros[:, 1, :5] = 0  # all-zero columns (and int4 groups)
    zeros[:128, 2, 7] = 0  # one all-zero int4 group in a live column
    outliers = normal.clone()
    outliers[7, 0, 3] = 500.0  # one huge weight in a column ...
    outliers[130, 2, 2] = -1e-3  # ... and a column of tiny ones, all one sign
    outliers[:, 2, 2] = outliers[:, 2, 2].abs() * 1e-4
    outliers[200:, 1, 9] = 3.0  # constant stretch
    return {"normal": normal, "zeros": zeros, "outliers": outliers,
            "fp16": normal.half(), "bf16-positive": normal.abs().bfloat16()}


@pytest.mark.parametrize("scale_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", list(_inputs()))
@pytest.mark.parametrize("mode", ["int8", "int4", "int4-asym"])
def test_round_trip_within_half_a_step(mode, case, scale_dtype):
    w = _inputs()[case]
    group = 32
    q = quantize(w, mode[:4], group, scale_dtype, mode.endswith("asym"))
    assert q.scale.dtype == scale_dtype
    back = dequantize(q)
    err = (back - w.float()).abs()
    # Half a step, plus fp32 rounding of the division (a few ulps of the value).
    bound = 0.5 * _steps(q, group) * (1 + 1e-6) + 1e-6 * w.float().abs()
    assert bool((err <= bound).all()), float((err - bound).max())
    assert bool((back[w == 0] == 0).all()) or mode == "int4-asym"  # exact zeros when symmetric
    if case == "zeros":  # an all-zero column or group dequantizes exactly, with scale 0
        assert bool((back[:, 1, :5] == 0).all())
        assert bool((q.scale.float() == 0).any())


def test_int8_is_ft_per_channel():
    w = torch.tensor([[1.0, -0.5, 0.0], [-2.54, 0.25, 0.0]])
    q = quantize_int8(w, torch.float32)
    torch.testing.assert_close(q.scale, torch.tensor([2.54 / 127, 0.5 / 127, 0.0]))
    assert q.data.dtype == torch.int8 and q.data.tolist() == [[50, -127, 0], [-127, 64, 0]]
    big = quantize_int8(torch.randn(300, 7) * 40, torch.float16)
    assert int(big.data.abs().max()) == 127


def test_int4_packing_and_nibble_order():
    q = torch.tensor([[1, 15], [2, 0], [7, 8], [9, 3]], dtype=torch.uint8)
    packed = pack_int4(q)
    assert packed.dtype == torch.uint8 and packed.shape == (2, 2)
    assert packed.tolist() == [[0x21, 0x0F], [0x97, 0x38]]  # row 2j low, row 2j+1 high
    assert torch.equal(unpack_int4(packed), q)
    # symmetric: two's complement nibbles in [-7, 7]; one group of 4 rows, scale 1
    w = torch.tensor([[-7.0], [7.0], [0.0], [-1.0]])
    s = quantize_int4(w, 4, torch.float32)
    assert s.scale.item() == 1.0 and s.zero is None
    assert unpack_int4(s.data).flatten().tolist() == [9, 7, 0, 15]
    assert torch.equal(dequantize_int4(s.data, s.scale), w)
    # asymmetric: zero point keeps 0.0 exact
    a = quantize_int4(torch.tensor([[-1.0], [0.0], [0.5], [2.0]]), 4, torch.float32,
                      asymmetric=True)
    assert a.zero.dtype == torch.uint8 and a.zero.item() == 5
    assert a.scale.item() == pytest.approx(0.2)
    assert dequantize(a)[1].item() == 0.0


def test_quantizer_errors():
    w = torch.randn(48, 8)
    with pytest.raises(ValueError, match="group size 32 does not divide the input width 48"):
        quantize_int4(w, 32)
    with pytest.raises(ValueError, match="even integer >= 2"):
        quantize_int4(w, 3)
    with pytest.raises(ValueError, match="must be one of int8, int4, got 'int3'"):
        quantize(w, "int3")
    with pytest.raises(ValueError, match="asymmetric .* int4 only"):
        quantize(w, "int8", asymmetric=True)
    with pytest.raises(ValueError, match="NaN or inf"):
        quantize_int8(torch.tensor([[float("nan")], [1.0]]))
    with pytest.raises(ValueError, match="overflows torch.float16"):
        quantize_int8(torch.full((2, 2), 1e9))
    with pytest.raises(ValueError, match="floating kernel"):
        quantize_int8(torch.ones(4, dtype=torch.int32))


# ----------------------------------------------------------------------------- the converter
@pytest.fixture(scope="module")
def quantized(tmp_path_factory, checkpoint):
    """``(name, scheme key, tp, lm_head) -> converted fp16 folder``, once per module."""
    root = tmp_path_factory.mktemp("quantized")
    cache: dict[tuple, Path] = {}

    def get(name: str, key: str, tp: int = 1, lm_head: bool = False) -> Path:
        if (name, key, tp, lm_head) not in cache:
            scheme = SCHEMES[key]
            if lm_head:
                scheme = QuantScheme(scheme.mode, scheme.group_size or None, scheme.asymmetric,
                                     lm_head=True)
            out = root / f"{name}-{key}-{lm_head}"
            cache[name, key, tp, lm_head] = convert(checkpoint(name), out, tp, "fp16",
                                                    weight_quant=scheme).output_dir
        return cache[name, key, tp, lm_head]

    return get


def _ini(folder: Path) -> dict[str, str]:
    parser = configparser.ConfigParser()
    parser.read(folder / "config.ini")
    return dict(parser["gpt"])


@pytest.mark.parametrize("key", list(SCHEMES))
def test_files_and_config(key, quantized):
    out = quantized("gpt2", key)
    ini = _ini(out)
    scheme = SCHEMES[key]
    assert ini["weight_quant"] == scheme.mode and ini["weight_data_type"] == "fp16"
    assert ini["quant_group_size"] == str(scheme.group_size)
    assert ini["quant_asymmetric"] == str(int(scheme.asymmetric))
    assert ini.get("int8_mode") == ("1" if key == "int8" else None)
    h, inter = 32, 96
    packed = 1 if key == "int8" else 2
    groups = {"int8": None, "int4": 16, "int4-asym": 16}[key]
    layer = out / "model.layers.1.mlp.dense_4h_to_h"
    assert (out / "model.layers.1.mlp.dense_4h_to_h.weight.0.bin").stat().st_size == \
        inter * h // packed
    # int8 scales of a row-parallel kernel: whole columns, one replicated file
    scale_file = Path(f"{layer}.weight_scale.bin" if key == "int8" else
                      f"{layer}.weight_scale.0.bin")
    expected_scale = h if groups is None else inter // groups * h
    assert scale_file.stat().st_size == 2 * expected_scale
    assert Path(f"{layer}.weight_zero.0.bin").exists() == scheme.asymmetric
    # embeddings, norms, biases and the head stay fp16
    assert (out / "model.wte.bin").stat().st_size == 96 * h * 2
    assert (out / "model.layers.0.input_layernorm.weight.bin").stat().st_size == h * 2
    assert not list(out.glob("model.lm_head*")) and not list(out.glob("model.wte_*"))
    config = read_config(out)
    assert config.quant == scheme
    stored = load_weights(out)
    assert stored["layers.0.attention.query_key_value.weight"].dtype == (
        torch.int8 if key == "int8" else torch.uint8)
    assert stored["layers.0.attention.query_key_value.weight_scale"].dtype == torch.float16


@pytest.mark.parametrize("key", list(SCHEMES))
def test_tp2_shards_concatenate_to_tp1(key, quantized):
    one = load_merged_weights(quantized("gpt2", key, 1), dequantize=False)[1]
    two_dir = quantized("gpt2", key, 2)
    config = read_config(two_dir)
    specs = stored_specs(config)
    assert set(specs) - set(one) <= {"lm_head.weight"}
    ranks = [load_weights(two_dir, r) for r in range(2)]
    for name, full in one.items():
        spec = specs[name]
        if spec.split_axis is None:
            for r in range(2):
                assert torch.equal(ranks[r][name], full), name
        else:
            assert torch.equal(torch.cat([s[name] for s in ranks], spec.split_axis), full), name
    # a row-parallel kernel's int8 scales are whole columns, replicated without a rank suffix
    replicated = (two_dir / "model.layers.0.attention.dense.weight_scale.bin").exists()
    assert replicated == (key == "int8")


def test_worker_processes_write_the_same_files(quantized, checkpoint, tmp_path):
    one = quantized("gptj", "int4-asym", 2)
    out = convert(checkpoint("gptj"), tmp_path, 2, "fp16", processes=2,
                  weight_quant=SCHEMES["int4-asym"]).output_dir
    names = sorted(p.name for p in one.iterdir())
    assert names == sorted(p.name for p in out.iterdir())
    for name in names:
        assert (one / name).read_bytes() == (out / name).read_bytes(), name


def test_head_quantized_when_asked(quantized, checkpoint):
    # gpt2 ties its head: asking for it writes a quantized copy of wte; gptj's own head [V, e]
    for name in ("gpt2", "gptj"):
        out = quantized(name, "int4", 1, lm_head=True)
        assert read_config(out).quant_lm_head
        stored = load_weights(out)
        assert stored["lm_head.weight"].shape == (96, 16)  # [V, e/2], packed along e
        assert stored["lm_head.weight_scale"].shape == (96, 2)  # [V, e/16]
        assert stored["wte"].dtype == torch.float16
        if name == "gptj":
            assert stored["lm_head.bias"].dtype == torch.float16
    out = quantized("gpt2", "int8", 2, lm_head=True)
    stored = load_weights(out, 1)
    assert stored["lm_head.weight"].dtype == torch.int8
    assert stored["lm_head.weight_scale"].shape == (96,)


# ----------------------------------------------------------------------------- the oracle
def _dequantized_by_hand(fp16_dir: Path, scheme: QuantScheme) -> tuple[GptConfig, dict]:
    """The fp16 folder's weights, each layer kernel quantized and dequantized with the quantizer
    directly (not through the loader), in fp32."""
    config, dense = load_merged_weights(fp16_dir)
    out = {}
    for name, w in dense.items():
        if any(f".{k}.weight" in name for k in KERNELS):
            q = quantize(w, scheme.mode, scheme.group_size, torch.float16, scheme.asymmetric)
            out[name] = dequantize(q)
        else:
            out[name] = w.float()
    return config, out


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("key", list(SCHEMES))
@pytest.mark.parametrize("name", ["gpt2", "gptj"])
def test_reference_is_the_dequantized_model(name, key, tp, quantized, converted, token_ids,
                                            hf_model):
    scheme = SCHEMES[key]
    logits = GptReference.from_dir(quantized(name, key, tp))(token_ids)
    config, weights = _dequantized_by_hand(converted(name, 1, "fp16"), scheme)
    oracle = GptReference(config, weights)(token_ids)
    torch.testing.assert_close(logits, oracle, rtol=1e-6, atol=1e-6)
    if tp == 2:
        return
    # What it costs, against the unquantized fp32 model on the same random weights.
    fp32 = GptReference.from_dir(converted(name, 1, "fp32"))
    exact = fp32(token_ids)
    ids = token_ids[:, :4]
    greedy_q = GptReference.from_dir(quantized(name, key, tp)).generate_greedy(ids, None, 6)[0]
    greedy = fp32.generate_greedy(ids, None, 6)[0]
    agree = float((greedy_q[:, 4:] == greedy[:, 4:]).float().mean())
    err = rel_err(logits, exact)
    print(f"\n{name} {key}: logits rel err {err:.4f} vs fp32, greedy agreement {agree:.2f}")
    assert err < {"int8": 0.05, "int4": 0.5, "int4-asym": 0.5}[key]


@pytest.mark.parametrize("key", ["int8", "int4-asym"])
def test_from_pretrained_quantizes_at_load(key, quantized, converted, token_ids):
    scheme = SCHEMES[key]
    ids = token_ids[:2, :6]
    request = "int8" if key == "int8" else scheme
    at_load = GPT.from_pretrained(converted("gptj", 1, "fp16"), dtype=torch.float32,
                                  backend="reference", weight_quant=request)
    assert at_load.config.quant == scheme
    from_folder = GPT.from_pretrained(quantized("gptj", key), dtype=torch.float32,
                                      backend="reference")
    assert from_folder.config.quant == scheme
    torch.testing.assert_close(at_load.logits(ids), from_folder.logits(ids), rtol=0, atol=0)
    same_mode = GPT.from_pretrained(quantized("gptj", key), dtype=torch.float32,
                                    backend="reference", weight_quant=scheme.mode)
    assert same_mode.config.quant == scheme
    out = at_load.generate(ids.tolist(), 4)
    assert out.tokens == from_folder.generate(ids.tolist(), 4).tokens


def test_head_at_load_matches_converted(quantized, converted, token_ids):
    scheme = QuantScheme("int4", 16, lm_head=True)
    at_load = GPT.from_pretrained(converted("gpt2", 1, "fp16"), dtype=torch.float32,
                                  backend="reference", weight_quant=scheme)
    folder = GPT.from_pretrained(quantized("gpt2", "int4", 1, lm_head=True),
                                 dtype=torch.float32, backend="reference")
    torch.testing.assert_close(at_load.logits(token_ids), folder.logits(token_ids), rtol=0,
                               atol=0)


def test_int8_mode_is_read(quantized, tmp_path):
    out = shutil.copytree(quantized("gpt2", "int8"), tmp_path / "1-gpu")
    text = (out / "config.ini").read_text()
    (out / "config.ini").write_text(re.sub(r"weight_quant = int8\n", "", text))
    assert read_config(out).weight_quant == "int8"  # FT's int8_mode = 1 alone
    (out / "config.ini").write_text(text.replace("int8_mode = 1", "int8_mode = 0"))
    with pytest.raises(ConfigError, match="int8_mode = 0 contradicts weight_quant = int8"):
        read_config(out)
    (out / "config.ini").write_text(text.replace("int8_mode = 1", "int8_mode = 2"))
    with pytest.raises(ConfigError, match="int8_mode = 2 .* not supported"):
        read_config(out)


# ----------------------------------------------------------------------------- bad requests
def test_converter_errors(checkpoint, tmp_path):
    src = checkpoint("gpt2")
    with pytest.raises(ConversionError, match="group size 128 does not divide the input width "
                                              "32 of layers.0.attention.query_key_value.weight"):
        convert(src, tmp_path / "a", 1, "fp16", weight_quant="int4")
    with pytest.raises(ConversionError, match=r"group size 32 does not divide the input width 16 "
                                              r"per rank \(32 / tensor_para_size 2\) of "
                                              r"layers.0.attention.dense.weight; a group must not "
                                              "straddle a rank boundary"):
        convert(src, tmp_path / "b", 2, "fp16", weight_quant=QuantScheme("int4", 32))
    with pytest.raises(ConversionError, match="needs --data-type fp16 or bf16 .* fp32 model is "
                                              "not supported"):
        convert(src, tmp_path / "c", 1, "fp32", weight_quant="int8")
    with pytest.raises(ConversionError, match="must be one of int8, int4, got 'int3'"):
        convert(src, tmp_path / "d", 1, "fp16", weight_quant="int3")
    with pytest.raises(ConfigError, match="quant_group_size .* applies to int4 only"):
        QuantScheme("int8", 64)
    with pytest.raises(ConfigError, match="even integer >= 2"):
        QuantScheme("int4", 15)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_converter_refuses_other_families(checkpoint, tmp_path, monkeypatch):
    import warpformer.converters as conv

    plan = conv.build_plan(checkpoint("gpt2"), 1, "fp16")
    monkeypatch.setattr(plan, "config", object())
    with pytest.raises(ConversionError, match="GPT family only; T5ForConditionalGeneration"):
        conv._quantize_plan(plan, "T5ForConditionalGeneration", QuantScheme("int8"), "fp16")


def test_cli(checkpoint, tmp_path, capsys):
    src = str(checkpoint("gpt2"))
    base = ["convert", "-i", src, "-o", str(tmp_path), "--no-progress"]
    with pytest.raises(SystemExit):
        main([*base, "--weight-quant", "int3"])
    assert "invalid choice: 'int3'" in capsys.readouterr().err
    assert main([*base, "--quant-group-size", "16"]) == 2
    assert "--quant-group-size needs --weight-quant" in capsys.readouterr().err
    assert main([*base, "-dt", "fp16", "--weight-quant", "int4"]) == 2
    assert "group size 128 does not divide" in capsys.readouterr().err
    assert main([*base, "-dt", "bf16", "--weight-quant", "int4", "--quant-group-size", "16",
                 "--quant-asymmetric", "--quant-lm-head", "-tp", "2"]) == 0
    config = read_config(tmp_path / "2-gpu")
    assert config.quant == QuantScheme("int4", 16, True, True)
    assert config.weight_data_type == "bf16"
    assert load_weights(tmp_path / "2-gpu", 1)["lm_head.weight_zero"].dtype == torch.uint8


def test_loader_errors(quantized, converted, tmp_path):
    fp16, int8 = converted("gpt2", 1, "fp16"), quantized("gpt2", "int8")
    with pytest.raises(ValueError, match=r"weight_quant='int4' but .* holds int8 \(per-channel\) "
                                         "weights"):
        GPT.from_pretrained(int8, backend="reference", weight_quant="int4")
    with pytest.raises(ValueError, match=r"holds int4 \(group 16\) weights"):
        GPT.from_pretrained(quantized("gpt2", "int4"), backend="reference",
                            weight_quant=QuantScheme("int4", 32))
    with pytest.raises(ValueError, match="quantizes at load on one GPU; for tensor or pipeline "
                                         "parallelism convert with warpformer convert"):
        GPT.from_pretrained(fp16, backend="cuda", weight_quant="int8", tensor_para_size=2)
    with pytest.raises(ValueError, match=r"a quantized lm_head \(quant_lm_head\) runs on the "
                                         "reference backend only"):
        GPT.from_pretrained(fp16, backend="cuda", weight_quant=QuantScheme("int8", lm_head=True))
    with pytest.raises(ValueError, match="weight-only int8 weights run in float16 or bfloat16 on "
                                         "the cuda backend, not float32"):
        GPT.from_pretrained(int8, backend="cuda", dtype=torch.float32)
    with pytest.raises(ValueError, match="quantizes an fp16 or bf16 folder .* holds fp32"):
        GPT.from_pretrained(converted("gpt2", 1, "fp32"), backend="reference", weight_quant="int8")
    with pytest.raises(ValueError, match="weight_quant must be one of int8, int4, got 'int2'"):
        GPT.from_pretrained(fp16, backend="reference", weight_quant="int2")
    with pytest.raises(ValueError, match="group size 128 does not divide the input width 32"):
        GPT.from_pretrained(fp16, backend="reference", weight_quant="int4")

    # a damaged folder: a missing scale file, a config asking for fp32 scales
    broken = shutil.copytree(int8, tmp_path / "1-gpu")
    (broken / "model.layers.0.mlp.dense_h_to_4h.weight_scale.0.bin").unlink()
    with pytest.raises(WeightFileError, match="weight_scale.0.bin .* 192 bytes expected"):
        load_weights(broken)
    text = (broken / "config.ini").read_text()
    (broken / "config.ini").write_text(text.replace("weight_data_type = fp16",
                                                    "weight_data_type = fp32"))
    with pytest.raises(ConfigError, match="needs weight_data_type fp16 or bf16"):
        read_config(broken)


def _engine_model(scheme: QuantScheme) -> tuple[GptConfig, dict[str, torch.Tensor]]:
    """A config the engine accepts (head size 32) and its stored tensors under `scheme`, on the
    CPU in fp16."""
    from warpformer.weight_quant import quantize_weights
    from warpformer.weights import weight_specs

    config = GptConfig(head_num=2, size_per_head=32, inter_size=256, num_layer=1, vocab_size=128,
                       max_pos_seq_len=64, weight_data_type="fp16")
    gen = torch.Generator().manual_seed(0)
    dense = {name: (torch.randn(spec.shape, generator=gen) * 0.02).half()
             for name, spec in weight_specs(config).items() if not spec.optional}
    return quantize_weights(config, dense, scheme)


def test_engine_checks_quantized_weights_before_the_device():
    """The engine's own checks, which need no GPU: every weight valid, then the device; fp32 and
    a quantized head refused; a kernel of the wrong kind named."""
    from warpformer.models.gpt import build_gpt_model

    for scheme in (QuantScheme("int8"), QuantScheme("int4", 32, True)):
        config, stored = _engine_model(scheme)
        assert stored["layers.0.attention.dense.weight"].dtype == (
            torch.int8 if scheme.mode == "int8" else torch.uint8)
        with pytest.raises(RuntimeError, match="weight 'wte' must be a CUDA tensor"):
            build_gpt_model(config, stored)
        with pytest.raises(RuntimeError, match=f"weight_quant = {scheme.mode} serves float16 and "
                                               "bfloat16 models; got dtype float32"):
            build_gpt_model(config, stored, dtype=torch.float32)
    config, stored = _engine_model(QuantScheme("int8"))
    name = "layers.0.mlp.dense_h_to_4h.weight"
    with pytest.raises(RuntimeError, match=f"weight '{name}' must be int8 \\(weight_quant = "
                                           "int8\\), got Float"):
        build_gpt_model(config, {**stored, name: stored[name].float()})
    with pytest.raises(RuntimeError, match="weight 'layers.0.mlp.dense_h_to_4h.weight_scale' "
                                           "must have shape"):
        build_gpt_model(config, {**stored, name + "_scale": stored[name + "_scale"][:-1]})
    head, stored = _engine_model(QuantScheme("int8", lm_head=True))
    with pytest.raises(RuntimeError, match="quant_lm_head: the engine runs the lm_head in the "
                                           "model's dtype"):
        build_gpt_model(head, stored)


def test_table_names_the_kernels():
    config = GptConfig(head_num=4, size_per_head=8, inter_size=96, num_layer=1, vocab_size=96,
                       max_pos_seq_len=32, weight_data_type="fp16")
    assert quantized_kernels(config) == {}
    q = config.with_quant(QuantScheme("int4", 16, lm_head=True))
    assert quantized_kernels(q) == {f"layers.0.{k}.weight": 0 for k in KERNELS} | {
        "lm_head.weight": 1}
    specs = stored_specs(q)
    assert specs["layers.0.attention.query_key_value.weight"].shape == (16, 3, 32)
    assert specs["layers.0.attention.query_key_value.weight_scale"].shape == (2, 3, 32)
    kernel = torch.randn(32, 3, 32)
    files = quantize_kernel(q, "layers.0.attention.query_key_value.weight", kernel, 0)
    assert {k: tuple(v.shape) for k, v in files.items()} == {
        "layers.0.attention.query_key_value.weight": (16, 3, 32),
        "layers.0.attention.query_key_value.weight_scale": (2, 3, 32)}
    assert np.prod(specs["lm_head.weight"].shape) == 96 * 16
