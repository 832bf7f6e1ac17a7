"""LAMBADA-shaped workload: warpformer against HF transformers eager, end to end.

5,153 synthetic samples (LAMBADA's test-set size) with LAMBADA-like token lengths, batches of 8
in dataset order (no length sorting, as FT's lambada example), bloom-560m dimensions, random fp16
weights, greedy decoding of each batch's longest target. Both engines see the same token ids:
warpformer right-padded with per-row lengths, HF left-padded with an attention mask (its batched
generate convention). Timed end to end over all batches (host -> device copies, generate, the
device -> host copy of the outputs), after a few warm-up batches. warpformer is timed twice on
one instance: through the TorchScript class (``warpformer``: packed GPU tensors in, GPU tensors
out) and through ``warpformer.GPT.generate`` on token lists (``warpformer-api``: what ``warpformer
lambada`` and Python users call, input checks and list outputs included). ``--in-flight 1,2,3`` (the
default; ``none`` to skip) adds rows ``warpformer-in-flight-N``: ``GPT.generate_batches`` on the
token lists with N batches on the GPU at once (N engine instances over the same weights, a CUDA
stream each; the batches, the batch size and the tokens are the same; each row after an untimed
pass over all batches, which builds the replicas and meets every prompt row count). Reported: the
times, the speedups, peak memory and the agreement of the generated target tokens.

Length model (synthetic; no dataset is downloaded): context tokens ~ lognormal with mean 80 and
standard deviation 28, rounded and clipped to [16, 256] (LAMBADA passages average ~4.6 sentences,
~80 tokens); target = the passage's last word, 1, 2 or 3 tokens with probabilities 0.70, 0.22,
0.08 (most words are one token in BLOOM's 250k vocabulary). Fixed seed.

FT's reference figures for this workload: 13.0 s vs 146.7 s for HF (FT's seed article, A800);
10.84 s vs 23.37 s (FT's docs).

    python benchmarks/bench_lambada.py [--samples 1000] [--skip-hf] [--in-flight 1,2,3] [--dry-run]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from common import (
    DEFAULT_CACHE_DIR,
    DEFAULT_RESULTS_DIR,
    SHAPES,
    env_info,
    fnum,
    free_gpu,
    fx,
    gpu_name,
    log,
    md_table,
    prepare_model,
    result_stem,
    short_error,
    write_results,
)

LAMBADA_SAMPLES = 5153
CTX_MEAN, CTX_STD, CTX_MIN, CTX_MAX = 80.0, 28.0, 16, 256
TARGET_LENS, TARGET_P = (1, 2, 3), (0.70, 0.22, 0.08)
FT_REFERENCE = [("FT seed article (A800)", 13.0, 146.7), ("FT docs", 10.84, 23.37)]


@dataclass
class Sample:
    context: np.ndarray  # int32 [n] token ids
    target_len: int


# --------------------------------------------------------------------------- the workload
def context_lengths(n: int, rng: np.random.Generator) -> np.ndarray:
    """Lognormal lengths with mean CTX_MEAN and std CTX_STD, rounded, clipped."""
    sigma2 = math.log(1 + (CTX_STD / CTX_MEAN) ** 2)
    mu = math.log(CTX_MEAN) - sigma2 / 2
    x = rng.lognormal(mu, math.sqrt(sigma2), n)
    return np.clip(np.rint(x), CTX_MIN, CTX_MAX).astype(np.int64)


def make_samples(n: int, vocab: int, seed: int = 0) -> list[Sample]:
    """``n`` synthetic samples: ids in [3, vocab - 1) (vocab - 1 is warpformer's end_id)."""
    rng = np.random.default_rng(seed)
    lengths = context_lengths(n, rng)
    targets = rng.choice(TARGET_LENS, size=n, p=TARGET_P)
    return [Sample(rng.integers(3, vocab - 1, size=int(n_ctx), dtype=np.int32), int(t))
            for n_ctx, t in zip(lengths, targets, strict=True)]


def make_batches(n: int, batch: int) -> list[list[int]]:
    """Consecutive index groups of ``batch`` (the last may be shorter)."""
    return [list(range(i, min(i + batch, n))) for i in range(0, n, batch)]


def workload_stats(samples: list[Sample], batches: list[list[int]]) -> dict[str, float]:
    ctx = np.array([len(s.context) for s in samples])
    tgt = np.array([s.target_len for s in samples])
    padded = sum(len(b) * max(len(samples[i].context) for i in b) for b in batches)
    steps = sum(max(samples[i].target_len for i in b) for b in batches)
    return {"samples": len(samples), "batches": len(batches), "context_mean": float(ctx.mean()),
            "context_std": float(ctx.std()), "context_p5": float(np.percentile(ctx, 5)),
            "context_p50": float(np.percentile(ctx, 50)),
            "context_p95": float(np.percentile(ctx, 95)), "context_max": int(ctx.max()),
            "target_mean": float(tgt.mean()), "padding_efficiency": float(ctx.sum() / padded),
            "generated_steps": int(steps)}


def pack(samples: list[Sample], idx: list[int], left: bool,
         pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids int32 [b, S], lengths int32 [b]) right-padded, or (ids [b, S], attention mask) with
    the padding on the left."""
    S = max(len(samples[i].context) for i in idx)
    ids = torch.full((len(idx), S), pad, dtype=torch.int32)
    mask = torch.zeros((len(idx), S), dtype=torch.int32)
    for row, i in enumerate(idx):
        ctx = torch.from_numpy(samples[i].context)
        if left:
            ids[row, S - len(ctx):] = ctx
            mask[row, S - len(ctx):] = 1
        else:
            ids[row, : len(ctx)] = ctx
    if left:
        return ids, mask
    return ids, torch.tensor([len(samples[i].context) for i in idx], dtype=torch.int32)


def agreement(a: list[list[int]], b: list[list[int]]) -> dict[str, float]:
    """Token-level and sample-level (all target tokens equal) agreement, in %."""
    tokens = sum(len(x) for x in a)
    same = sum(int(p == q) for x, y in zip(a, b, strict=True) for p, q in zip(x, y, strict=True))
    exact = sum(int(x == y) for x, y in zip(a, b, strict=True))
    first = sum(int(x[:1] == y[:1]) for x, y in zip(a, b, strict=True))
    n = max(len(a), 1)
    return {"token_pct": 100 * same / max(tokens, 1), "sample_exact_pct": 100 * exact / n,
            "first_token_pct": 100 * first / n}


# --------------------------------------------------------------------------- engines
def _timed_loop(step, batches: list[list[int]], warmup: int) -> tuple[float, float, list]:
    """(seconds, peak GB, outputs): ``step(i)`` for every batch after ``warmup`` untimed ones."""
    for i in range(min(warmup, len(batches))):
        step(i)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    outs = []
    t0 = time.perf_counter()
    for i in range(len(batches)):
        outs.append(step(i))
    torch.cuda.synchronize()
    return time.perf_counter() - t0, torch.cuda.max_memory_allocated() / 1e9, outs


def _timed_batches(gpt: Any, lists: list[list[list[int]]], out_lens: list[int], end_id: int,
                   in_flight: int) -> tuple[float, float, list[list[list[int]]]]:
    """(seconds, peak GB, each batch's generated rows) of ``GPT.generate_batches`` over every
    batch with ``in_flight`` batches on the GPU at once, after one untimed pass over all of
    them (so that every engine instance has been built and has met every prompt row count, as
    the engine of the one-at-a-time rows has by then)."""
    def run(count: int) -> list[list[list[int]]]:
        outs = gpt.generate_batches(lists[:count], out_lens[:count], in_flight=in_flight,
                                    end_id=end_id)
        return [[t[0] for t in out.tokens] for out in outs]

    run(len(lists))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    outs = run(len(lists))
    torch.cuda.synchronize()
    return time.perf_counter() - t0, torch.cuda.max_memory_allocated() / 1e9, outs


def run_warpformer(model_dir: Path, samples: list[Sample], batches: list[list[int]],
                   batch: int, end_id: int, warmup: int,
                   ab_options: dict[str, Any] | None = None, in_flight: tuple[int, ...] = ()
                   ) -> dict[str, tuple[float, float, list[list[int]]]]:
    """(seconds, peak GB, tokens) of one engine instance, called two ways: ``warpformer``, the
    TorchScript class's ``generate`` on packed GPU tensors, and ``warpformer-api``,
    ``warpformer.GPT.generate`` on token lists as ``warpformer lambada`` calls it (its input
    checks, option handling and list outputs included). With ``ab_options`` (``EngineOptions``
    keywords), a second instance over the same weights built with them (``B``, labelled by
    ``ab_label``), warmed by one untimed pass, and four more passes of the class's ``generate``
    alternating between the two instances: ``warpformer-again-K`` and ``warpformer-B-K`` for
    K = 1, 2, an A/B in which both sides have met every GEMM shape of the workload; and each
    in-flight row again on that instance (``warpformer-in-flight-N-B``, right after the row
    without it; its replicas take its options). The peak memory of every row timed once the
    second instance exists counts both instances."""
    from warpformer.gpt import GPT
    from warpformer.models.gpt import build_gpt_model
    from warpformer.options import EngineOptions
    from warpformer.weights import load_weights, read_config

    config = read_config(model_dir)
    weights = load_weights(model_dir, dtype=torch.float16, device="cuda")
    max_len = max(len(s.context) for s in samples) + max(TARGET_LENS)

    def build(options: dict[str, Any]) -> Any:
        return build_gpt_model(config, weights, dtype=torch.float16, max_batch=batch,
                               max_seq_len=max_len, options=EngineOptions(**options))

    engine = build({})
    packed = [pack(samples, b, left=False) for b in batches]
    out_lens = [max(samples[i].target_len for i in b) for b in batches]

    def stepper(eng: Any):
        def step(i: int) -> torch.Tensor:
            ids, lens = packed[i]
            out, _ = eng.generate(ids.cuda(), lens.cuda(), out_lens[i], end_id)
            return out.cpu()
        return step

    def class_tokens(outs: list[torch.Tensor]) -> list[list[int]]:
        """Each sample's generated target tokens from the class's [batch, 1, len] outputs."""
        toks: list[list[int]] = [[] for _ in samples]
        for (_, lens), out, b in zip(packed, outs, batches, strict=True):
            for row, i in enumerate(b):
                n = int(lens[row])
                toks[i] = out[row, 0, n: n + samples[i].target_len].tolist()
        return toks

    results = {}
    seconds, peak, outs = _timed_loop(stepper(engine), batches, warmup)
    results["warpformer"] = (seconds, peak, class_tokens(outs))

    def api(eng: Any) -> GPT:
        return GPT(eng, config, "cuda", torch.float16, torch.device("cuda"))

    gpt = api(engine)
    lists = [[samples[i].context.tolist() for i in b] for b in batches]

    def api_step(i: int) -> list[list[int]]:
        out = gpt.generate(lists[i], out_lens[i], end_id=end_id)
        return [t[0] for t in out.tokens]

    def list_tokens(outs: list[list[list[int]]]) -> list[list[int]]:
        """Each sample's generated target tokens from per-batch token lists."""
        toks: list[list[int]] = [[] for _ in samples]
        for out, b in zip(outs, batches, strict=True):
            for row, i in enumerate(b):
                toks[i] = out[row][: samples[i].target_len]
        return toks

    seconds, peak, outs = _timed_loop(api_step, batches, warmup)
    results["warpformer-api"] = (seconds, peak, list_tokens(outs))

    sides = [("", gpt)]
    if ab_options is not None:
        label = ab_label(ab_options)
        other = build(ab_options)
        _timed_loop(stepper(other), batches, warmup)  # untimed: plans every GEMM shape
        for k in (1, 2):
            for name, eng in (("again", engine), (label, other)):
                seconds, peak, outs = _timed_loop(stepper(eng), batches, warmup)
                results[f"warpformer-{name}-{k}"] = (seconds, peak, class_tokens(outs))
        sides.append((f"-{label}", api(other)))
    for n in in_flight:
        for suffix, side in sides:
            seconds, peak, outs = _timed_batches(side, lists, out_lens, end_id, n)
            results[f"warpformer-in-flight-{n}{suffix}"] = (seconds, peak, list_tokens(outs))
    return results


def run_hf(hf, samples: list[Sample], batches: list[list[int]],
           warmup: int) -> tuple[float, float, list[list[int]]]:
    packed = [pack(samples, b, left=True) for b in batches]
    out_lens = [max(samples[i].target_len for i in b) for b in batches]

    def step(i: int) -> torch.Tensor:
        ids, mask = packed[i]
        n = out_lens[i]
        out = hf.generate(input_ids=ids.to("cuda", torch.long), attention_mask=mask.cuda(),
                          do_sample=False, num_beams=1, min_new_tokens=n, max_new_tokens=n,
                          pad_token_id=0, use_cache=True)
        return out[:, ids.shape[1]:].cpu()

    seconds, peak, outs = _timed_loop(step, batches, warmup)
    tokens: list[list[int]] = [[] for _ in samples]
    for out, b in zip(outs, batches, strict=True):
        for row, i in enumerate(b):
            tokens[i] = out[row, : samples[i].target_len].tolist()
    return seconds, peak, tokens


# --------------------------------------------------------------------------- driver
# The engine options --ab-options may set (warpformer.options.EngineOptions), each parsed from
# its text; peer_allreduce is left out: this benchmark runs one GPU, where it changes nothing.
AB_OPTIONS = ("cuda_graphs", "prefill_tokens", "gemm_config")


def _option_value(name: str, text: str) -> Any:
    if name == "cuda_graphs":
        if text not in ("True", "False", "true", "false", "1", "0"):
            raise ValueError(f"cuda_graphs must be True or False, got {text!r}")
        return text in ("True", "true", "1")
    if name == "prefill_tokens":
        if not text.isdigit():
            raise ValueError(f"prefill_tokens must be a number of tokens, got {text!r}")
        return int(text)
    if not Path(text).is_file():
        raise ValueError(f"gemm_config: no file {text!r}")
    return text


def _ab_options(text: str) -> dict[str, Any]:
    """``"cuda_graphs=False,prefill_tokens=512"`` -> EngineOptions keywords, checked by
    ``EngineOptions`` itself; the error names the rule (argparse adds the argument)."""
    options: dict[str, Any] = {}
    try:
        for item in text.split(","):
            name, sep, value = (x.strip() for x in item.partition("="))
            if not sep or not name or not value:
                raise ValueError(f"expected NAME=VALUE, got {item.strip()!r}")
            if name not in AB_OPTIONS:
                raise ValueError(f"{name} is not an engine option this A/B can set; NAME is one "
                                 f"of {', '.join(AB_OPTIONS)}")
            if name in options:
                raise ValueError(f"{name} is given twice")
            options[name] = _option_value(name, value)
        from warpformer.options import EngineOptions

        if EngineOptions(**options) == EngineOptions():
            raise ValueError("these are the default options: both sides would run alike")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return options


def ab_label(options: dict[str, Any]) -> str:
    """The row-name part of an --ab-options instance: ``cuda_graphs=False,prefill_tokens=512``
    (a tuning file by its name only)."""
    return ",".join(f"{k}={Path(v).name if k == 'gemm_config' else v}"
                    for k, v in options.items())


def _counts(text: str) -> tuple[int, ...]:
    if text.strip().lower() == "none":
        return ()
    try:
        counts = tuple(int(x) for x in text.split(","))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected N[,N...] with every N >= 1, or none; got "
                                         f"{text!r}")
    return counts


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=None,
                    help=f"number of samples (default {LAMBADA_SAMPLES}; --quick 1000)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--model", choices=list(SHAPES), default="bloom-560m")
    ap.add_argument("--layers", type=int, default=None, help="truncate the model to N layers")
    ap.add_argument("--warmup", type=int, default=4, help="untimed batches before each engine")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR)
    ap.add_argument("--out-dir", type=Path, default=DEFAULT_RESULTS_DIR)
    ap.add_argument("--quick", action="store_true", help="1000 samples")
    ap.add_argument("--dry-run", action="store_true", help="print the workload; no GPU")
    ap.add_argument("--ab-options", type=_ab_options, default=None, metavar="NAME=VALUE[,...]",
                    help="A/B: a second engine instance over the same weights built with these "
                         "engine options (e.g. cuda_graphs=False, prefill_tokens=512, "
                         "gemm_config=FILE), then four passes of the class's generate "
                         "alternating between the two instances, and each --in-flight row "
                         "again on the second")
    ap.add_argument("--in-flight", type=_counts, default=(1, 2, 3), metavar="N[,N...]|none",
                    help="also time GPT.generate_batches on token lists with N batches in "
                         "flight (N engine instances over the same weights, a CUDA stream "
                         "each), after an untimed pass; default 1,2,3")
    args = ap.parse_args(argv)
    if args.samples is None:
        args.samples = 1000 if args.quick else LAMBADA_SAMPLES
    if args.samples < 1 or args.batch < 1 or (args.layers is not None and args.layers < 1):
        ap.error("--samples, --batch and --layers must be >= 1")
    args.shape = SHAPES[args.model].with_layers(args.layers)
    return args


def stats_table(stats: dict[str, float]) -> str:
    return md_table(["samples", "batches", "context mean", "std", "p5 / p50 / p95 / max",
                     "target mean", "padding efficiency", "decode steps"],
                    [[stats["samples"], stats["batches"], fnum(stats["context_mean"], 1),
                      fnum(stats["context_std"], 1),
                      f"{stats['context_p5']:.0f} / {stats['context_p50']:.0f} / "
                      f"{stats['context_p95']:.0f} / {stats['context_max']}",
                      fnum(stats["target_mean"]), f"{100 * stats['padding_efficiency']:.0f}%",
                      stats["generated_steps"]]])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    shape = args.shape
    samples = make_samples(args.samples, shape.vocab, args.seed)
    batches = make_batches(len(samples), args.batch)
    stats = workload_stats(samples, batches)
    if args.dry_run:
        print(f"## LAMBADA-shaped workload (dry run), {shape.name}, {shape.layers} layers\n")
        print(stats_table(stats))
        return 0
    if not torch.cuda.is_available():
        print("bench_lambada: no CUDA device visible; use --dry-run", file=sys.stderr)
        return 2
    import warpformer  # noqa: F401

    if not args.skip_hf:
        import transformers

        transformers.logging.set_verbosity_error()
    gpu, env = gpu_name(), env_info()
    results: dict[str, dict[str, Any]] = {}
    tokens: dict[str, list[list[int]]] = {}
    prep = prepare_model(shape, args.cache_dir, args.seed, need_hf=not args.skip_hf)
    if prep.hf is not None:
        hf, prep.hf = prep.hf, None
        log(f"HF eager: {len(batches)} batches")
        try:
            sec, peak, tokens["hf-eager"] = run_hf(hf, samples, batches, args.warmup)
            results["hf-eager"] = {"seconds": sec, "peak_gb": peak}
        except Exception as exc:  # noqa: BLE001 - fail soft
            results["hf-eager"] = {"error": short_error(exc)}
        results["hf-eager"]["attn"] = getattr(hf.config, "_attn_implementation", None)
        del hf
        free_gpu()
    log(f"warpformer: {len(batches)} batches, engine.generate then GPT.generate")
    try:
        for name, (sec, peak, toks) in run_warpformer(
                prep.model_dir, samples, batches, args.batch, shape.vocab - 1,
                args.warmup, args.ab_options, args.in_flight).items():
            results[name], tokens[name] = {"seconds": sec, "peak_gb": peak}, toks
    except Exception as exc:  # noqa: BLE001
        results["warpformer"] = {"error": short_error(exc)}
    free_gpu()

    hf_s = results.get("hf-eager", {}).get("seconds")
    speedups = {name: hf_s / r["seconds"] for name, r in results.items()
                if name.startswith("warpformer") and hf_s and r.get("seconds")}
    speedup = speedups.get("warpformer")
    body = []
    for name, r in results.items():
        body.append([name, fnum(r.get("seconds")), fnum(len(samples) / r["seconds"], 0)
                     if r.get("seconds") else "—", fnum(r.get("peak_gb")),
                     fx(speedups[name]) if name in speedups else "—", r.get("error", "")])
    table = md_table(["engine", "time s", "samples/s", "peak GB", "speedup vs HF", "note"],
                     body, align="lrrrrl")
    lines, agree = [], None
    for name in ("warpformer", "warpformer-api"):
        if name in tokens and "hf-eager" in tokens:
            a = agreement(tokens[name], tokens["hf-eager"])
            agree = agree or a
            lines.append(f"agreement of the generated target tokens ({name} vs HF eager): "
                         f"{a['token_pct']:.1f}% of tokens, {a['sample_exact_pct']:.1f}% of "
                         f"samples exact, first token {a['first_token_pct']:.1f}%")
    for name in tokens:
        if name.startswith("warpformer-") and "warpformer" in tokens:
            same = tokens["warpformer"] == tokens[name]
            lines.append(f"{name} tokens {'equal' if same else 'DIFFER FROM'} warpformer's")
    agree_line = "\n\n".join(lines) or "agreement: — (needs both engines)"
    ft = md_table(["FT reference", "FT s", "HF s", "speedup"],
                  [[n, fnum(a), fnum(b), fx(b / a)] for n, a, b in FT_REFERENCE])
    doc = "\n\n".join([
        f"## LAMBADA-shaped workload on {gpu}, {env['date']}",
        f"{shape.name} dims, {shape.layers} layers, fp16, batch {args.batch}, greedy; "
        f"torch {env['torch']}, transformers {env['transformers']}, commit {env['commit']}",
        stats_table(stats), table, agree_line, ft])
    payload = {"benchmark": "lambada", "env": env, "model": shape.name, "layers": shape.layers,
               "batch": args.batch, "seed": args.seed, "workload": stats,
               "length_model": {"context": f"lognormal mean {CTX_MEAN} std {CTX_STD} clipped "
                                           f"[{CTX_MIN}, {CTX_MAX}]",
                                "target_lengths": TARGET_LENS, "target_p": TARGET_P},
               "results": results, "speedup": speedup, "speedups": speedups,
               "agreement": agree,
               "ft_reference": [{"source": n, "ft_s": a, "hf_s": b} for n, a, b in FT_REFERENCE]}
    json_path, md_path = write_results(args.out_dir, result_stem("lambada", gpu), payload, doc)
    print(doc)
    print(f"\nresults: {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
