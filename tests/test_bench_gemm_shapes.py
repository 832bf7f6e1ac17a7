"""CPU tests of benchmarks/bench_gemm_shapes.py: the engine config of a benchmark model, how a
prompt pass's planned shapes become counted products (on plan lists of the kind the engine
reports; tests/gpu/test_gemm_tune_engine.py feeds it real ones), the per-pass sums and
percentages, the result tables, and its argument rules. The engine and the timing themselves
run on the device machine."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest
import torch

import warpformer  # noqa: F401  (the engine's weight table)
from warpformer.gemm_tune import GemmShape

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
common = importlib.import_module("common")
bench = importlib.import_module("bench_gemm_shapes")


def test_cases_parse_and_reject() -> None:
    assert bench.parse_cases("64x128, 8X80") == [bench.Case(64, 128), bench.Case(8, 80)]
    assert bench.Case(8, 80).label == "8x80"
    for bad in ("64", "0x128", "64x", "ax8", "8x80x2", "-1x4"):
        with pytest.raises(ValueError, match="BATCHxLENGTH"):
            bench.parse_cases(bad)


def test_model_shapes_as_the_engine_config() -> None:
    """Each benchmark model as the converters configure it (what decides its products)."""
    c = bench.gpt_config(common.SHAPES["gpt2-medium"])
    assert (c.hidden_size, c.inter_size, c.vocab_size, c.num_layer, c.tensor_para_size) == \
        (1024, 4096, 50257, 24, 1)
    assert (c.activation_type, c.parallel_residual, c.has_lm_head_bias) == \
        ("gelu_tanh", False, False)
    c = bench.gpt_config(common.SHAPES["gpt-j-6b"])
    assert (c.hidden_size, c.inter_size, c.num_layer, c.parallel_residual, c.has_lm_head_bias) \
        == (4096, 16384, 28, True, True)
    c = bench.gpt_config(common.SHAPES["opt-1.3b"])
    assert (c.activation_type, c.word_embed_proj_dim) == ("relu", 0)
    assert bench.gpt_config(common.SHAPES["bloom-560m"]).vocab_size == 250880


def _layer(m: int, h: int = 1024, inter: int = 4096) -> list[GemmShape]:
    """A GPT-2-style layer's four products at m rows, as gemm_plan_shapes() lists them."""
    return [GemmShape(m, 3 * h, h, what="prompt"), GemmShape(m, h, h, what="prompt"),
            GemmShape(m, inter, h, epilogue="bias_gelu_tanh", what="prompt"),
            GemmShape(m, h, inter, what="prompt")]


def test_pass_products_count_layers_and_groups() -> None:
    shape = common.SHAPES["gpt2-medium"]
    config = bench.gpt_config(shape)
    head = GemmShape(64, 50264, 1024, True, what="prompt")
    # 64 x 128 tokens in groups of 2,048: one m, four groups.
    groups, products = bench.pass_products([head, *_layer(2048)], config, bench.Case(64, 128))
    assert groups == [2048] * 4
    counted = {(s.what, s.m, s.n, s.k): n for s, n in products}
    assert counted == {("attention.query_key_value", 2048, 3072, 1024): 4 * 24,
                       ("attention.dense", 2048, 1024, 1024): 4 * 24,
                       ("mlp.dense_h_to_4h", 2048, 4096, 1024): 4 * 24,
                       ("mlp.dense_4h_to_h", 2048, 1024, 4096): 4 * 24,
                       ("lm_head", 64, 50264, 1024): 1}
    assert [s.what for s, _ in products][0] == "attention.query_key_value"
    assert products[-1][0].what == "lm_head" and products[-1][0].key() == head.key()
    # With the lm_head on cuBLASLt the sums stand for bench_generate's prompt flops (which count
    # the 50,257 real columns alone: 7 more columns of 64 rows differ by 2e-7).
    assert bench.products_flops(products) == pytest.approx(
        common.prefill_gemm_flops(shape, 64, 128), rel=1e-6)
    # 8 x 300 tokens in groups of 1,000: two of 900 and the last, 600.
    groups, products = bench.pass_products(_layer(900) + _layer(600), config, bench.Case(8, 300))
    assert groups == [900, 900, 600]
    assert {(s.m, n) for s, n in products} == {(900, 2 * 24), (600, 24)}
    # One group: 8 x 81 = 648 tokens replayed as a prompt graph at 704 rows (its 8-row lm_head
    # on the GEMV is not planned); 8192 tokens at once.
    groups, products = bench.pass_products(_layer(704), config, bench.Case(8, 81))
    assert groups == [704] and [n for _, n in products] == [24] * 4
    assert bench.pass_products(_layer(8192), config, bench.Case(64, 128))[0] == [8192]
    assert bench.pass_products([], config, bench.Case(1, 8)) == ([], [])  # all on the GEMV


def test_pass_products_refuse_what_they_cannot_count() -> None:
    config = bench.gpt_config(common.SHAPES["gpt2-medium"])
    with pytest.raises(SystemExit, match="8192 prompt tokens are not groups of the planned row "
                                         r"counts \[3000\]"):
        bench.pass_products(_layer(3000), config, bench.Case(64, 128))
    with pytest.raises(SystemExit, match="not groups"):
        bench.pass_products(_layer(3000) + _layer(2000) + _layer(1000), config,
                            bench.Case(64, 128))
    with pytest.raises(SystemExit, match="neither a layer's product nor the lm_head"):
        bench.pass_products(_layer(2048) + [GemmShape(2048, 512, 1024)], config,
                            bench.Case(64, 128))
    square = bench.gpt_config(common.ModelShape("square", "gpt2", 1024, 16, 2, 1024, 1000, 64))
    with pytest.raises(SystemExit, match="two of a layer's weights have one shape"):
        bench.pass_products(_layer(2048, inter=1024), square, bench.Case(64, 128))


def test_pass_sums_and_percent() -> None:
    config = bench.gpt_config(common.SHAPES["bloom-560m"])
    _, products = bench.pass_products(_layer(640), config, bench.Case(8, 80))
    times = {s.key(): (10.0, 8.0) for s, _ in products}
    heur, best = bench.pass_ms(products, times)
    calls = sum(n for _, n in products)
    assert calls == 4 * 24
    assert heur == pytest.approx(calls * 10.0 / 1e3)
    assert best == pytest.approx(calls * 8.0 / 1e3)
    # 1 TFLOP in 2 ms at a 1000 TFLOP/s rate: 50%.
    assert bench.pct_of_rate(1e12, 2.0, 1000.0) == pytest.approx(50.0)


def test_arguments(capsys) -> None:
    args = bench.parse_args(["--models", "gpt2-medium", "--cases", "64x128", "--groups", "4096"])
    assert [s.name for s in args.shapes] == ["gpt2-medium"]
    assert args.case_list == [bench.Case(64, 128)] and args.groups == [4096]
    for argv, msg in ((["--models", "gpt5"], "unknown model"),
                      (["--cases", "64"], "BATCHxLENGTH"),
                      (["--max-algos", "65"], "--max-algos must be in"),
                      (["--reps", "0"], "--reps must be in"),
                      (["--groups", "0"], "positive integers")):
        with pytest.raises(SystemExit):
            bench.parse_args(argv)
        assert msg in capsys.readouterr().err


def test_main_times_the_prompt_products(monkeypatch, tmp_path, capsys) -> None:
    """The wiring, without a GPU: the engine's prompt shapes for each group size (its
    generation shapes left out) are timed once each, summed per pass with their counts, and
    written as the two tables and the JSON record."""
    collected, timed = [], []
    head = GemmShape(64, 50264, 1024, True, what="prompt")

    def collect(config, batch, beam, length, *, prefill_tokens):
        collected.append((config.num_layer, batch, beam, length, prefill_tokens))
        # 64 x 128 tokens: groups of 2,048, or one of 8,192
        return [*_layer(prefill_tokens), head, GemmShape(64, 3072, 1024, what="generation")]

    def tune(shapes, dtype, max_algos, reps):
        timed.extend(s.key() for s in shapes)
        return [(s, 1, 8.0, 10.0) for s in shapes]

    monkeypatch.setattr(bench, "collect_shapes", collect)
    monkeypatch.setattr(bench, "tune", tune)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(common, "gpu_name", lambda: "Test GPU")
    monkeypatch.setattr(common, "gemm_tflops", lambda: 1000.0)
    assert bench.main(["--models", "gpt2-medium", "--cases", "64x128", "--groups", "2048,8192",
                       "--out-dir", str(tmp_path)]) == 0
    assert collected == [(24, 64, 1, 128, 2048), (24, 64, 1, 128, 8192)]
    assert len(timed) == len(set(timed)) == 9  # four layer products at 2048 and 8192, the head
    out = capsys.readouterr().out
    assert "## Prompt-pass products alone (Test GPU, fp16 GEMM rate 1000 TFLOP/s)" in out
    assert "| gpt2-medium | 64x128 | 2048 | 4 | 3.85 | 3.08 |" in out
    assert "| gpt2-medium | 64x128 | 8192 | 1 | 0.97 | 0.78 |" in out
    assert "| gpt2-medium | mlp.dense_h_to_4h | 2048 | 4096 | 1024 | bias_gelu_tanh | 10.00 |" \
        in out
    assert "| gpt2-medium | lm_head | 64 | 50264 | 1024 | none |" in out
    passes = json.loads(next(tmp_path.glob("gemm_shapes_*.json")).read_text())["passes"]
    assert [(p["group_tokens"], p["groups"]) for p in passes] == [(2048, [2048] * 4),
                                                                  (8192, [8192])]
    assert passes[0]["products_ms_heuristic"] == pytest.approx((4 * 24 * 4 + 1) * 10.0 / 1e3)
    assert passes[1]["products_ms_best"] == pytest.approx((24 * 4 + 1) * 8.0 / 1e3)
