"""Generation benchmark: warpformer against HF transformers (eager, and static cache + compiled
forward) and against the bandwidth floor, on the same random fp16 weights and prompts.

For each model shape (gpt2-medium, bloom-560m, opt-1.3b, gpt-j-6b, opt-6.7b), batch size and
(input, output) length it reports prefill ms (a generate of one new token), decode ms per step
((total - prefill) / (out - 1)), tokens/s (batch * out / total), peak GPU memory
(max_memory_allocated from the first timed call on, weights included; warpformer's KV cache and
workspace come from the same caching allocator), the per-step floor (weights + KV cache read at
the mean context, over the copy bandwidth measured in this run; or the GEMM time if larger), the
fraction of it achieved, the speedups, and for batch 64 the GEMM TFLOP/s of prefill and decode
against an 8192^3 fp16 torch.matmul measured in this run.

Method: one model on the GPU at a time (HF first, then warpformer from the converted copy); every
configuration is warmed up, then timed with CUDA events around whole generate calls; medians of
``--repeats`` (warpformer) / ``--hf-repeats`` (HF) calls. Every row generates exactly ``out``
tokens: HF with eos disabled and min_new_tokens = max_new_tokens, warpformer with an end_id whose
logit is pinned below every other (checked: a shorter output is flagged). A failing configuration
(OOM, compile error) is recorded in the table and the run goes on. HF work that would overrun
``--budget-s`` is skipped and recorded as such.

    python benchmarks/bench_generate.py --quick          # ~2 min on an H200 (4 layers per model)
    python benchmarks/bench_generate.py                  # ~6 min: real layer counts
    python benchmarks/bench_generate.py --dry-run        # the plan and the floors, no GPU
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from common import (
    DEFAULT_CACHE_DIR,
    DEFAULT_RESULTS_DIR,
    SHAPES,
    Budget,
    ModelShape,
    copy_bandwidth_gbps,
    decode_floor_ms,
    decode_gemm_flops,
    env_info,
    fnum,
    fpct,
    free_gpu,
    fx,
    gemm_tflops,
    gpu_name,
    is_oom,
    log,
    make_prompts,
    md_table,
    mean_decode_context,
    measure,
    parse_models,
    positive_ints,
    prefill_gemm_flops,
    prepare_model,
    reset_compiled,
    result_stem,
    short_error,
    write_results,
)

# Extra warpformer rows (--wf-variants), each an engine built with other engine options
# (warpformer.options.EngineOptions) over the same weights: graphs-off (cuda_graphs=False: decode
# steps and prompt passes launched kernel by kernel, prompts over their exact token count),
# prefill-N (prefill_tokens=N: prompt groups of at most N tokens), and tuned / tuned-warm (a
# gemm-tune file made for the configuration, given as gemm_config; tuned-warm: made with
# --warm-weights). The fused paths' old switches are gone (benchmarks/HISTORY.md keeps their A/Bs).
VARIANT_OPTIONS: dict[str, dict[str, Any]] = {"graphs-off": {"cuda_graphs": False}}
VARIANTS = (*VARIANT_OPTIONS, "tuned", "tuned-warm", "prefill-N")
# Variants of switches the engine no longer has (issue 50): refused with that reason.
REMOVED_VARIANTS = ("gemv-off", "gemv-tc-off", "unfused", "attention-only", "parallel-off",
                    "pair-off", "activation-off", "prompt-graphs-off")
ENGINES = ("warpformer", *(f"warpformer-{v}" for v in VARIANTS), "hf-eager", "hf-compiled")
# Issue 6 targets: decode ms/step at batch 1, 128 in / 128 out, real layer counts.
TARGETS_MS = {"gpt2-medium": 0.26, "bloom-560m": 0.40, "gpt-j-6b": 3.3}
TARGET_CONFIG = (1, 128, 128)
# llama-3-8b is benchmarked on its own (--models llama-3-8b): with it the converted models and one
# HF copy would not fit a 64 GB disk (benchmarks/README.md).
DEFAULT_MODELS = [s for s in SHAPES.values() if s.family != "llama"]
QUICK = {"layers": 4, "batches": [1, 64], "repeats": 3, "hf_repeats": 2, "budget_s": 100.0}
FULL = {"layers": None, "batches": [1, 8, 64], "repeats": 5, "hf_repeats": 3, "budget_s": 330.0}


@dataclass
class Row:
    model: str
    engine: str
    batch: int
    input_len: int
    output_len: int
    prefill_ms: float | None = None
    total_ms: float | None = None
    decode_ms: float | None = None
    tokens_per_s: float | None = None
    peak_gb: float | None = None
    engine_gb: float | None = None  # warpformer: KV cache + workspace it holds
    gemm_workspace_mb: float | None = None  # warpformer: of which the cuBLASLt workspace (MiB)
    floor_ms: float | None = None
    floor_bw_ms: float | None = None
    floor_compute_ms: float | None = None
    pct_floor: float | None = None
    prefill_tflops: float | None = None
    prefill_pct_gemm: float | None = None
    decode_tflops: float | None = None
    decode_pct_gemm: float | None = None
    decode_gemm_ceiling_pct: float | None = None  # compute floor / floor: the most decode can reach
    speedup_vs_hf_eager: float | None = None  # end to end (total time)
    step_speedup_vs_hf_eager: float | None = None  # decode ms/step
    prefill_speedup_vs_hf_eager: float | None = None
    speedup_vs_hf_compiled: float | None = None
    step_speedup_vs_hf_compiled: float | None = None
    prefill_speedup_vs_hf_compiled: float | None = None
    peak_vs_hf_eager: float | None = None  # peak memory ratio (target: <= 1)
    first_call_s: float | None = None  # HF compiled: compile + first generate
    compiled: bool | None = None
    full_length: bool | None = None  # every row produced exactly output_len tokens
    agree_first_token_pct: float | None = None  # warpformer vs HF eager, rows
    agree_prefix_pct: float | None = None  # mean common prefix of the generated tokens
    logits_rel_err: float | None = None  # --weight-quant rows: prompt logits vs fp16 warpformer's
    total_samples_ms: list[float] = field(default_factory=list)
    prefill_samples_ms: list[float] = field(default_factory=list)
    note: str = ""
    error: str | None = None

    @property
    def config(self) -> tuple[int, int, int]:
        return (self.batch, self.input_len, self.output_len)


# --------------------------------------------------------------------------- arguments
def _lengths(text: str) -> list[tuple[int, int]]:
    out = []
    for item in text.split(","):
        parts = item.replace(":", "x").split("x")
        try:
            n_in, n_out = (int(p) for p in parts)
        except ValueError:
            raise argparse.ArgumentTypeError(f"lengths are IN x OUT pairs like 128x128,512x32; "
                                             f"got {item!r}") from None
        if n_in < 1 or n_out < 2:
            raise argparse.ArgumentTypeError(f"{item!r}: input >= 1 and output >= 2 tokens")
        out.append((n_in, n_out))
    return out


def variant_options(variant: str) -> dict[str, Any]:
    """The engine options (``EngineOptions`` keywords) a --wf-variants name sets, other than the
    tuned variants' ``gemm_config`` (made per configuration by ``run_warpformer``)."""
    if variant in VARIANT_OPTIONS:
        return dict(VARIANT_OPTIONS[variant])
    if re.fullmatch(r"prefill-[1-9][0-9]*", variant):
        return {"prefill_tokens": int(variant.split("-", 1)[1])}
    return {}


def _variants(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    gone = [n for n in names if n in REMOVED_VARIANTS]
    if gone:
        raise argparse.ArgumentTypeError(
            f"variant(s) {gone} switched off a path the engine now always runs (the switch was "
            f"removed; benchmarks/HISTORY.md keeps its A/B); choose from {VARIANTS}")
    bad = [n for n in names
           if n not in VARIANTS and not re.fullmatch(r"prefill-[1-9][0-9]*", n)]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown variant(s) {bad}; choose from {VARIANTS}")
    return names


# Bytes per weight of the layers' matrices in each quantized format, scales included (int8: one
# scale per output column, negligible; int4: a 2-byte scale per 128 weights).
QUANT_WEIGHT_BYTES = {"int8": 1.0, "int4": 0.5 + 2 / 128}


def _quant_modes(text: str) -> list[str]:
    modes = [t.strip() for t in text.split(",") if t.strip()]
    bad = [m for m in modes if m not in QUANT_WEIGHT_BYTES]
    if bad:
        raise argparse.ArgumentTypeError(f"--weight-quant takes int8 and int4, got {bad}")
    return modes


def _models(text: str) -> list[ModelShape]:
    try:
        return parse_models(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=_models, default=DEFAULT_MODELS,
                    help=f"comma-separated subset of {','.join(SHAPES)} (default: all but "
                         "llama-3-8b, whose 16 GB converted copy and 16 GB HF copy would take "
                         "the default set past a 64 GB disk: run it with --models)")
    ap.add_argument("--layers", type=int, default=None,
                    help="truncate every model to N layers (default: real counts; --quick: 4)")
    ap.add_argument("--batches", type=positive_ints, default=None,
                    help="default 1,8,64 (quick 1,64)")
    ap.add_argument("--lengths", type=_lengths, default=[(128, 128), (512, 32)],
                    help="IN x OUT pairs, default 128x128,512x32")
    ap.add_argument("--repeats", type=int, default=None, help="timed warpformer calls (5; quick 3)")
    ap.add_argument("--hf-repeats", type=int, default=None, help="timed HF calls (3; quick 2)")
    ap.add_argument("--skip-hf", action="store_true", help="warpformer only")
    ap.add_argument("--wf-variants", type=_variants, default=[],
                    help="extra warpformer rows, each an engine built with other engine "
                         "options over the same weights: graphs-off (cuda_graphs=False: every "
                         "kernel launched eagerly, prompts over their exact token count), "
                         "prefill-N (prefill_tokens=N: prompt groups of at most N tokens), "
                         "tuned (gemm_config: a gemm-tune file made for the configuration), "
                         "tuned-warm (the same, timed on one weight copy, warm in L2)")
    ap.add_argument("--hf-compile", choices=("none", "target", "all"), default="target",
                    help="HF static cache + compiled forward on: none, the target configuration "
                         "(batch 1, 128/128; default) or every configuration (slow)")
    ap.add_argument("--no-hf-compile", dest="hf_compile", action="store_const", const="none",
                    help="same as --hf-compile none")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="wall-clock budget for HF work: HF runs that would overrun it are "
                         "skipped and recorded (330; quick 100; 0 = unlimited)")
    ap.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR,
                    help=f"converted models are cached here (default {DEFAULT_CACHE_DIR})")
    ap.add_argument("--out-dir", type=Path, default=DEFAULT_RESULTS_DIR,
                    help="JSON + markdown results go here (default benchmarks/results)")
    ap.add_argument("--weight-quant", type=_quant_modes, default=[],
                    help="also time the weights quantized at load: a comma list of int8 "
                         "(per channel) and int4 (group 128); rows warpformer-int8/-int4, their "
                         "floors on the quantized bytes, their tokens against fp16 warpformer's")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true",
                    help="4 layers per model, batches 1 and 64, fewer repeats, 100 s HF budget")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the plan and the bandwidth floors; touch no GPU")
    ap.add_argument("--assume-copy-gbps", type=float, default=4300.0,
                    help="copy bandwidth for --dry-run floors (GB/s, default 4300: H200)")
    args = ap.parse_args(argv)
    preset = QUICK if args.quick else FULL
    for key, val in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, val)
    if args.layers is not None and args.layers < 1:
        ap.error("--layers must be >= 1")
    if args.repeats < 1 or args.hf_repeats < 1:
        ap.error("--repeats and --hf-repeats must be >= 1")
    args.shapes = [s.with_layers(args.layers) for s in args.models]
    return args


def configs(args: argparse.Namespace) -> list[tuple[int, int, int]]:
    """(batch, input, output) in run order: lengths outer, batch inner."""
    return [(b, i, o) for (i, o) in args.lengths for b in args.batches]


def compiled_wanted(args: argparse.Namespace, cfg: tuple[int, int, int]) -> bool:
    return args.hf_compile == "all" or (args.hf_compile == "target" and cfg == TARGET_CONFIG)


def reserve_s(shapes: list[ModelShape]) -> float:
    """Rough seconds the mandatory work of ``shapes`` needs (build and convert, warpformer, HF
    eager): a guess that keeps HF compiles from starving later models."""
    return sum(6.0 + 12.0 * s.param_count() / 1e9 for s in shapes)


def compile_estimate_s(shape: ModelShape, seen: list[float]) -> float:
    """Seconds one HF compile + first generate will take: the slowest seen, else a guess."""
    return max(seen) if seen else 20.0 + 1.5 * shape.layers


# --------------------------------------------------------------------------- measuring
def run_hf(hf, row: Row, prompts: torch.Tensor, reps: int, compiled: bool) -> torch.Tensor:
    """Fills ``row`` from HF generate; returns the generated tokens [B, out] on the CPU."""
    B, n_in, n_out = row.config
    ids = prompts.to("cuda", torch.long)
    mask = torch.ones_like(ids)
    extra: dict[str, Any] = {}
    setup = None
    if compiled:
        from transformers import CompileConfig, StaticCache

        cc = CompileConfig(fullgraph=False, mode="reduce-overhead")
        try:
            # One static cache per configuration, reset (untimed) before each call, so the
            # compiled decode step sees the same buffers every time (no CUDA-graph re-records).
            cache = StaticCache(config=hf.config, max_cache_len=n_in + n_out)
            extra = {"past_key_values": cache, "compile_config": cc}
            setup = cache.reset
        except TypeError:  # another StaticCache signature: let generate build its own
            extra = {"cache_implementation": "static", "compile_config": cc}
            row.note = "cache_implementation=static"

    def gen(n_new: int) -> torch.Tensor:
        return hf.generate(input_ids=ids, attention_mask=mask, do_sample=False, num_beams=1,
                           min_new_tokens=n_new, max_new_tokens=n_new, pad_token_id=0,
                           use_cache=True, **extra)

    t0 = time.monotonic()
    if setup:
        setup()
    gen(n_out if compiled else min(n_out, 4))  # compiled: compile + record CUDA graphs
    torch.cuda.synchronize()
    row.first_call_s = time.monotonic() - t0
    if compiled:
        if setup:
            setup()
        gen(n_out)
        row.compiled = getattr(hf, "_compiled_call", None) is not None
        if not row.compiled:
            row.note = "HF did not compile (ran eager)"
        elif not row.note:
            row.note = f"compile + first call {row.first_call_s:.0f} s"
    res = measure(lambda: gen(n_out), lambda: gen(1), reps, setup)
    out = res.pop("out")
    row.full_length = tuple(out.shape) == (B, n_in + n_out)
    _fill(row, res)
    if not compiled:
        row.note = f"attn={getattr(hf.config, '_attn_implementation', '?')}"
    return out[:, n_in:].cpu()


def tuning_file(config, cfg: tuple[int, int, int], out_dir: Path,
                warm: bool = False) -> tuple[str, int]:
    """A `warpformer gemm-tune` file for this model and configuration (fp16, beam 1; ``warm``:
    timed as `gemm-tune --warm-weights` does); returns (path, number of shapes where a
    non-default algorithm measured faster)."""
    from warpformer.gemm_tune import collect_shapes, tune, write_tuning_file

    B, n_in, _ = cfg
    results = tune(collect_shapes(config, B, 1, n_in), torch.float16, max_algos=16, reps=10,
                   cold_bytes=0 if warm else None)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / (f"gemm_tuning_{config.hidden_size}x{config.num_layer}_B{B}_in{n_in}"
                      f"{'_warm' if warm else ''}.tsv")
    write_tuning_file(str(path), "fp16", results)
    return str(path), sum(1 for _, i, _, _ in results if i != 0)


def run_warpformer(weights, config, shape: ModelShape, row: Row,
                   prompts: torch.Tensor, reps: int, variant: str = "",
                   out_dir: Path = DEFAULT_RESULTS_DIR) -> torch.Tensor:
    from warpformer.models.gpt import build_gpt_model
    from warpformer.options import EngineOptions

    B, n_in, n_out = row.config
    gemm_config = None
    if variant in ("tuned", "tuned-warm"):
        gemm_config, changed = tuning_file(config, row.config, out_dir, variant == "tuned-warm")
        row.note = f"{variant}: {changed} shapes off the heuristic's first choice"
    options = EngineOptions(gemm_config=gemm_config, **variant_options(variant))
    return _time_warpformer(build_gpt_model(config, weights, dtype=torch.float16, max_batch=B,
                                            max_seq_len=n_in + n_out, options=options),
                            shape, row, prompts, reps)


def _time_warpformer(engine, shape: ModelShape, row: Row, prompts: torch.Tensor,
                     reps: int) -> torch.Tensor:
    B, n_in, n_out = row.config
    ids = prompts.to("cuda")
    lens = torch.full((B,), n_in, dtype=torch.int32, device="cuda")
    end_id = shape.vocab - 1  # its logit is pinned low: never generated

    def gen(n_new: int):
        return engine.generate(ids, lens, n_new, end_id)

    gen(n_out)  # allocates the KV cache and workspace for this shape
    gen(n_out)
    res = measure(lambda: gen(n_out), lambda: gen(1), reps)
    out, seq = res.pop("out")
    row.full_length = bool((seq == n_in + n_out).all())
    row.engine_gb = engine.memory_bytes() / 1e9
    row.gemm_workspace_mb = engine.gemm_workspace_bytes() / 2**20
    _fill(row, res)
    return out[:, 0, n_in:].cpu()


def _fill(row: Row, res: dict[str, Any]) -> None:
    for key, val in res.items():
        setattr(row, key, val)
    if row.full_length is False:
        row.note = (row.note + "; " if row.note else "") + "SHORT OUTPUT: timings not comparable"


# The prompts whose last-position logits compare a quantized engine with fp16 (B, in, out).
LOGITS_CFG = (4, 128, 1)


def last_logits(weights, config, shape: ModelShape, seed: int) -> torch.Tensor:
    """Last-position logits ``[B, V]`` (fp32, CPU) of the LOGITS_CFG prompts through an engine
    over ``weights``."""
    from warpformer.models.gpt import build_gpt_model

    B, n_in, _ = LOGITS_CFG
    engine = build_gpt_model(config, weights, dtype=torch.float16, max_batch=B,
                             max_seq_len=n_in + 1)
    ids = _prompts(shape, LOGITS_CFG, seed).to("cuda")
    lens = torch.full((B,), n_in, dtype=torch.int32, device="cuda")
    with torch.no_grad():
        out = engine.forward(ids, lens)[:, n_in - 1, :shape.vocab].float().cpu()
    del engine
    return out


def logits_rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    """max |ours - ref| / max |ref|: the logits' error relative to their range."""
    return float((ours.double() - ref.double()).abs().max() / ref.double().abs().max())


def agreement(ours: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(% rows whose first token matches, mean % common prefix) of two [B, out] token arrays."""
    same = (ours == ref).int()
    prefix = same.cumprod(dim=1).sum(dim=1).float()
    return float(same[:, 0].float().mean() * 100), float((prefix / ours.shape[1]).mean() * 100)


# --------------------------------------------------------------------------- derived metrics
def derive(row: Row, shape: ModelShape, copy_gbps: float, gemm_rate: float | None) -> None:
    """Decode ms/step, tokens/s, floors and GEMM efficiency from the measured times."""
    B, n_in, n_out = row.config
    quant = row.engine.rsplit("-", 1)[-1] if row.engine.startswith("warpformer-") else ""
    bw, comp, floor = decode_floor_ms(shape, B, mean_decode_context(n_in, n_out), copy_gbps,
                                      gemm_rate,
                                      layer_weight_bytes=QUANT_WEIGHT_BYTES.get(quant))
    row.floor_bw_ms, row.floor_compute_ms, row.floor_ms = bw, comp, floor
    if gemm_rate:
        row.decode_gemm_ceiling_pct = 100 * comp / floor
    if row.total_ms is None or row.prefill_ms is None:
        return
    row.tokens_per_s = B * n_out / (row.total_ms / 1e3)
    row.decode_ms = (row.total_ms - row.prefill_ms) / (n_out - 1)
    if row.decode_ms > 0:
        row.pct_floor = 100 * floor / row.decode_ms
        row.decode_tflops = decode_gemm_flops(shape, B) / (row.decode_ms * 1e-3) / 1e12
    row.prefill_tflops = prefill_gemm_flops(shape, B, n_in) / (row.prefill_ms * 1e-3) / 1e12
    if gemm_rate:
        row.prefill_pct_gemm = 100 * row.prefill_tflops / gemm_rate
        if row.decode_tflops is not None:
            row.decode_pct_gemm = 100 * row.decode_tflops / gemm_rate


def speedups(rows: list[Row]) -> None:
    """Warpformer vs each HF variant, and HF compiled vs HF eager (same model and config)."""
    index = {(r.model, r.engine, r.config): r for r in rows if r.total_ms is not None}

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b is not None and a > 0 and b > 0 else None

    for r in rows:
        if r.total_ms is None or r.engine == "hf-eager":
            continue
        for ref_engine, suffix in (("hf-eager", "hf_eager"), ("hf-compiled", "hf_compiled")):
            ref = index.get((r.model, ref_engine, r.config))
            if ref is None or ref is r or (r.engine == "hf-compiled" and suffix == "hf_compiled"):
                continue
            setattr(r, f"speedup_vs_{suffix}", ratio(ref.total_ms, r.total_ms))
            setattr(r, f"step_speedup_vs_{suffix}", ratio(ref.decode_ms, r.decode_ms))
            setattr(r, f"prefill_speedup_vs_{suffix}", ratio(ref.prefill_ms, r.prefill_ms))
            if suffix == "hf_eager":
                r.peak_vs_hf_eager = ratio(r.peak_gb, ref.peak_gb)


# --------------------------------------------------------------------------- tables
def _speed_cell(total: float | None, step: float | None) -> str:
    return "—" if total is None else f"{fx(total)} ({fx(step)})"


def main_table(rows: list[Row]) -> str:
    headers = ["model", "engine", "B", "in/out", "prefill ms", "decode ms/step", "tok/s",
               "peak GB", "floor ms/step", "% floor", "vs HF eager: total (step)",
               "vs HF compiled: total (step)", "note"]
    body = []
    for r in rows:
        note = r.error or r.note
        body.append([r.model, r.engine, r.batch, f"{r.input_len}/{r.output_len}",
                     fnum(r.prefill_ms), fnum(r.decode_ms, 3), fnum(r.tokens_per_s, 0),
                     fnum(r.peak_gb, 2), fnum(r.floor_ms, 3), fpct(r.pct_floor),
                     _speed_cell(r.speedup_vs_hf_eager, r.step_speedup_vs_hf_eager),
                     _speed_cell(r.speedup_vs_hf_compiled, r.step_speedup_vs_hf_compiled), note])
    return md_table(headers, body, align="llrrrrrrrrrrl")


def gemm_table(rows: list[Row], batch: int = 64) -> str:
    headers = ["model", "engine", "in/out", "prefill TFLOP/s", "% of GEMM rate",
               "decode TFLOP/s", "% of GEMM rate", "decode ceiling (bandwidth)"]
    body = [[r.model, r.engine, f"{r.input_len}/{r.output_len}", fnum(r.prefill_tflops, 0),
             fpct(r.prefill_pct_gemm), fnum(r.decode_tflops, 0), fpct(r.decode_pct_gemm),
             fpct(r.decode_gemm_ceiling_pct)]
            for r in rows if r.batch == batch and r.total_ms is not None]
    return md_table(headers, body, align="lllrrrrr")


def summary_table(rows: list[Row], shapes: dict[str, ModelShape]) -> str:
    headers = ["model", "B", "in/out", "decode ms/step", "floor ms", "% floor", "prefill ms",
               "x HF eager (step)", "x HF compiled (step)", "peak GB (HF eager)", "target"]
    body = []
    for r in rows:
        if r.engine != "warpformer":
            continue
        hf = next((x for x in rows if x.engine == "hf-eager" and x.model == r.model
                   and x.config == r.config), None)
        peak = f"{fnum(r.peak_gb)} ({fnum(hf.peak_gb if hf else None)})"
        target = "—"
        real = shapes[r.model].layers == SHAPES[r.model].layers
        if r.config == TARGET_CONFIG and r.model in TARGETS_MS and real and r.decode_ms:
            t = TARGETS_MS[r.model]
            target = f"<= {t}: {'met' if r.decode_ms <= t else 'missed'}"
        body.append([r.model, r.batch, f"{r.input_len}/{r.output_len}", fnum(r.decode_ms, 3),
                     fnum(r.floor_ms, 3), fpct(r.pct_floor), fnum(r.prefill_ms),
                     fx(r.step_speedup_vs_hf_eager), fx(r.step_speedup_vs_hf_compiled),
                     peak, r.error or target])
    return md_table(headers, body, align="lrrrrrrrrrl")


def variants_table(rows: list[Row]) -> str:
    """Decode ms/step and prefill ms of each warpformer variant next to the default build."""
    present = list(dict.fromkeys(r.engine for r in rows if r.engine.startswith("warpformer")))
    headers = ["model", "B", "in/out"] + [f"{e}: step (prefill) ms" for e in present]
    body = []
    for r in rows:
        if r.engine != "warpformer":
            continue
        cells = []
        for e in present:
            v = next((x for x in rows if x.engine == e and x.model == r.model
                      and x.config == r.config), None)
            cells.append("—" if v is None or v.decode_ms is None
                         else f"{v.decode_ms:.3f} ({v.prefill_ms:.2f})")
        body.append([r.model, r.batch, f"{r.input_len}/{r.output_len}", *cells])
    return md_table(headers, body, align="lrr" + "r" * len(present))


def report(rows: list[Row], shapes: dict[str, ModelShape], head: str) -> tuple[str, str]:
    """(full markdown document, summary table)."""
    summary = summary_table(rows, shapes)
    parts = [head, "### All configurations", main_table(rows),
             "### Batch 64: GEMM efficiency (2 x GEMM params x tokens / time)", gemm_table(rows)]
    if any(r.engine.startswith("warpformer-") for r in rows):
        parts += ["### warpformer variants", variants_table(rows)]
    doc = "\n\n".join(parts + ["### Summary (warpformer)", summary])
    return doc, summary


# --------------------------------------------------------------------------- driver
def dry_run(args: argparse.Namespace) -> int:
    bw = args.assume_copy_gbps
    print(f"## Plan (dry run; floors at an assumed {bw:.0f} GB/s copy bandwidth)\n")
    body, disk = [], 0
    for s in args.shapes:
        disk += 2 * s.param_count()
        for cfg in configs(args):
            B, i, o = cfg
            engines = ["warpformer"]
            if not args.skip_hf:
                engines.append("hf-eager")
                if compiled_wanted(args, cfg):
                    engines.append("hf-compiled")
            _, _, floor = decode_floor_ms(s, B, mean_decode_context(i, o), bw)
            body.append([s.name, s.layers, f"{s.param_count() / 1e6:.0f}",
                         f"{2 * s.decode_read_params() / 1e6:.0f}", B, f"{i}/{o}",
                         fnum(floor, 3), ", ".join(engines)])
    print(md_table(["model", "layers", "params M", "weights read MB", "B", "in/out",
                    "floor ms/step", "engines"], body, align="lrrrrrrl"))
    print(f"\ncache: {args.cache_dir} (~{disk / 1e9:.1f} GB converted, plus one model's HF copy "
          f"while converting); results: {args.out_dir}; HF budget {args.budget_s:.0f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        return dry_run(args)
    if not torch.cuda.is_available():
        print("bench_generate: no CUDA device visible; use --dry-run", file=sys.stderr)
        return 2
    import warpformer  # noqa: F401  (loads the extension)

    if not args.skip_hf:
        import transformers

        transformers.logging.set_verbosity_error()
        for name in ("cache_size_limit", "recompile_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 64)
    budget = Budget(args.budget_s)
    gpu = gpu_name()
    env = env_info()
    copy_gbps, gemm_rate = copy_bandwidth_gbps(), gemm_tflops()
    free_gpu()  # the matmul's cuBLAS workspace must not count in the first engine's peak
    log(f"{gpu}: copy {copy_gbps:.0f} GB/s, fp16 GEMM {gemm_rate:.0f} TFLOP/s")
    stem = result_stem("generate", gpu)
    head = (f"## Generation on {gpu}, {env['date']}\n\ncopy bandwidth {copy_gbps:.0f} GB/s "
            f"(read + write), fp16 GEMM {gemm_rate:.0f} TFLOP/s (8192^3 torch.matmul); "
            f"torch {env['torch']}, transformers {env['transformers']}, commit {env['commit']}; "
            f"`{' '.join(['python benchmarks/bench_generate.py', *(argv or sys.argv[1:])])}`")
    rows: list[Row] = []
    models: dict[str, Any] = {}
    shapes = {s.name: s for s in args.shapes}
    compile_times: list[float] = []
    cfgs = configs(args)
    order = {e: i for i, e in enumerate(ENGINES)}

    def save() -> tuple[Path, Path]:
        speedups(rows)
        doc, _ = report(rows, shapes, head)
        payload = {"benchmark": "generate", "env": env, "copy_gbps": copy_gbps,
                   "gemm_tflops": gemm_rate, "elapsed_s": budget.elapsed(),
                   "args": {key: (str(v) if isinstance(v, Path) else v)
                            for key, v in vars(args).items() if key not in ("models", "shapes")},
                   "models": models, "rows": [asdict(r) for r in rows]}
        return write_results(args.out_dir, stem, payload, doc)

    for k, shape in enumerate(args.shapes):
        mrows = bench_model(args, shape, cfgs, budget, compile_times, args.shapes[k + 1:], models)
        rank = lambda r: (cfgs.index(r.config), order.get(r.engine, len(order)))  # noqa: E731
        for row in sorted(mrows, key=rank):
            derive(row, shape, copy_gbps, gemm_rate)
            rows.append(row)
        json_path, _ = save()
        log(f"[{shape.name}] done at t={budget.elapsed():.0f}s; results so far in {json_path}")

    json_path, md_path = save()
    doc, summary = report(rows, shapes, head)
    print(doc.rsplit("### Summary", 1)[0])
    print(f"results: {json_path} and {md_path}; {budget.elapsed():.0f} s\n")
    print("### Summary (warpformer)\n")
    print(summary)
    return 0


def bench_model(args: argparse.Namespace, shape: ModelShape, cfgs: list[tuple[int, int, int]],
                budget: Budget, compile_times: list[float], later: list[ModelShape],
                models: dict[str, Any]) -> list[Row]:
    """Every configuration of one model: HF eager, HF compiled, then warpformer."""
    from warpformer.weights import load_weights, read_config

    rows: list[Row] = []

    def new_row(engine: str, cfg: tuple[int, int, int]) -> Row:
        rows.append(Row(shape.name, engine, *cfg))
        return rows[-1]

    need_hf = not args.skip_hf and budget.allows()
    log(f"[{shape.name}] preparing ({shape.layers} layers, {shape.param_count() / 1e6:.0f}M "
        f"params, t={budget.elapsed():.0f}s)")
    try:
        prep = prepare_model(shape, args.cache_dir, args.seed, need_hf)
    except Exception as exc:  # noqa: BLE001 - record and go on with the next model
        log(f"[{shape.name}] build failed: {short_error(exc)}")
        for cfg in cfgs:
            new_row("warpformer", cfg).error = f"build: {short_error(exc)}"
        free_gpu()
        return rows
    models[shape.name] = {**dataclasses.asdict(shape), "params": shape.param_count(),
                          "decode_read_bytes": 2 * shape.decode_read_params(),
                          "gemm_params": shape.gemm_params(),
                          "kv_bytes_per_token": shape.kv_bytes_per_token(),
                          "build_s": prep.build_s, "converted_now": prep.converted,
                          "model_dir": str(prep.model_dir)}
    hf_tokens: dict[tuple[int, int, int], torch.Tensor | None] = {}
    hf, prep.hf = prep.hf, None
    if hf is not None:
        models[shape.name]["hf_attn"] = getattr(hf.config, "_attn_implementation", None)
        for cfg in cfgs:
            row = new_row("hf-eager", cfg)
            if not budget.allows():
                row.note = "skipped: time budget"
                continue
            hf_tokens[cfg] = _guard(row, run_hf, hf, row, _prompts(shape, cfg, args.seed),
                                    args.hf_repeats, False)
        for cfg in cfgs:
            if not compiled_wanted(args, cfg):
                continue
            row = new_row("hf-compiled", cfg)
            if not budget.allows(compile_estimate_s(shape, compile_times) + reserve_s(later)):
                row.note = "skipped: time budget"
                continue
            _guard(row, run_hf, hf, row, _prompts(shape, cfg, args.seed), args.hf_repeats, True)
            if row.first_call_s:
                compile_times.append(row.first_call_s)
        del hf
        reset_compiled()
        free_gpu()
        left = torch.cuda.memory_allocated() / 1e9
        models[shape.name]["allocated_after_hf_gb"] = left
        if left > 0.5:
            log(f"[{shape.name}] {left:.1f} GB still allocated after freeing HF: "
                "warpformer's peak memory includes it")
    elif not args.skip_hf:
        for cfg in cfgs:
            new_row("hf-eager", cfg).note = "skipped: time budget"

    try:
        weights = load_weights(prep.model_dir, dtype=torch.float16, device="cuda")
        config = read_config(prep.model_dir)
    except Exception as exc:  # noqa: BLE001
        for cfg in cfgs:
            new_row("warpformer", cfg).error = f"load: {short_error(exc)}"
        free_gpu()
        return rows
    wf_tokens: dict[tuple[int, int, int], torch.Tensor | None] = {}
    for cfg in cfgs:
        row = new_row("warpformer", cfg)
        toks = wf_tokens[cfg] = _guard(row, run_warpformer, weights, config, shape, row,
                                       _prompts(shape, cfg, args.seed), args.repeats)
        ref = hf_tokens.get(cfg)
        if toks is not None and ref is not None:
            row.agree_first_token_pct, row.agree_prefix_pct = agreement(toks, ref)
            if row.agree_first_token_pct < 90:
                row.note = f"first tokens agree with HF on {row.agree_first_token_pct:.0f}% of rows"
    for variant in args.wf_variants:
        for cfg in cfgs:
            row = new_row(f"warpformer-{variant}", cfg)
            _guard(row, run_warpformer, weights, config, shape, row,
                   _prompts(shape, cfg, args.seed), args.repeats, variant, args.out_dir)
    if args.weight_quant:
        fp16_logits = None
        try:
            fp16_logits = last_logits(weights, config, shape, args.seed)
        except Exception as exc:  # noqa: BLE001 - the rows still run; the error is logged
            log(f"[{shape.name}] fp16 logits for the quantized rows: {short_error(exc)}")
        bench_quantized(args, shape, cfgs, weights, config, new_row, wf_tokens, fp16_logits)
    del weights
    free_gpu()
    return rows


def bench_quantized(args, shape: ModelShape, cfgs, weights, config, new_row,
                    fp16_tokens: dict, fp16_logits: torch.Tensor | None = None) -> None:
    """The --weight-quant rows: the fp16 weights quantized at load (on the GPU, one tensor at a
    time from a CPU copy, so that the peak memory is the quantized model's), timed as
    run_warpformer times fp16, tokens compared with fp16 warpformer's and last-position prompt
    logits (``fp16_logits``, LOGITS_CFG) with fp16's."""
    from warpformer.config import QuantScheme
    from warpformer.weight_quant import quantize_weights

    host = {name: t.cpu() for name, t in weights.items()}
    weights.clear()
    free_gpu()
    for mode in args.weight_quant:
        scheme = QuantScheme(mode)
        try:
            qconfig, stored = quantize_weights(config, host, scheme, device="cuda")
        except Exception as exc:  # noqa: BLE001 - record and go on
            for cfg in cfgs:
                new_row(f"warpformer-{mode}", cfg).error = f"quantize: {short_error(exc)}"
            continue
        err = None
        if fp16_logits is not None:
            try:
                err = logits_rel_err(last_logits(stored, qconfig, shape, args.seed), fp16_logits)
            except Exception as exc:  # noqa: BLE001
                log(f"[{shape.name}] {mode} logits: {short_error(exc)}")
        for cfg in cfgs:
            row = new_row(f"warpformer-{mode}", cfg)
            row.logits_rel_err = err
            toks = _guard(row, run_warpformer, stored, qconfig, shape, row,
                          _prompts(shape, cfg, args.seed), args.repeats)
            ref = fp16_tokens.get(cfg)
            if toks is not None and ref is not None:
                row.agree_first_token_pct, row.agree_prefix_pct = agreement(toks, ref)
                row.note = "agreement: with fp16 warpformer's tokens"
            if err is not None:
                row.note = (row.note + "; " if row.note else "") + f"logits vs fp16: {err:.2e}"
        del stored
        free_gpu()


def _prompts(shape: ModelShape, cfg: tuple[int, int, int], seed: int) -> torch.Tensor:
    B, n_in, _ = cfg
    return make_prompts(shape.vocab, B, n_in, seed=seed * 7919 + B * 1000 + n_in)


def _guard(row: Row, fn, *args):
    """``fn(*args)`` for one configuration; on failure record the error in ``row``, free memory
    and return None."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - fail soft: the table shows the error
        row.error = short_error(exc)
        log(f"[{row.model}] {row.engine} B={row.batch} {row.input_len}/{row.output_len}: "
            f"{row.error}")
        if is_oom(exc):
            free_gpu()
        return None


if __name__ == "__main__":
    sys.exit(main())
