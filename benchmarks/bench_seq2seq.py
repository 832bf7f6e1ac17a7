"""Encoder-decoder benchmark (issue 51): warpformer's T5 engine against HF transformers (eager,
and static cache + compiled forward) and against the decoder step's bandwidth floor, on the same
random weights and inputs, in one run.

Models: random-init ``T5ForConditionalGeneration`` of the t5-base shape (d_model 768, d_kv 64,
d_ff 3072, 12 + 12 layers, 12 heads) and the t5-3b shape (d_model 1024, d_kv 128, d_ff 16384,
24 + 24 layers, 32 heads); vocabulary 32128, ReLU FFN, tied head (rescaled by d_model ** -0.5).
Built from ``transformers.T5Config`` (no download) in ``--dtype``, drawn with HF's own
``_init_weights`` standard deviations (embedding 1, q (d_model d_kv) ** -0.5, k and v
d_model ** -0.5, o (heads d_kv) ** -0.5, wi d_model ** -0.5, wo d_ff ** -0.5, relative bias
d_model ** -0.5, norm gains 1: activations stay O(1) in fp16), seeded per parameter; the
embedding row of the last token (``vocab - 1``) is zeroed so that its logit is 0 where the others
spread about N(0, 1): it is never chosen, and it is the end id warpformer is given. Every row
therefore generates exactly ``--output-len`` tokens on both sides: warpformer with that end id
(checked after the first call: a shorter output is retimed with ``min_length`` and flagged), HF
with end-of-sequence disabled and ``min_new_tokens = max_new_tokens``. The HF model is saved with
``save_pretrained`` into a scratch folder and converted with ``warpformer.converters.convert``
(written to disk, as a user would), then loaded into ``torch.classes.warpformer.Seq2SeqModel``.

Rows: model x ``--batches`` x ``--beams``, ``--input-len`` encoder tokens, ``--output-len``
generated. Columns: ms per call (encode + all decoder steps; the median of ``--repeats`` calls
after ``--warmup``, CUDA events around the call) for warpformer, HF eager and HF compiled, the
speedups, warpformer's encode + first step (a 1-token call) and decoder ms/step ((full call -
1-token call) / (output_len - 1)), HF eager's ms/step the same way, and the peak GPU memory of
each (torch.cuda.max_memory_allocated, reset before the timed calls; weights included; HF
compiled's also holds the CUDA-graph pools of the same model's earlier rows).

Decoder-step floor, per warpformer row: the bytes a step must read (every decoder layer's
weights but the cross-attention K/V projections, which run once on the encoder output; the final
norm and the lm_head; the cached cross K/V of the ``--input-len`` encoder tokens, one copy per
input row as the engine holds it; the decoder's self K/V at the mean length of the timed steps
2..out) over the device-to-device copy bandwidth measured in this run (the convention of
bench_generate.py), and over the H200's 4.8 TB/s specification (``--spec-gbps``).

Order: phase 1, for each model: build, save, convert, warpformer rows (never skipped); phase 2:
HF eager rows of every model; phase 3: HF compiled rows (one model at a time; each model gets an
equal share of what is left of ``--budget-s``, in the order batch 1 beam 1, batch 1 beam 4,
...). The HF model is rebuilt from the seed for phases 2 and 3 (bit-identical; fingerprints are
recorded). HF work that would overrun ``--budget-s`` is skipped and recorded; an HF
configuration that raises is recorded as n/a with the exception's first line, and the run goes
on. Results: ``seq2seq_<gpu>_<time>.{json,md}`` in ``--out-dir``, rewritten after every phase
and HF row (a run stopped early leaves valid files); the markdown is printed last (stdout;
progress lines go to stderr).

    python benchmarks/bench_seq2seq.py                    # ~6-7 min on an H200 (see --budget-s)
    python benchmarks/bench_seq2seq.py --dry-run          # the plan and the floors, no GPU
    python benchmarks/bench_seq2seq.py --backend reference --models t5-tiny --batches 1,2 \\
        --beams 1,2 --input-len 8 --output-len 4         # CPU smoke run (plain-PyTorch engine)
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from seq2seq_common import (  # noqa: E402
    DEFAULT_MODELS,
    DTYPES,
    MAX_BEAM,
    SHAPES,
    SPEC_GBPS,
    Peak,
    Row,
    T5Shape,
    derive,
    evaluate_targets,
    fail,
    floor_ms,
    header,
    inputs,
    make_rows,
    notes,
    report,
    step_bytes,
    time_calls,
)
from seq2seq_hf import (  # noqa: E402
    build_hf,
    compiled_phase,
    convert_model,
    eager_phase,
    pick_scratch_base,
    scratch_need_bytes,
)


# --------------------------------------------------------------------------- arguments
def _models(text: str) -> list[T5Shape]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in SHAPES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown model(s) {', '.join(bad) or '(none)'}; "
                                         f"choose from {', '.join(SHAPES)}")
    return [SHAPES[n] for n in dict.fromkeys(names)]


def _one_positive(text: str) -> int:
    vals = common.positive_ints(text)
    if len(vals) != 1:
        raise argparse.ArgumentTypeError(f"expected one integer >= 1, got {text!r}")
    return vals[0]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Encoder-decoder benchmark (issue 51): warpformer's "
                                 "T5 engine against HF eager and HF static cache + compiled, "
                                 "and the decoder step's bandwidth floor")
    ap.add_argument("--models", type=_models, default=[SHAPES[n] for n in DEFAULT_MODELS],
                    help=f"comma list of {', '.join(SHAPES)} (default {','.join(DEFAULT_MODELS)};"
                         " t5-tiny is for CPU smoke runs)")
    ap.add_argument("--batches", type=common.positive_ints, default=[1, 8, 32],
                    help="batch sizes (input rows), default 1,8,32")
    ap.add_argument("--beams", type=common.positive_ints, default=[1, 4],
                    help=f"beam widths, 1..{MAX_BEAM} (default 1,4)")
    ap.add_argument("--input-len", type=_one_positive, default=128, help="encoder tokens")
    ap.add_argument("--output-len", type=_one_positive, default=64,
                    help="generated tokens, >= 2 (default 64)")
    ap.add_argument("--dtype", choices=tuple(DTYPES), default="fp16",
                    help="weights and compute of both engines (default fp16)")
    ap.add_argument("--repeats", type=_one_positive, default=3,
                    help="timed warpformer calls per configuration (default 3)")
    ap.add_argument("--warmup", type=int, default=2,
                    help="untimed warpformer calls first (default 2: the engine captures its "
                         "CUDA graphs on a shape's first calls)")
    ap.add_argument("--hf-repeats", type=_one_positive, default=2,
                    help="timed HF calls per configuration (default 2)")
    ap.add_argument("--hf-once-rows", type=_one_positive, default=128,
                    help="HF configurations of at least this many sequences (batch x beam) are "
                         "timed once (default 128: batch 32 beam 4)")
    ap.add_argument("--hf-row-cap-s", type=float, default=30.0,
                    help="stop repeating an HF configuration's timed calls once they took this "
                         "long (default 30 s; at least one call is timed)")
    ap.add_argument("--skip-hf", action="store_true", help="warpformer only")
    ap.add_argument("--skip-hf-compiled", action="store_true", help="no HF compiled rows")
    ap.add_argument("--budget-s", type=float, default=370.0,
                    help="wall-clock budget of the run: HF work that would overrun it is "
                         "skipped and recorded (default 370; 0 = unlimited). warpformer's rows "
                         "always run")
    ap.add_argument("--spec-gbps", type=float, default=SPEC_GBPS,
                    help="the second floor's bandwidth (default 4800 GB/s: H200 specification)")
    ap.add_argument("--backend", choices=("engine", "reference"), default="engine",
                    help="reference: warpformer's plain-PyTorch engine and HF on the CPU, fp32 "
                         "(a smoke run; use --models t5-tiny)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work-dir", type=Path, default=None,
                    help="scratch folder for the HF checkpoint and its conversion (default: a "
                         "temporary folder; removed at the end)")
    ap.add_argument("--out-dir", type=Path, default=common.DEFAULT_RESULTS_DIR,
                    help="JSON + markdown results go here (default benchmarks/results)")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the plan and the floors at --spec-gbps; touch no GPU")
    args = ap.parse_args(argv)
    if args.warmup < 0:
        ap.error("--warmup must be >= 0")
    if args.output_len < 2:
        ap.error("--output-len must be >= 2 (the per-step time needs two calls' difference)")
    if max(args.beams) > MAX_BEAM:
        ap.error(f"--beams: at most {MAX_BEAM} (the engine's largest beam width)")
    if args.hf_row_cap_s <= 0:
        ap.error("--hf-row-cap-s must be > 0")
    for s in args.models:
        if 2 * max(args.beams) > s.vocab:
            ap.error(f"--beams: {s.name}'s vocabulary ({s.vocab}) is too small for beam "
                     f"{max(args.beams)}")
    if args.backend == "reference":
        args.dtype = "fp32"  # the reference computes in fp32; HF runs on the CPU in fp32
    args.shapes = list(args.models)
    args.max_seq_len = max(args.input_len, 1 + args.output_len)
    return args




# --------------------------------------------------------------------------- warpformer
def wf_options(beam: int, end_id: int, min_length: int = 0) -> dict[str, torch.Tensor]:
    """The engine's decode options: beam width, the never-generated end id, and ``min_length``
    only when it must hold the end id off."""
    opts = {"beam_width": torch.tensor(beam), "end_id": torch.tensor(end_id)}
    if min_length:
        opts["min_length"] = torch.tensor(min_length)
    return opts


def full_length(out: dict[str, torch.Tensor], output_len: int) -> bool:
    """Every sequence (every beam) holds the start token and ``output_len`` generated ones."""
    return bool((out["sequence_lengths"] == 1 + output_len).all())


def run_wf(engine: Any, row: Row, shape: T5Shape, args: argparse.Namespace, cuda: bool,
           device: str) -> torch.Tensor:
    """Fills ``row.wf``; returns the best beam's generated tokens [B, out] (CPU)."""
    n, t = row.output_len, row.wf
    ids, lengths, _ = inputs(shape, row.batch, row.input_len, args.seed, device)
    end = shape.vocab - 1
    opts = wf_options(row.beam, end)
    one_opts = wf_options(row.beam, end)
    out = engine.decode(ids, lengths, n, opts)
    if not full_length(out, n):
        t.note = "end id generated: timed with min_length = output_len"
        opts = wf_options(row.beam, end, n)
        one_opts = wf_options(row.beam, end, 1)
    peak = Peak(cuda)
    peak.start()  # the engine's buffers, allocated by the first call, count (still allocated)
    samples, out = time_calls(lambda: engine.decode(ids, lengths, n, opts), reps=args.repeats,
                              cuda=cuda, warmup=args.warmup)
    t.samples_ms, t.ms = samples, common.median(samples)
    t.full_length = full_length(out, n)
    if not t.full_length:
        t.note = (t.note + "; " if t.note else "") + "SHORT OUTPUT: timings not comparable"
    t.peak_gb = peak.gb()
    one, _ = time_calls(lambda: engine.decode(ids, lengths, 1, one_opts), reps=args.repeats,
                        cuda=cuda, warmup=1)
    t.one_samples_ms, t.one_ms = one, common.median(one)
    return out["output_ids"][:, 0, 1:].cpu()


def wf_phase(shape: T5Shape, rows: list[Row], args: argparse.Namespace, scratch: Path,
             cuda: bool, device: str, models: dict[str, Any],
             tokens: dict[tuple[str, int, int], torch.Tensor]) -> None:
    """Build, save and convert ``shape``; time every warpformer row of it."""
    from warpformer.t5_weights import load_t5_weights, read_t5_config

    dtype = DTYPES[args.dtype]
    info = models.setdefault(shape.name, {})
    t0 = time.monotonic()
    hf = build_hf(shape, dtype, device, args.seed)
    info["fingerprint"] = common.fingerprint(hf)
    info["hf_attn"] = getattr(hf.config, "_attn_implementation", None)
    info["build_s"] = time.monotonic() - t0
    common.log(f"[{shape.name}] built ({shape.param_count() / 1e6:.0f}M params) in "
               f"{info['build_s']:.1f} s; saving and converting")
    t0 = time.monotonic()
    try:
        conv = convert_model(hf, shape, args.dtype, scratch)
    finally:
        del hf
        common.free_gpu()
    info["convert_s"] = time.monotonic() - t0
    common.log(f"[{shape.name}] saved and converted in {info['convert_s']:.1f} s")
    weights = config = None
    try:
        if args.backend == "engine":
            t0 = time.monotonic()
            config = read_t5_config(conv)
            weights = load_t5_weights(conv, 0, dtype=dtype, device=device)
            info["load_s"] = time.monotonic() - t0
        for batch in args.batches:
            mine = [r for r in rows if r.batch == batch]
            engine = None
            try:
                engine = make_engine(args, conv, config, weights, dtype, batch)
                for row in mine:
                    try:
                        tokens[row.key] = run_wf(engine, row, shape, args, cuda, device)
                        common.log(f"[{shape.name}] warpformer B={batch} beam {row.beam}: "
                                   f"{row.wf.ms:.2f} ms, encode + 1 step {row.wf.one_ms:.2f} ms")
                    except Exception as exc:  # noqa: BLE001 - recorded; the next row runs
                        fail(row.wf, exc, f"[{shape.name}] warpformer B={batch} beam {row.beam}")
            except Exception as exc:  # noqa: BLE001 - the engine did not build
                for row in mine:
                    if row.wf.ms is None and row.wf.error is None:
                        fail(row.wf, exc, f"[{shape.name}] warpformer B={batch} engine")
            del engine
            common.free_gpu()
    finally:
        del weights
        common.free_gpu()
        shutil.rmtree(conv.parent, ignore_errors=True)


def make_engine(args: argparse.Namespace, conv: Path, config: Any, weights: Any,
                dtype: torch.dtype, batch: int) -> Any:
    """``torch.classes.warpformer.Seq2SeqModel`` (or the reference engine) for ``batch`` rows."""
    if args.backend == "engine":
        from warpformer.seq2seq import build_seq2seq_model

        return build_seq2seq_model(config, weights, dtype=dtype, max_batch=batch,
                                   max_seq_len=args.max_seq_len)
    from warpformer.seq2seq import Seq2Seq

    return Seq2Seq.from_pretrained(conv, backend="reference", max_batch=batch,
                                   max_seq_len=args.max_seq_len).engine


# --------------------------------------------------------------------------- driver
def dry_run(args: argparse.Namespace) -> int:
    dtype_bytes = torch.empty((), dtype=DTYPES[args.dtype]).element_size()
    body = []
    for s in args.shapes:
        for b in args.batches:
            for k in args.beams:
                nbytes = step_bytes(s, b, k, args.input_len, args.output_len, dtype_bytes)
                body.append([s.name, f"{s.param_count() / 1e6:.0f}", b, k,
                             f"{nbytes / 1e6:.1f}",
                             common.fnum(floor_ms(nbytes, args.spec_gbps), 3)])
    print(f"## Plan (dry run; floors at {args.spec_gbps:.0f} GB/s)\n")
    print(common.md_table(["model", "params M", "B", "beam", "MB read/step", "floor ms/step"],
                          body))
    engines = ["warpformer"] + ([] if args.skip_hf else ["HF eager"]) + (
        [] if args.skip_hf or args.skip_hf_compiled else ["HF compiled"])
    print(f"\nengines: {', '.join(engines)}; {args.input_len} in / {args.output_len} out; "
          f"budget {args.budget_s:.0f} s; results: {args.out_dir}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        return dry_run(args)
    cuda = args.backend == "engine"
    if cuda and not torch.cuda.is_available():
        print("bench_seq2seq: no CUDA device visible; use --dry-run, or --backend reference "
              "--models t5-tiny for a CPU smoke run", file=sys.stderr)
        return 2
    device = "cuda" if cuda else "cpu"
    import warpformer  # noqa: F401  (loads the extension)

    if cuda:
        try:
            torch.classes.warpformer.Seq2SeqModel  # noqa: B018 - present in this build?
        except (RuntimeError, AttributeError):
            print("bench_seq2seq: this warpformer build has no Seq2SeqModel; rebuild it",
                  file=sys.stderr)
            return 2
    import transformers

    transformers.logging.set_verbosity_error()
    if hasattr(transformers.logging, "disable_progress_bar"):
        transformers.logging.disable_progress_bar()
    for name in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 32)
    budget = common.Budget(args.budget_s)
    env = common.env_info()
    device_name = common.gpu_name() if cuda else "cpu"
    copy_gbps = None
    if cuda:
        try:
            copy_gbps = common.copy_bandwidth_gbps()
            common.log(f"{device_name}: copy bandwidth {copy_gbps:.0f} GB/s")
        except Exception as exc:  # noqa: BLE001 - floors at the spec bandwidth only
            common.log(f"copy bandwidth not measured: {common.short_error(exc)}")
        common.free_gpu()
    command = " ".join(["python benchmarks/bench_seq2seq.py",
                        *(sys.argv[1:] if argv is None else argv)])
    head = header(args, device_name, env, copy_gbps, command)
    stem = common.result_stem("seq2seq", device_name)
    dtype_bytes = torch.empty((), dtype=DTYPES[args.dtype]).element_size()
    rows = make_rows(args)
    by_model = {s.name: [r for r in rows if r.model == s.name] for s in args.shapes}
    for s in args.shapes:
        for r in by_model[s.name]:
            derive(r, s, copy_gbps, args.spec_gbps, dtype_bytes)
    models: dict[str, Any] = {s.name: {**asdict(s), "params": s.param_count(),
                                       "decoder_step_params": s.decoder_step_params()}
                              for s in args.shapes}
    tokens: dict[tuple[str, int, int], torch.Tensor] = {}  # warpformer's, best beam
    hf_tokens: dict[tuple[str, int, int], torch.Tensor] = {}  # HF eager's

    def save() -> tuple[Path, Path]:
        payload = {"benchmark": "seq2seq", "env": env, "copy_gbps": copy_gbps,
                   "spec_gbps": args.spec_gbps, "elapsed_s": budget.elapsed(),
                   "args": {k: (str(v) if isinstance(v, Path) else v)
                            for k, v in vars(args).items() if k not in ("models", "shapes")},
                   "models": models, "targets": evaluate_targets(rows, args.dtype),
                   "rows": [dict(asdict(r), **r.derived()) for r in rows]}
        return common.write_results(args.out_dir, stem, payload, report(rows, head, args.dtype))

    scratch_ctx = None
    if args.work_dir is None:
        base = pick_scratch_base(
            [Path(tempfile.gettempdir()), Path.home() / ".cache", common.REPO / "benchmarks"],
            scratch_need_bytes(args.shapes, args.dtype))
        base.mkdir(parents=True, exist_ok=True)
        scratch_ctx = tempfile.TemporaryDirectory(prefix="bench_seq2seq_", dir=base)
        scratch = Path(scratch_ctx.name)
    else:
        scratch = Path(args.work_dir)
    common.log(f"scratch folder (HF checkpoint, conversion): {scratch}")
    try:
        for s in args.shapes:  # phase 1: warpformer (never skipped)
            common.log(f"[{s.name}] phase 1: build, convert, warpformer "
                       f"(t={budget.elapsed():.0f}s)")
            try:
                wf_phase(s, by_model[s.name], args, scratch, cuda, device, models, tokens)
            except Exception as exc:  # noqa: BLE001 - record on every row, go on
                for r in by_model[s.name]:
                    if r.wf.ms is None and r.wf.error is None:
                        fail(r.wf, exc, f"[{s.name}] build/convert")
            save()
        if not args.skip_hf:
            for s in args.shapes:  # phase 2: HF eager
                common.log(f"[{s.name}] phase 2: HF eager (t={budget.elapsed():.0f}s)")
                try:
                    eager_phase(s, by_model[s.name], args, budget, cuda, device, models, tokens,
                                hf_tokens, save)
                except Exception as exc:  # noqa: BLE001
                    for r in by_model[s.name]:
                        if r.hf_eager.ms is None and not (r.hf_eager.error or r.hf_eager.skipped):
                            fail(r.hf_eager, exc, f"[{s.name}] HF eager")
                save()
        if not args.skip_hf and not args.skip_hf_compiled:
            # phase 3: HF compiled (on the CPU HF does not compile: its static-cache path runs
            # eager, and the rows say so)
            for i, s in enumerate(args.shapes):
                common.log(f"[{s.name}] phase 3: HF compiled (t={budget.elapsed():.0f}s)")
                try:
                    compiled_phase(s, by_model[s.name], args, budget, len(args.shapes) - i,
                                   cuda, device, models, hf_tokens, save)
                except Exception as exc:  # noqa: BLE001
                    for r in by_model[s.name]:
                        t = r.hf_compiled
                        if t.ms is None and not (t.error or t.skipped):
                            fail(t, exc, f"[{s.name}] HF compiled")
                save()
    finally:
        if scratch_ctx is not None:
            scratch_ctx.cleanup()
    json_path, md_path = save()
    # stdout: the notes first, so that the tables and the targets end the output
    lines = notes(rows)
    if lines:
        print("### Notes\n\n" + "\n".join(lines) + "\n", flush=True)
    print(report(rows, head, args.dtype, with_notes=False))
    print(f"\nresults: {json_path} and {md_path}; {budget.elapsed():.0f} s", flush=True)
    return 0 if all(r.wf.ms is not None for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
