"""CPU tests of the end-to-end benchmark scripts (benchmarks/common.py, bench_generate.py,
bench_lambada.py, bench_parallel.py, bench_short.py): the model-shape table, the floor
arithmetic, derived metrics and speedups, table formatting, argument parsing, the engine options
each variant builds its engine with, the synthetic LAMBADA workload and the dry runs. Nothing here
needs a GPU; the timed paths run on the device machine."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
common = importlib.import_module("common")
bench_generate = importlib.import_module("bench_generate")
bench_lambada = importlib.import_module("bench_lambada")

SHAPES = common.SHAPES

# Parameter counts of the real checkpoints (HF's count, tied weights once).
KNOWN_PARAMS = {"gpt2-medium": 354_823_168, "bloom-560m": 559_214_592,
                "opt-1.3b": 1_315_758_080, "gpt-j-6b": 6_050_882_784, "opt-6.7b": 6_658_473_984,
                "llama-3-8b": 8_030_261_248}


# --------------------------------------------------------------------------- shapes
@pytest.mark.parametrize("name", list(KNOWN_PARAMS))
def test_param_counts_of_real_models(name):
    assert SHAPES[name].param_count() == KNOWN_PARAMS[name]


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("layers", [None, 2])
def test_shapes_build_the_hf_model_they_describe(name, layers):
    """hf_config(shape) instantiated on the meta device has exactly param_count() parameters."""
    pytest.importorskip("transformers")
    shape = SHAPES[name].with_layers(layers)
    with torch.device("meta"):
        model = common.hf_class(shape.family)(common.hf_config(shape))
    assert sum(p.numel() for p in model.parameters()) == shape.param_count()
    assert model.config.vocab_size == shape.vocab
    head = model.get_output_embeddings().weight
    assert (head is model.get_input_embeddings().weight) == shape.tied


def test_with_layers_and_derived_counts():
    gptj = SHAPES["gpt-j-6b"]
    assert gptj.with_layers(None) is gptj and gptj.with_layers(4).layers == 4
    h, i, v = gptj.hidden, gptj.inter, gptj.vocab
    assert gptj.gemm_params() == 28 * (4 * h * h + 2 * h * i) + v * h
    # untied head: wte is only gathered, lm_head is read in full
    assert gptj.decode_read_params() == gptj.param_count() - v * h
    gpt2 = SHAPES["gpt2-medium"]
    assert gpt2.decode_read_params() == gpt2.param_count() - 1024 * 1024  # minus wpe
    opt = SHAPES["opt-1.3b"]
    assert opt.decode_read_params() == opt.param_count() - 2050 * 2048  # 2 offset rows
    assert SHAPES["bloom-560m"].decode_read_params() == SHAPES["bloom-560m"].param_count()
    assert gpt2.kv_bytes_per_token() == 2 * 24 * 1024 * 2
    llama = SHAPES["llama-3-8b"]  # 8 K/V heads of 32: a quarter of the MHA cache per token
    mha = dataclasses.replace(llama, kv_heads=0)
    assert llama.kv_bytes_per_token() * 4 == mha.kv_bytes_per_token() == 2 * 32 * 4096 * 2
    assert llama.decode_read_params() == llama.param_count() - 128256 * 4096  # wte gathered


def test_parse_models():
    assert [s.name for s in common.parse_models("gpt-j-6b, bloom-560m")] == ["gpt-j-6b",
                                                                            "bloom-560m"]
    with pytest.raises(ValueError, match="unknown model.*gpt-3"):
        common.parse_models("gpt-3")
    with pytest.raises(ValueError):
        common.parse_models(" , ")


# --------------------------------------------------------------------------- floors
def test_mean_decode_context():
    # steps s = 1..out-1 attend in + s tokens
    n_in, n_out = 128, 128
    exact = sum(n_in + s for s in range(1, n_out)) / (n_out - 1)
    assert common.mean_decode_context(n_in, n_out) == pytest.approx(exact)
    assert common.mean_decode_context(512, 32) == 528


def test_decode_floor_arithmetic():
    s = common.ModelShape("toy", "bloom", 64, 4, 2, 256, 1000, 0)
    bw, comp, floor = common.decode_floor_ms(s, batch=4, context=100, copy_gbps=1000.0)
    nbytes = 2 * s.param_count() + 2 * 2 * 64 * 2 * 4 * 100
    assert bw == pytest.approx(nbytes / 1e12 * 1e3)
    assert comp == 0.0 and floor == bw
    bw2, comp2, floor2 = common.decode_floor_ms(s, 4, 100, 1000.0, gemm_tflops=1e-6)
    assert comp2 == pytest.approx(2 * s.gemm_params() * 4 / 1e6 * 1e3)
    assert floor2 == comp2 > bw2  # a slow enough GEMM rate makes the step compute-bound


def test_quantized_floor_and_option():
    """--weight-quant rows: the floor counts the layers' matrices at the format's bytes."""
    s = common.ModelShape("toy", "bloom", 64, 4, 2, 256, 1000, 0)
    dense, _, _ = common.decode_floor_ms(s, batch=1, context=10, copy_gbps=1000.0)
    for mode, per in bench_generate.QUANT_WEIGHT_BYTES.items():
        bw, _, _ = common.decode_floor_ms(s, 1, 10, 1000.0, layer_weight_bytes=per)
        saved = s.layers * s.layer_gemm_params() * (2 - per)
        assert bw == pytest.approx(dense - saved / 1e12 * 1e3), mode
    args = bench_generate.parse_args(["--weight-quant", "int8,int4", "--dry-run"])
    assert args.weight_quant == ["int8", "int4"]
    with pytest.raises(SystemExit):
        bench_generate.parse_args(["--weight-quant", "int3"])
    row = bench_generate.Row("toy", "warpformer-int4", 1, 10, 10)
    bench_generate.derive(row, s, 1000.0, None)
    assert row.floor_bw_ms == pytest.approx(common.decode_floor_ms(
        s, 1, common.mean_decode_context(10, 10), 1000.0,
        layer_weight_bytes=bench_generate.QUANT_WEIGHT_BYTES["int4"])[0])


def test_logits_rel_err_of_quantized_rows():
    """The --weight-quant rows' logits error: max deviation over the reference's range."""
    ref = torch.tensor([[1.0, -4.0, 2.0], [0.5, 0.0, 3.0]])
    ours = ref + torch.tensor([[0.0, 0.02, 0.0], [-0.04, 0.0, 0.0]])
    assert bench_generate.logits_rel_err(ours, ref) == pytest.approx(0.01)
    assert bench_generate.logits_rel_err(ref, ref) == 0.0
    assert bench_generate.Row("m", "warpformer-int8", 1, 128, 128).logits_rel_err is None
    assert bench_generate.LOGITS_CFG[0] >= 1


@pytest.mark.parametrize("name,design_ms", [("gpt2-medium", 0.165), ("bloom-560m", 0.26),
                                            ("opt-1.3b", 0.61), ("gpt-j-6b", 2.81)])
def test_floor_agrees_with_design_table(name, design_ms):
    """DESIGN.md's floors (weights / 4.3 TB/s, batch 1, 128/128) within 5%: ours also count
    the KV cache and leave out tables that are only gathered."""
    _, _, floor = common.decode_floor_ms(SHAPES[name], 1, common.mean_decode_context(128, 128),
                                         4300.0)
    assert floor == pytest.approx(design_ms, rel=0.05)


def test_gemm_flops():
    s = SHAPES["opt-6.7b"]
    assert common.decode_gemm_flops(s, 64) == 2 * s.gemm_params() * 64
    layers = 2 * 32 * s.layer_gemm_params() * 64 * 512
    assert common.prefill_gemm_flops(s, 64, 512) == layers + 2 * s.vocab * s.hidden * 64


# --------------------------------------------------------------------------- formatting, files
def test_md_table():
    text = common.md_table(["a", "b", "c"], [["x|y", 1, "m\nn"]], align="lrl")
    assert text.splitlines() == ["| a | b | c |", "|---|---:|---|", "| x\\|y | 1 | m n |"]
    assert common.md_table(["a", "b"], []).splitlines()[1] == "|---|---:|"
    with pytest.raises(ValueError, match="align"):
        common.md_table(["a", "b"], [], align="l")


def test_number_cells():
    assert common.fnum(None) == common.fnum(float("nan")) == common.fpct(None) == "—"
    assert common.fnum(1.23456, 3) == "1.235" and common.fpct(84.6) == "85%"
    assert common.fx(2.0) == "2.00x" and common.fx(math.inf) == "—"


def test_result_names_and_files(tmp_path):
    import datetime as dt

    assert common.slug("NVIDIA H200") == "nvidia-h200"
    assert common.slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    stem = common.result_stem("generate", "NVIDIA H200", dt.datetime(2026, 1, 5, 14, 32))
    assert stem == "generate_nvidia-h200_20260105-1432"
    j, m = common.write_results(tmp_path / "r", stem, {"x": 1, "p": Path("/a")}, "| t |")
    assert json.loads(j.read_text()) == {"x": 1, "p": "/a"}
    assert m.read_text() == "| t |\n" and not list((tmp_path / "r").glob("*.tmp"))


def test_short_error_and_budget():
    err = common.short_error(RuntimeError("CUDA out of memory. Tried\nmore"))
    assert err == "RuntimeError: CUDA out of memory. Tried"
    assert common.is_oom(RuntimeError("CUDA out of memory"))
    assert len(common.short_error(ValueError("x" * 500))) == 160
    assert common.Budget(0).allows(1e9) and not common.Budget(1).allows(10)


# --------------------------------------------------------------------------- bench_generate
def test_generate_args_defaults_and_quick():
    a = bench_generate.parse_args([])
    assert [s.name for s in a.shapes] == [n for n in SHAPES if n != "llama-3-8b"]
    assert [s.layers for s in a.shapes] == [24, 24, 24, 28, 32]
    assert a.batches == [1, 8, 64] and a.lengths == [(128, 128), (512, 32)]
    assert (a.repeats, a.hf_repeats, a.hf_compile, a.budget_s) == (5, 3, "target", 330.0)
    q = bench_generate.parse_args(["--quick", "--batches", "2", "--models", "opt-6.7b"])
    assert q.batches == [2] and q.layers == 4 and q.shapes[0].layers == 4
    assert q.shapes[0].hidden == 4096 and q.budget_s == 100.0
    assert bench_generate.parse_args(["--no-hf-compile"]).hf_compile == "none"
    b = bench_generate.parse_args(["--lengths", "64x16,32:4", "--layers", "3", "--budget-s", "0"])
    assert b.lengths == [(64, 16), (32, 4)] and b.shapes[-1].layers == 3 and b.budget_s == 0


@pytest.mark.parametrize("argv", [["--models", "gpt-3"], ["--lengths", "128"],
                                  ["--lengths", "128x1"], ["--batches", "0"],
                                  ["--batches", "a"], ["--layers", "0"], ["--repeats", "0"]])
def test_generate_args_rejected(argv):
    with pytest.raises(SystemExit):
        bench_generate.parse_args(argv)


def _warpformer_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith("WARPFORMER_")}


def test_variants_parsed_and_their_options(monkeypatch, tmp_path):
    """Each --wf-variants entry names the engine options its engine is built with (passed to
    build_gpt_model, not through the environment), and that engine is the one timed; variants of
    removed switches are refused with that reason."""
    from warpformer.options import EngineOptions

    a = bench_generate.parse_args(["--wf-variants", "graphs-off,prefill-512,tuned,tuned-warm"])
    assert a.wf_variants == ["graphs-off", "prefill-512", "tuned", "tuned-warm"]
    for bad in ("norms-only", "prefill-0", "prefill-x"):
        with pytest.raises(SystemExit):
            bench_generate.parse_args(["--wf-variants", bad])
    for gone in bench_generate.REMOVED_VARIANTS:
        with pytest.raises(argparse.ArgumentTypeError, match="the switch was removed"):
            bench_generate._variants(f"graphs-off,{gone}")
    assert bench_generate.variant_options("graphs-off") == {"cuda_graphs": False}
    assert bench_generate.variant_options("prefill-512") == {"prefill_tokens": 512}
    assert bench_generate.variant_options("") == bench_generate.variant_options("tuned") == {}
    import warpformer.models.gpt as gpt_models

    class Timed(Exception):
        pass

    built, timed = [], []
    env = _warpformer_env()

    def fake_build(config, weights, **kwargs):
        assert _warpformer_env() == env  # nothing set around the build
        built.append(kwargs)
        return f"engine-{len(built)}"

    def fake_time(engine, *args):
        timed.append(engine)
        raise Timed

    tuned = tmp_path / "tuned.tsv"
    monkeypatch.setattr(gpt_models, "build_gpt_model", fake_build)
    monkeypatch.setattr(bench_generate, "_time_warpformer", fake_time)
    monkeypatch.setattr(bench_generate, "tuning_file",
                        lambda config, cfg, out_dir, warm: (str(tuned) + ("-warm" * warm), 3))
    row = bench_generate.Row("gpt2-medium", "warpformer", 2, 8, 4)
    variants = ("graphs-off", "prefill-512", "tuned", "tuned-warm", "")
    for variant in variants:
        with pytest.raises(Timed):
            bench_generate.run_warpformer("weights", "config", SHAPES["gpt2-medium"], row, None,
                                          1, variant, tmp_path)
    assert [k["options"] for k in built] == [
        EngineOptions(cuda_graphs=False), EngineOptions(prefill_tokens=512),
        EngineOptions(gemm_config=str(tuned)), EngineOptions(gemm_config=f"{tuned}-warm"),
        EngineOptions()]
    assert all((k["max_batch"], k["max_seq_len"]) == (2, 12) for k in built)
    assert timed == [f"engine-{i}" for i in range(1, len(variants) + 1)]
    assert row.note == "tuned-warm: 3 shapes off the heuristic's first choice"
    assert _warpformer_env() == env


def test_configs_and_compiled_selection():
    a = bench_generate.parse_args(["--batches", "1,64"])
    assert bench_generate.configs(a) == [(1, 128, 128), (64, 128, 128), (1, 512, 32),
                                         (64, 512, 32)]
    assert [bench_generate.compiled_wanted(a, c) for c in bench_generate.configs(a)] == [
        True, False, False, False]
    a.hf_compile = "all"
    assert bench_generate.compiled_wanted(a, (64, 512, 32))
    assert bench_generate.compile_estimate_s(SHAPES["gpt2-medium"], []) > 0
    assert bench_generate.compile_estimate_s(SHAPES["gpt2-medium"], [12.0, 30.0]) == 30.0
    assert bench_generate.reserve_s([]) == 0


def _row(engine, total, prefill, batch=1, n_in=128, n_out=128, model="gpt2-medium"):
    return bench_generate.Row(model, engine, batch, n_in, n_out, prefill_ms=prefill,
                              total_ms=total)


def test_derive_and_speedups():
    shape = SHAPES["gpt2-medium"]
    wf, eager, comp = _row("warpformer", 35.4, 3.0), _row("hf-eager", 960.0, 22.0), _row(
        "hf-compiled", 280.0, 20.0)
    failed = _row("warpformer", None, None, batch=8)
    failed.error = "OutOfMemoryError: CUDA out of memory"
    wf.peak_gb, eager.peak_gb = 1.0, 2.0
    rows = [wf, eager, comp, failed]
    for r in rows:
        bench_generate.derive(r, shape, copy_gbps=4300.0, gemm_rate=700.0)
    bench_generate.speedups(rows)
    assert wf.decode_ms == pytest.approx((35.4 - 3.0) / 127)
    assert wf.tokens_per_s == pytest.approx(128 / 0.0354)
    assert wf.pct_floor == pytest.approx(100 * wf.floor_ms / wf.decode_ms)
    assert wf.floor_ms == wf.floor_bw_ms > wf.floor_compute_ms  # batch 1 is bandwidth-bound
    assert wf.speedup_vs_hf_eager == pytest.approx(960 / 35.4)
    assert wf.step_speedup_vs_hf_eager == pytest.approx(eager.decode_ms / wf.decode_ms)
    assert wf.speedup_vs_hf_compiled == pytest.approx(280 / 35.4)
    assert comp.speedup_vs_hf_eager == pytest.approx(960 / 280)
    assert comp.speedup_vs_hf_compiled is None and eager.speedup_vs_hf_eager is None
    assert wf.peak_vs_hf_eager == 0.5
    assert wf.prefill_tflops == pytest.approx(
        common.prefill_gemm_flops(shape, 1, 128) / 3e-3 / 1e12)
    assert failed.decode_ms is None and failed.floor_ms is not None

    doc, summary = bench_generate.report(rows, {shape.name: shape}, "## head")
    assert "27.12x (" in doc and "OutOfMemoryError" in doc
    lines = summary.splitlines()
    assert lines[0].startswith("| model | B | in/out | decode ms/step")
    assert "<= 0.26: met" in lines[2] and "| 1.00 (2.00) |" in lines[2]
    assert "OutOfMemoryError" in lines[3]
    # truncated models have no target verdict
    short = {shape.name: shape.with_layers(4)}
    assert "met" not in bench_generate.summary_table(rows, short)


def test_gemm_table_lists_batch_64():
    shape = SHAPES["gpt-j-6b"]
    r = _row("warpformer", 400.0, 250.0, batch=64, n_in=512, n_out=32, model=shape.name)
    bench_generate.derive(r, shape, 4300.0, 700.0)
    assert 0 < r.decode_gemm_ceiling_pct < 100  # decode at batch 64 is still bandwidth-bound
    assert r.prefill_pct_gemm == pytest.approx(100 * r.prefill_tflops / 700.0)
    table = bench_generate.gemm_table([r, _row("warpformer", 10.0, 1.0)])
    assert len(table.splitlines()) == 3 and "512/32" in table


def test_agreement_of_tokens():
    a = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    b = torch.tensor([[1, 2, 9, 4], [0, 6, 7, 8]])
    first, prefix = bench_generate.agreement(a, b)
    assert first == 50.0 and prefix == pytest.approx(100 * (2 / 4 + 0) / 2)


def test_generate_dry_run(capsys):
    assert bench_generate.main(["--dry-run", "--models", "gpt-j-6b", "--batches", "1"]) == 0
    out = capsys.readouterr().out
    assert "| gpt-j-6b | 28 | 6051 | 11689 | 1 | 128/128 | 2.739 |" in out
    assert "warpformer, hf-eager, hf-compiled" in out


# --------------------------------------------------------------------------- bench_lambada
def test_lambada_workload_shape():
    samples = bench_lambada.make_samples(5153, 250880, seed=0)
    batches = bench_lambada.make_batches(len(samples), 8)
    stats = bench_lambada.workload_stats(samples, batches)
    assert stats["samples"] == 5153 and stats["batches"] == 645 and len(batches[-1]) == 1
    assert 78 <= stats["context_mean"] <= 82 and 20 <= stats["context_std"] <= 35
    assert bench_lambada.CTX_MIN <= min(len(s.context) for s in samples)
    assert max(len(s.context) for s in samples) <= bench_lambada.CTX_MAX
    assert {s.target_len for s in samples} == {1, 2, 3}
    assert 1.3 <= stats["target_mean"] <= 1.5
    assert all(3 <= int(s.context.min()) and int(s.context.max()) < 250879 for s in samples)
    again = bench_lambada.make_samples(5153, 250880, seed=0)
    assert all((x.context == y.context).all() and x.target_len == y.target_len
               for x, y in zip(samples, again, strict=True))


def test_lambada_packing_and_agreement():
    samples = bench_lambada.make_samples(3, 1000, seed=1)
    idx = [0, 1, 2]
    lens = [len(samples[i].context) for i in idx]
    ids, lengths = bench_lambada.pack(samples, idx, left=False)
    assert ids.dtype == torch.int32 and lengths.tolist() == lens
    assert ids[0, : lens[0]].tolist() == samples[0].context.tolist()
    lids, mask = bench_lambada.pack(samples, idx, left=True, pad=3)
    S = max(lens)
    assert lids[1, S - lens[1]:].tolist() == samples[1].context.tolist()
    assert mask.sum(1).tolist() == lens and int(lids[1, 0]) in (3, int(samples[1].context[0]))
    agree = bench_lambada.agreement([[1, 2], [3]], [[1, 5], [3]])
    assert agree == {"token_pct": pytest.approx(200 / 3), "sample_exact_pct": 50.0,
                     "first_token_pct": 100.0}


def test_lambada_args_and_dry_run(capsys):
    a = bench_lambada.parse_args([])
    assert a.in_flight == (1, 2, 3)
    assert bench_lambada.parse_args(["--in-flight", "none"]).in_flight == ()
    assert bench_lambada.parse_args(["--in-flight", "1,4"]).in_flight == (1, 4)
    for bad in ("0", "2,x", ""):
        with pytest.raises(SystemExit):
            bench_lambada.parse_args(["--in-flight", bad])
    assert a.samples == 5153 and a.batch == 8 and a.shape.name == "bloom-560m"
    assert bench_lambada.parse_args(["--quick"]).samples == 1000
    with pytest.raises(SystemExit):
        bench_lambada.parse_args(["--samples", "0"])
    assert bench_lambada.main(["--dry-run", "--samples", "100"]) == 0
    assert "| 100 | 13 |" in capsys.readouterr().out
    assert a.ab_options is None


def test_lambada_ab_options_parsed_and_checked(capsys, tmp_path):
    """--ab-options NAME=VALUE[,...]: engine options for the second instance, each value parsed
    and checked by EngineOptions; a bad entry is refused naming --ab-options and the rule."""
    parse = bench_lambada.parse_args
    assert parse(["--ab-options", "cuda_graphs=False"]).ab_options == {"cuda_graphs": False}
    tuned = tmp_path / "tuned.tsv"
    tuned.write_text("")
    both = parse(["--ab-options", f"prefill_tokens=512, cuda_graphs=false,gemm_config={tuned}"])
    assert both.ab_options == {"prefill_tokens": 512, "cuda_graphs": False,
                               "gemm_config": str(tuned)}
    assert bench_lambada.ab_label(both.ab_options) == (
        "prefill_tokens=512,cuda_graphs=False,gemm_config=tuned.tsv")
    for bad, rule in [("cuda_graphs", "expected NAME=VALUE"), ("=0", "expected NAME=VALUE"),
                      ("prefill_tokens=", "expected NAME=VALUE"),
                      ("cuda_graphs=maybe", "cuda_graphs must be True or False"),
                      ("prefill_tokens=0", "prefill_tokens must be None or a number"),
                      ("prefill_tokens=-4", "prefill_tokens must be a number of tokens"),
                      ("peer_allreduce=False", "not an engine option this A/B can set"),
                      ("WARPFORMER_CUDA_GRAPHS=0", "not an engine option this A/B can set"),
                      ("cuda_graphs=True", "both sides would run alike"),
                      ("cuda_graphs=False,cuda_graphs=True", "given twice"),
                      (f"gemm_config={tmp_path / 'none.tsv'}", "gemm_config: no file")]:
        with pytest.raises(SystemExit):
            parse(["--ab-options", bad])
        err = capsys.readouterr().err
        assert "--ab-options" in err and rule in err, (bad, err)
    with pytest.raises(SystemExit):  # the environment A/B is gone
        parse(["--ab-env", "WARPFORMER_SHARED_GRAPHS=0"])


def test_lambada_ab_runs_a_second_instance(monkeypatch):
    """run_warpformer with ab_options: a second engine over the same weights built with those
    options, warmed, then the timed passes alternate between the instances (and each in-flight
    row runs again on the second), rows named after the options; nothing goes through the
    environment. Engines, GPT and the CUDA calls are stand-ins: the harness logic runs on the
    CPU."""
    import warpformer.gpt as gpt_api
    import warpformer.models.gpt as gpt_models
    import warpformer.weights as wf_weights
    from warpformer.options import EngineOptions

    class FakeEngine:
        def __init__(self, tag: int) -> None:
            self.tag, self.calls = tag, 0

        def generate(self, ids, lens, n, end_id):
            self.calls += 1
            b, s = ids.shape
            return torch.full((b, 1, s + n), self.tag, dtype=torch.int32), None

    class FakeGPT:
        def __init__(self, engine, *args) -> None:
            self.engine = engine

        def generate(self, lists, n, end_id):
            class Out:
                tokens = [[[self.engine.tag] * n] for _ in lists]
            return Out

    built, engines, weights = [], [], {"w": torch.zeros(1)}

    def fake_build(config, given, **kwargs):
        assert given is weights and config == "config"
        built.append(kwargs["options"])
        engines.append(FakeEngine(len(built)))
        return engines[-1]

    flights = []

    def fake_batches(gpt, lists, out_lens, end_id, n):
        flights.append((gpt.engine.tag, n))
        return 1.0, 0.5, [[[gpt.engine.tag] * k for _ in batch]
                          for batch, k in zip(lists, out_lens, strict=True)]

    env = _warpformer_env()
    monkeypatch.setattr(wf_weights, "load_weights", lambda *a, **k: weights)
    monkeypatch.setattr(wf_weights, "read_config", lambda d: "config")
    monkeypatch.setattr(gpt_models, "build_gpt_model", fake_build)
    monkeypatch.setattr(gpt_api, "GPT", FakeGPT)
    monkeypatch.setattr(bench_lambada, "_timed_batches", fake_batches)
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *a, **k: self)
    for name in ("synchronize", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, name, lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a, **k: 0)
    samples = bench_lambada.make_samples(10, 1000, seed=2)
    batches = bench_lambada.make_batches(len(samples), 4)
    res = bench_lambada.run_warpformer(Path("dir"), samples, batches, 4, 999, 1,
                                       {"cuda_graphs": False}, (2,))
    assert built == [EngineOptions(), EngineOptions(cuda_graphs=False)]
    assert list(res) == ["warpformer", "warpformer-api", "warpformer-again-1",
                         "warpformer-cuda_graphs=False-1", "warpformer-again-2",
                         "warpformer-cuda_graphs=False-2", "warpformer-in-flight-2",
                         "warpformer-in-flight-2-cuda_graphs=False"]

    def engine_of(name: str) -> set[int]:
        return {t for toks in res[name][2] for t in toks}

    for name in res:
        assert engine_of(name) == ({2} if "cuda_graphs=False" in name else {1}), name
    assert flights == [(1, 2), (2, 2)]
    # 3 batches, 1 warm-up batch a pass: the first instance's three class passes, and the
    # second's untimed pass before its two timed ones
    assert [e.calls for e in engines] == [3 * 4, 3 * 4]
    assert _warpformer_env() == env
    # without ab_options: one engine, no A/B rows
    built.clear()
    res = bench_lambada.run_warpformer(Path("dir"), samples, batches, 4, 999, 1, None, ())
    assert built == [EngineOptions()] and list(res) == ["warpformer", "warpformer-api"]


def test_run_ranks_reads_rank0_json_and_reports_failures(tmp_path):
    """The multi-GPU benchmarks' launcher (torchrun, multicast off): rank 0's JSON comes back
    and its file is removed; a failing rank gives torchrun's stderr tail. Runs on the CPU."""
    script = tmp_path / "ranks.py"
    script.write_text(
        "import json, os, sys\n"
        "if sys.argv[1] == 'fail':\n"
        "    sys.exit('rank failed on purpose')\n"
        "if os.environ['RANK'] == '0':\n"
        "    json.dump({'world': int(os.environ['WORLD_SIZE']),\n"
        "               'nvls': os.environ['NCCL_NVLS_ENABLE'],\n"
        "               'extra': os.environ.get('EXTRA')}, open(sys.argv[2], 'w'))\n")
    result = tmp_path / "out.json"
    res = common.run_ranks(2, str(script), ["ok", str(result)], result, timeout=120,
                           env={"EXTRA": "x"})
    assert res == {"world": 2, "nvls": "0", "extra": "x"} and not result.exists()
    bad = common.run_ranks(1, str(script), ["fail", str(result)], result, timeout=120)
    assert "ChildFailedError" in bad["error"]  # torchrun's report of the failed rank


def test_parallel_grids_and_variants(tmp_path):
    """bench_parallel's --grids: TPxPP with a comparison variant, an engine option its ranks
    build the model with (passed as worker arguments, not environment); malformed entries and
    the removed switches' variants are refused with the rule."""
    from warpformer.options import EngineOptions

    bench_parallel = importlib.import_module("bench_parallel")
    assert bench_parallel.parse_grids("1x1,2x1-nccl,1x2") == [
        (1, 1, "auto"), (2, 1, "nccl"), (1, 2, "auto")]
    assert bench_parallel.VARIANTS["nccl"][0] == {"peer_allreduce": False}
    args = argparse.Namespace(batches=[1, 64], input_len=128, output_len=64)
    for variant, options in (("nccl", EngineOptions(peer_allreduce=False)),
                             ("auto", EngineOptions())):
        argv = bench_parallel.worker_argv(tmp_path / "2-gpu", 2, 1, variant, args,
                                          tmp_path / "r.json", 50399)
        assert argv[:7] == ["--worker", "--model-dir", str(tmp_path / "2-gpu"), "--tp", "2",
                            "--pp", "1"]
        assert argv[argv.index("--batches") + 1] == "1,64"
        assert bench_parallel.worker_options(argv[argv.index("--options") + 1]) == options
    for bad, rule in [("2", "not TPxPP"), ("0x1", "positive"), ("2x1-fast", "unknown variant"),
                      ("1x2-whole", "the switch was removed"),
                      ("2x1-parallel-off", "the switch was removed"),
                      ("2x1-early-off", "the switch was removed")]:
        with pytest.raises(SystemExit, match=rule):
            bench_parallel.parse_grids(bad)


# --------------------------------------------------------------------------- bench_short.py
def test_short_args_and_table():
    """bench_short: argument checks, and the table's derived columns (graphs - eager, and the
    graphs' ms per token after the first) from given timings."""
    bench_short = importlib.import_module("bench_short")
    a = bench_short.parse_args(["--outputs", "1,3", "--batch", "2"])
    assert a.outputs == [1, 3] and a.batch == 2 and a.model == "bloom-560m"
    for bad in (["--outputs", "0,2"], ["--outputs", "a"], ["--batch", "0"], ["--model", "x"]):
        with pytest.raises(SystemExit):
            bench_short.parse_args(bad)
    ms = {"eager": {1: 4.0, 3: 7.0}, "graphs": {1: 3.5, 3: 6.0}}
    lines = bench_short.table([1, 3], ms, {1: (2.0, 300), 3: (3.25, 700)}).splitlines()
    assert lines[0].startswith("| new tokens | eager ms | graphs ms | graphs - eager |")
    assert lines[2] == "| 1 | 4.000 | 3.500 | -0.500 | — | 2.000 | 300 |"
    assert lines[3] == "| 3 | 7.000 | 6.000 | -1.000 | 1.250 | 3.250 | 700 |"
    partial = bench_short.table([3], {"eager": {3: 4.0}, "graphs": {}}, {})
    assert partial.splitlines()[2] == "| 3 | 4.000 | — | — | — | — | — |"


def test_short_engines_per_setting(monkeypatch):
    """bench_short times each setting on its own instance over the same weights: eager is built
    with cuda_graphs=False, graphs with the default."""
    import warpformer.models.gpt as gpt_models
    from warpformer.options import EngineOptions

    bench_short = importlib.import_module("bench_short")
    weights = {"w": torch.zeros(1)}

    def fake_build(config, given, **kwargs):
        assert given is weights
        return kwargs

    monkeypatch.setattr(gpt_models, "build_gpt_model", fake_build)
    made = bench_short.engines("config", weights, 8, 96)
    assert list(made) == list(bench_short.SETTINGS) == ["eager", "graphs"]
    assert made["eager"]["options"] == EngineOptions(cuda_graphs=False)
    assert made["graphs"]["options"] == EngineOptions()
    assert all((k["max_batch"], k["max_seq_len"]) == (8, 96) for k in made.values())
