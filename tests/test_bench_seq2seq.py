"""CPU tests of benchmarks/bench_seq2seq.py (issue 51's encoder-decoder benchmark): the T5 shapes
and their parameter counts, HF's initialisation rules, the decoder step's floor arithmetic and the
per-step formula, the budget rules, argument parsing, the tables and the targets' verdicts, and a
smoke run of its main on the reference backend (warpformer's plain-PyTorch engine and HF on the
CPU, a tiny T5). The timed run on the engine is on the device machine."""

from __future__ import annotations

import importlib
import json
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
bench = importlib.import_module("bench_seq2seq")
hf = importlib.import_module("seq2seq_hf")
s2s = importlib.import_module("seq2seq_common")

SHAPES = s2s.SHAPES
# HF's parameter counts of the real checkpoints (tied head once).
KNOWN_PARAMS = {"t5-base": 222_903_552, "t5-3b": 2_851_598_336}


# --------------------------------------------------------------------------- shapes, init
@pytest.mark.parametrize("name", list(KNOWN_PARAMS))
def test_param_counts_of_real_models(name):
    assert SHAPES[name].param_count() == KNOWN_PARAMS[name]


def _meta_model(shape):
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        return transformers.T5ForConditionalGeneration(hf.hf_config(shape))


@pytest.mark.parametrize("name", list(SHAPES))
def test_shapes_build_the_hf_model_they_describe(name):
    shape = SHAPES[name]
    model = _meta_model(shape)
    assert sum(p.numel() for p in model.parameters()) == shape.param_count()
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # tied
    cfg = model.config
    assert (cfg.d_model, cfg.d_kv, cfg.d_ff, cfg.num_heads, cfg.vocab_size) == (
        shape.d_model, shape.d_kv, shape.d_ff, shape.heads, shape.vocab)
    assert (cfg.num_layers, cfg.num_decoder_layers) == (shape.layers, shape.decoder_layers)
    assert cfg.feed_forward_proj == "relu" and cfg.decoder_start_token_id == 0


def test_init_std_is_hfs_and_covers_every_parameter():
    shape = SHAPES["t5-base"]
    d, dkv, h, ff = 768, 64, 12, 3072
    stds = {n: hf.init_std(n, shape) for n, _ in _meta_model(shape).named_parameters()}
    assert stds["shared.weight"] == 1.0
    assert stds["encoder.final_layer_norm.weight"] is None
    assert stds["decoder.block.3.layer.1.layer_norm.weight"] is None
    assert stds["encoder.block.0.layer.0.SelfAttention.q.weight"] == (d * dkv) ** -0.5
    assert stds["decoder.block.5.layer.1.EncDecAttention.k.weight"] == d ** -0.5
    assert stds["decoder.block.5.layer.1.EncDecAttention.v.weight"] == d ** -0.5
    assert stds["decoder.block.5.layer.0.SelfAttention.o.weight"] == (h * dkv) ** -0.5
    assert stds["decoder.block.2.layer.2.DenseReluDense.wi.weight"] == d ** -0.5
    assert stds["encoder.block.2.layer.1.DenseReluDense.wo.weight"] == ff ** -0.5
    assert stds["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] == \
        d ** -0.5
    with pytest.raises(ValueError, match="no initialisation rule"):
        hf.init_std("encoder.block.0.mystery.weight", shape)


def test_random_weights_are_reproducible_and_pin_the_end_token():
    pytest.importorskip("transformers")
    shape = SHAPES["t5-tiny"]
    a = hf.build_hf(shape, torch.float32, "cpu", seed=3)
    b = hf.build_hf(shape, torch.float32, "cpu", seed=3)
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert na == nb and torch.equal(pa, pb), na
    emb = a.get_input_embeddings().weight
    assert a.get_output_embeddings().weight is emb
    assert not emb[shape.vocab - 1].any() and emb[:-1].std() == pytest.approx(1.0, rel=0.1)
    assert float(a.encoder.final_layer_norm.weight.min()) == 1.0
    c = hf.build_hf(shape, torch.float16, "cpu", seed=4)
    assert {p.dtype for p in c.parameters()} == {torch.float16}
    assert not torch.equal(c.shared.weight.float(), emb)


# --------------------------------------------------------------------------- arithmetic
def test_decoder_step_floor_of_t5_3b():
    s = SHAPES["t5-3b"]
    d, inner, ff, L, V = 1024, 4096, 16384, 24, 32128
    # per decoder layer: self q, k, v, o + cross q, o (cross k, v run once) + FFN + 3 norms
    weights = 2 * (L * (6 * d * inner + 2 * d * ff + 3 * d) + V * d + d)
    cross = 2 * L * 2 * 1 * 128 * inner  # one copy per input row
    self_kv = 2 * L * 2 * 1 * 33 * inner  # steps 2..64 attend 33 tokens on average
    nbytes = s2s.step_bytes(s, 1, 1, 128, 64)
    assert nbytes == weights + cross + self_kv == 2_947_827_712
    assert s2s.floor_ms(nbytes, 4800.0) == pytest.approx(nbytes / 4.8e12 * 1e3)
    assert s2s.floor_ms(nbytes, 4800.0) == pytest.approx(0.6141, abs=1e-4)
    assert s2s.floor_ms(nbytes, None) is None and s2s.floor_ms(nbytes, 0.0) is None
    # beams add self K/V only: the cross K/V are shared by a row's beams
    beam4 = s2s.step_bytes(s, 1, 4, 128, 64)
    assert beam4 - nbytes == 3 * self_kv
    assert s2s.step_bytes(s, 8, 1, 128, 64) - nbytes == 7 * (cross + self_kv)
    assert s2s.step_bytes(s, 1, 1, 128, 64, dtype_bytes=4) == 2 * nbytes


def test_mean_step_context_and_per_step_formula():
    out = 64
    assert s2s.mean_step_context(out) == pytest.approx(sum(range(2, out + 1)) / (out - 1))
    assert s2s.per_step_ms(70.0, 7.0, 64) == pytest.approx(1.0)  # (64-token - 1-token) / 63
    assert s2s.per_step_ms(None, 7.0, 64) is None and s2s.per_step_ms(7.0, None, 64) is None
    assert s2s.per_step_ms(7.0, 1.0, 1) is None
    t = s2s.Timing(ms=70.0, one_ms=7.0)
    assert t.step_ms(64) == pytest.approx(1.0)
    assert s2s.pct(0.8, 1.0) == pytest.approx(80.0) and s2s.pct(None, 1.0) is None
    assert s2s.pct(0.8, 0.0) is None
    assert s2s.ratio(20.0, 2.0) == 10.0 and s2s.ratio(None, 2.0) is None
    assert s2s.ratio(1.0, 0.0) is None


def test_derive_fills_the_floors():
    s = SHAPES["t5-3b"]
    row = s2s.Row("t5-3b", 1, 1, 128, 64, wf=s2s.Timing(ms=64.0, one_ms=1.0))
    s2s.derive(row, s, 4000.0, 4800.0, 2)
    assert row.step_bytes == s2s.step_bytes(s, 1, 1, 128, 64)
    assert row.floor_ms == pytest.approx(row.step_bytes / 4e12 * 1e3)
    assert row.floor_spec_ms == pytest.approx(row.step_bytes / 4.8e12 * 1e3)
    assert row.wf_step_ms == pytest.approx(1.0)
    assert row.pct_floor == pytest.approx(100 * row.floor_ms)
    s2s.derive(row, s, None, 4800.0, 2)
    assert row.floor_ms is None and row.pct_floor is None and row.pct_floor_spec is not None


def test_agreement():
    a = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    b = torch.tensor([[1, 2, 0, 4], [0, 6, 7, 8]])
    first, prefix = s2s.agreement(a, b)
    assert first == 50.0 and prefix == pytest.approx(25.0)  # row 0: 2 of 4, row 1: 0
    assert s2s.agreement(a, a) == (100.0, 100.0)


# --------------------------------------------------------------------------- arguments, budget
def test_arguments_defaults():
    a = bench.parse_args([])
    assert [s.name for s in a.shapes] == ["t5-base", "t5-3b"]
    assert a.batches == [1, 8, 32] and a.beams == [1, 4]
    assert (a.input_len, a.output_len, a.dtype) == (128, 64, "fp16")
    assert (a.repeats, a.warmup, a.hf_repeats, a.budget_s) == (3, 2, 2, 370.0)
    assert a.spec_gbps == s2s.SPEC_GBPS == 4800.0
    assert a.max_seq_len == 128 and not a.skip_hf and not a.skip_hf_compiled
    assert len(s2s.make_rows(a)) == 12
    b = bench.parse_args(["--models", "t5-3b", "--batches", "2", "--beams", "3",
                          "--input-len", "16", "--output-len", "40", "--skip-hf-compiled",
                          "--dtype", "bf16", "--budget-s", "0"])
    assert [r.key for r in s2s.make_rows(b)] == [("t5-3b", 2, 3)]
    assert b.max_seq_len == 41 and b.skip_hf_compiled and b.dtype == "bf16"
    assert bench.parse_args(["--backend", "reference", "--models", "t5-tiny"]).dtype == "fp32"


@pytest.mark.parametrize("argv", [["--models", "t5-11b"], ["--models", ""], ["--batches", "0"],
                                  ["--beams", "17"], ["--output-len", "1"], ["--repeats", "0"],
                                  ["--warmup", "-1"], ["--input-len", "2,3"],
                                  ["--dtype", "int8"], ["--hf-row-cap-s", "0"]])
def test_arguments_rejected(argv):
    with pytest.raises(SystemExit):
        bench.parse_args(argv)


def test_budget_rules():
    a = bench.parse_args([])
    assert hf.hf_reps(1, 4, a) == 2 and hf.hf_reps(32, 4, a) == 1  # 128 sequences: once
    assert hf.hf_reps(32, 1, a) == 2
    rows = s2s.make_rows(a)
    order = hf.compiled_order([r for r in rows if r.model == "t5-base"])
    assert [(r.batch, r.beam) for r in order] == [(1, 1), (1, 4), (8, 1), (8, 4), (32, 1),
                                                   (32, 4)]
    assert hf.share_deadline(100.0, 370.0, 2) == pytest.approx(235.0)
    assert hf.share_deadline(100.0, 370.0, 1) == pytest.approx(370.0)
    assert hf.share_deadline(400.0, 370.0, 2) == pytest.approx(400.0)  # over: nothing left
    assert math.isinf(hf.share_deadline(100.0, 0.0, 2))
    base, big = SHAPES["t5-base"], SHAPES["t5-3b"]
    assert 0 < hf.eager_call_guess_s(base, 64, 1) < hf.eager_call_guess_s(big, 64, 4)
    assert hf.compile_guess_s(base) < hf.compile_guess_s(big) < 120


def test_time_calls_warmup_setup_and_cap():
    calls, setups = [], []
    samples, out = s2s.time_calls(lambda: calls.append(1) or len(calls), reps=3, cuda=False,
                                    warmup=2, setup=lambda: setups.append(1))
    assert len(samples) == 3 and out == 5 and len(calls) == 5 and len(setups) == 5
    assert all(ms >= 0 for ms in samples)
    ticks = iter(range(0, 1000, 10))  # each clock read advances 10 s
    samples, _ = s2s.time_calls(lambda: None, reps=5, cuda=False, cap_s=15.0,
                                  clock=lambda: next(ticks))
    assert len(samples) == 2  # 10 s after the first call, 20 s after the second: stop
    samples, _ = s2s.time_calls(lambda: None, reps=3, cuda=False, cap_s=1e-9)
    assert len(samples) == 1  # at least one timed call


def test_wf_options_and_full_length():
    o = bench.wf_options(4, 32127)
    assert set(o) == {"beam_width", "end_id"} and int(o["beam_width"]) == 4
    assert int(o["end_id"]) == 32127
    assert int(bench.wf_options(1, 9, 64)["min_length"]) == 64
    full = {"sequence_lengths": torch.full((2, 4), 65, dtype=torch.int32)}
    assert bench.full_length(full, 64)
    full["sequence_lengths"][1, 3] = 30
    assert not bench.full_length(full, 64)


# --------------------------------------------------------------------------- tables, targets
def _rows() -> list:
    T, R = s2s.Timing, s2s.Row
    rows = [
        R("t5-base", 1, 4, 128, 64, wf=T(ms=10.0, one_ms=1.0, peak_gb=0.6),
          hf_eager=T(ms=250.0, one_ms=12.0, peak_gb=0.7),
          hf_compiled=T(ms=40.0, peak_gb=0.9, compiled=True, first_call_s=30.0,
                        note="static cache (reset between calls)")),
        R("t5-base", 32, 4, 128, 64, wf=T(ms=50.0, one_ms=5.0),
          hf_eager=T(ms=300.0, one_ms=20.0), hf_compiled=T(ms=45.0, compiled=True)),
        R("t5-base", 8, 1, 128, 64, wf=T(ms=8.0, one_ms=1.0),
          hf_eager=T(skipped="time budget"), hf_compiled=T(error="RuntimeError: boom")),
        R("t5-3b", 1, 1, 128, 64, wf=T(ms=64.0, one_ms=1.0), hf_eager=T(ms=900.0, one_ms=30.0),
          hf_compiled=T(skipped="time budget")),
    ]
    for r in rows:
        s2s.derive(r, SHAPES[r.model], 4200.0, 4800.0, 2)
    rows[0].agree_first_pct, rows[0].agree_prefix_pct = 100.0, 87.5
    return rows


def test_main_table_cells():
    lines = s2s.main_table(_rows()).splitlines()
    assert lines[0] == "| " + " | ".join(s2s.HEADERS) + " |"
    cells = [line.strip("| ").split(" | ") for line in lines[2:]]
    assert cells[0][:8] == ["t5-base", "1", "4", "10.00", "250.00", "40.00", "25.00x", "4.00x"]
    assert cells[0][8:11] == ["1.00", "0.143", "3.78"]  # encode + 1 step, (10-1)/63, (250-12)/63
    assert cells[0][11] == "0.60 / 0.70 / 0.90" and cells[0][12] == "100% / 88%"
    assert cells[2][3:8] == ["8.00", "skipped", "n/a", "—", "—"]
    assert cells[3][5] == "skipped" and cells[3][12] == "—"


def test_step_table_and_notes():
    rows = _rows()
    lines = s2s.step_table(rows).splitlines()
    assert lines[0] == "| " + " | ".join(s2s.STEP_HEADERS) + " |"
    big = lines[2 + 3].strip("| ").split(" | ")
    step = 63.0 / 63
    floor = s2s.step_bytes(SHAPES["t5-3b"], 1, 1, 128, 64) / 4.2e12 * 1e3
    assert big[:4] == ["t5-3b", "1", "1", "1.000"] and big[4] == "2947.8"
    assert big[5] == f"{floor:.3f}" and big[6] == f"{100 * floor / step:.0f}%"
    notes = s2s.notes(rows)
    assert "- t5-base B=8 beam 1, HF compiled: n/a: RuntimeError: boom" in notes
    assert "- t5-base B=8 beam 1, HF eager: skipped: time budget" in notes
    assert any("compile + first call 30 s" in n for n in notes)


def test_targets_met_and_missed():
    rows = _rows()
    t = {r[0]: r for r in s2s.evaluate_targets(rows, "fp16")}
    eager = t["t5-base fp16 B=1 beam 4: >= 20x HF eager"]
    assert eager[1].startswith("25.0x") and eager[2] == "met"
    compiled = t["faster than HF compiled in every row"]
    assert compiled[1].startswith("1 of 2 measured rows faster; 2 rows without")
    assert compiled[2].startswith("missed: t5-base B=32 beam 4 (0.90x)")
    floor = t["t5-3b B=1 beam 1 decoder step >= 80% of its bandwidth floor"]
    assert floor[1].startswith("1.000 ms/step") and floor[2] == "missed (copy BW), missed (spec BW)"
    rows[3].wf.ms = 1.0 + 63 * 0.7  # 0.7 ms/step: above 80% of both floors (0.70 and 0.61 ms)
    rows[1].hf_compiled.ms = 60.0
    rows[0].hf_eager.ms = 150.0
    t = {r[0]: r for r in s2s.evaluate_targets(rows, "bf16")}
    assert t["t5-base fp16 B=1 beam 4: >= 20x HF eager"][2].startswith("missed (run in bf16")
    assert t["faster than HF compiled in every row"][2] == \
        "met where measured (2 rows not measured)"
    assert t["t5-3b B=1 beam 1 decoder step >= 80% of its bandwidth floor"][2] == \
        "met (copy BW), met (spec BW)"
    assert s2s.evaluate_targets([], "fp16") == []


def test_report_document():
    rows = _rows()
    args = bench.parse_args([])
    env = {"date": "2026-01-01T00:00:00", "torch": "2.x", "transformers": "5.x", "commit": "abc"}
    head = s2s.header(args, "NVIDIA H200", env, 4200.0, "python benchmarks/bench_seq2seq.py")
    doc = s2s.report(rows, head, "fp16")
    for part in ("## Encoder-decoder generation on NVIDIA H200", "copy bandwidth 4200 GB/s",
                 "### Calls (encode + all decoder steps)", "### Issue 51 targets",
                 "### Decoder step against its bandwidth floor (warpformer)", "### Notes"):
        assert part in doc, part


def test_dry_run(capsys):
    assert bench.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "| t5-3b | 2852 | 1 | 1 | 2947.8 | 0.614 |" in out
    assert "engines: warpformer, HF eager, HF compiled" in out


# --------------------------------------------------------------------------- smoke run
def test_reference_smoke_run(tmp_path, capsys):
    """The whole run on the CPU: build, save, convert, warpformer's reference engine, HF eager
    and HF's static-cache path (not compiled on the CPU); every row runs every token, and the
    reference engine's tokens equal HF's (fp32, greedy and beam)."""
    pytest.importorskip("transformers")
    rc = bench.main(["--backend", "reference", "--models", "t5-tiny", "--batches", "1,2",
                     "--beams", "1,2", "--input-len", "8", "--output-len", "4", "--repeats",
                     "1", "--warmup", "0", "--hf-repeats", "1", "--out-dir", str(tmp_path),
                     "--work-dir", str(tmp_path / "work")])
    out = capsys.readouterr().out
    assert rc == 0
    (md,) = tmp_path.glob("seq2seq_cpu_*.md")
    (js,) = tmp_path.glob("seq2seq_cpu_*.json")
    head = "| " + " | ".join(s2s.HEADERS) + " |"
    assert head in out and head in md.read_text()
    payload = json.loads(js.read_text())
    assert payload["benchmark"] == "seq2seq" and payload["copy_gbps"] is None
    rows = payload["rows"]
    assert [(r["batch"], r["beam"]) for r in rows] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    for r in rows:
        for engine in ("wf", "hf_eager", "hf_compiled"):
            t = r[engine]
            assert t["ms"] > 0 and t["full_length"] is True and t["error"] is None, (engine, r)
        assert r["wf"]["one_ms"] > 0 and r["wf_step_ms"] is not None
        assert r["hf_compiled"]["compiled"] is False  # HF compiles on CUDA only
        assert r["agree_first_pct"] == 100.0 and r["agree_prefix_pct"] == 100.0
        assert r["speedup_eager"] > 0
    assert payload["models"]["t5-tiny"]["fingerprint"]
    assert not (tmp_path / "work" / "t5-tiny-converted").exists()  # scratch removed


def test_scratch_folder_choice(tmp_path):
    need = hf.scratch_need_bytes([SHAPES["t5-base"], SHAPES["t5-3b"]], "fp16")
    assert need == pytest.approx(2.2 * 2 * KNOWN_PARAMS["t5-3b"] + (1 << 30))
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    space = {a: 5e9, b: 20e9, c: 30e9}

    def free(p):
        if p not in space:
            raise OSError("missing")
        return space[p]

    assert hf.pick_scratch_base([a, b, c], need, free) == b  # the first with room
    assert hf.pick_scratch_base([tmp_path / "x", a], need, free) == a  # else the roomiest
    with pytest.raises(RuntimeError, match="usable"):
        hf.pick_scratch_base([tmp_path / "x"], need, free)


def test_engine_branch_loads_converted_weights_and_builds_per_batch(tmp_path, monkeypatch):
    """The engine backend's warpformer phase (run here on the CPU with the reference engine
    standing in for torch.classes.warpformer.Seq2SeqModel): the converted folder's config and
    weights go to build_seq2seq_model with max_batch = the row's batch and max_seq_len = max(in,
    1 + out); every row runs its full length; the converted folder is removed afterwards."""
    pytest.importorskip("transformers")
    import warpformer.seq2seq as seq2seq
    from warpformer.reference_seq2seq import Seq2SeqReference, Seq2SeqReferenceEngine

    built = []

    def fake_build(config, weights, *, dtype, max_batch, max_seq_len, options=None):
        built.append((dtype, max_batch, max_seq_len, sorted(weights)[:1]))
        return Seq2SeqReferenceEngine(Seq2SeqReference(config, weights), max_batch, max_seq_len)

    monkeypatch.setattr(seq2seq, "build_seq2seq_model", fake_build)
    args = bench.parse_args(["--models", "t5-tiny", "--batches", "1,3", "--beams", "1,2",
                             "--input-len", "6", "--output-len", "3", "--repeats", "1",
                             "--warmup", "0", "--dtype", "fp32"])
    assert args.backend == "engine"
    rows = s2s.make_rows(args)
    models, tokens = {}, {}
    bench.wf_phase(SHAPES["t5-tiny"], rows, args, tmp_path, False, "cpu", models, tokens)
    assert [b[:3] for b in built] == [(torch.float32, 1, 6), (torch.float32, 3, 6)]
    for r in rows:
        assert r.wf.error is None and r.wf.full_length and r.wf.ms > 0 and r.wf.one_ms > 0, r
        assert tokens[r.key].shape == (r.batch, 3)
    assert {"fingerprint", "build_s", "convert_s", "load_s"} <= set(models["t5-tiny"])
    assert list(tmp_path.iterdir()) == []
