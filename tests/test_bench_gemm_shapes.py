"""CPU tests of benchmarks/bench_gemm_shapes.py: the products a prompt pass runs (mirroring the
engine's groups and layers), the per-pass sums and percentages, and its argument rules. The timing
itself runs on the device machine."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
common = importlib.import_module("common")
bench = importlib.import_module("bench_gemm_shapes")


def test_cases_parse_and_reject() -> None:
    assert bench.parse_cases("64x128, 8X80") == [bench.Case(64, 128), bench.Case(8, 80)]
    assert bench.Case(8, 80).label == "8x80"
    for bad in ("64", "0x128", "64x", "ax8", "8x80x2", "-1x4"):
        with pytest.raises(ValueError, match="BATCHxLENGTH"):
            bench.parse_cases(bad)


def test_prompt_products_follow_the_engine_groups(monkeypatch) -> None:
    # The engine's removed switches no longer shape its products (the GELU always rides on
    # cuBLASLt's epilogue in 16-bit types, a one-group pass always runs as a prompt graph).
    for name in ("WARPFORMER_FUSE", "WARPFORMER_PROMPT_GRAPHS"):
        monkeypatch.setenv(name, "0")
    shape = common.SHAPES["gpt2-medium"]
    groups, products = bench.prompt_products(shape, bench.Case(64, 128), 2048)
    assert groups == [2048] * 4
    assert {s.epilogue for s, _ in products if s.n == 4096} == {"bias_gelu_tanh"}
    layer = [(s.m, s.n, s.k, n) for s, n in products if s.what.startswith("context")
             and not s.what.endswith("lm_head")]
    # Four products per layer per group, each counted once per layer.
    assert len(layer) == 16 and all(n == shape.layers and m == 2048 for m, _, _, n in layer)
    assert {(n_, k) for _, n_, k, _ in layer} == {(3072, 1024), (1024, 1024), (4096, 1024),
                                                   (1024, 4096)}
    head = [(s, n) for s, n in products if s.what.endswith("lm_head")]
    assert len(head) == 1 and head[0][1] == 1
    # The engine's head runs at the vocabulary padded to a multiple of 8 (50,257 -> 50,264).
    assert (head[0][0].m, head[0][0].n, head[0][0].transposed) == (64, 50264, True)
    # With the lm_head on cuBLASLt the sums stand for bench_generate's prompt flops (which count
    # the 50,257 real columns alone: 7 more columns of 64 rows differ by 2e-7).
    assert bench.products_flops(products) == pytest.approx(
        common.prefill_gemm_flops(shape, 64, 128), rel=1e-6)
    # One 8192-token group; an 8 x 80 prompt is one group of 640 whatever the size, and its
    # 8-row lm_head runs on the engine's GEMV, so it is not among the cuBLASLt products.
    assert bench.prompt_products(shape, bench.Case(64, 128), 8192)[0] == [8192]
    groups, small = bench.prompt_products(shape, bench.Case(8, 80), 2048)
    assert groups == [640] and not [s for s, _ in small if s.what.endswith("lm_head")]
    # 8 x 81 = 648 tokens run padded to 704 (a multiple of 64): the prompt graph's count.
    assert bench.prompt_products(shape, bench.Case(8, 81), 2048)[0] == [704]
    assert len(small) == 4
    _, nine = bench.prompt_products(shape, bench.Case(9, 80), 2048)
    assert [s.m for s, _ in nine if s.what.endswith("lm_head")] == [9]
    gptj = bench.model_dims(common.SHAPES["gpt-j-6b"])
    assert gptj.parallel_residual and gptj.lm_head_bias
    assert bench.model_dims(common.SHAPES["opt-1.3b"]).activation == "relu"


def test_pass_sums_and_percent() -> None:
    shape = common.SHAPES["bloom-560m"]
    _, products = bench.prompt_products(shape, bench.Case(8, 80), 2048)
    times = {s.key(): (10.0, 8.0) for s, _ in products}
    heur, best = bench.pass_ms(products, times)
    calls = sum(n for _, n in products)
    assert calls == 4 * shape.layers  # the 8-row lm_head is the GEMV's
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
