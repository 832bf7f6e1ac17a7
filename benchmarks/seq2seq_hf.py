"""bench_seq2seq.py's HF side: random T5 models drawn with HF's own initialisation, and the HF eager
and HF static cache + compile phases."""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from seq2seq_common import (  # noqa: E402
    DTYPES,
    Peak,
    Row,
    T5Shape,
    agreement,
    fail,
    inputs,
    time_calls,
)


def hf_reps(batch: int, beam: int, args: argparse.Namespace) -> int:
    """Timed HF calls of a configuration: ``--hf-repeats``, once at ``--hf-once-rows``."""
    return 1 if batch * beam >= args.hf_once_rows else args.hf_repeats


def compiled_order(rows: list[Row]) -> list[Row]:
    """HF compiled rows in the order they are attempted: small batches first, beam 1 first."""
    return sorted(rows, key=lambda r: (r.batch, r.beam))


def share_deadline(elapsed: float, budget_s: float, models_left: int) -> float:
    """The elapsed time by which one model's optional work must end: an equal share of what is
    left of the budget per model still to run (unlimited budget: infinity)."""
    if budget_s <= 0:
        return math.inf
    return elapsed + max(0.0, budget_s - elapsed) / max(1, models_left)


def eager_call_guess_s(shape: T5Shape, output_len: int, beam: int) -> float:
    """Seconds of one HF eager generate before any was measured (launch-bound decoder steps)."""
    return output_len * (1.0 + 0.6 * shape.decoder_layers) * (1.3 if beam > 1 else 1.0) / 1e3


def compile_guess_s(shape: T5Shape) -> float:
    """Seconds of HF's first compiled generate (compile + CUDA-graph records) before any ran
    (bench_generate.py measured 35-38 s for llama-3-8b's 32 layers on an H200)."""
    return 20.0 + 2.0 * shape.decoder_layers


# --------------------------------------------------------------------------- random models
def hf_config(shape: T5Shape):
    """The transformers T5Config of ``shape`` (original T5: ReLU, tied, d_model ** -0.5)."""
    import transformers

    return transformers.T5Config(
        vocab_size=shape.vocab, d_model=shape.d_model, d_kv=shape.d_kv, d_ff=shape.d_ff,
        num_layers=shape.layers, num_decoder_layers=shape.decoder_layers,
        num_heads=shape.heads, relative_attention_num_buckets=shape.buckets,
        relative_attention_max_distance=shape.max_distance, feed_forward_proj="relu",
        tie_word_embeddings=True, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0,
        eos_token_id=1)


def init_std(name: str, shape: T5Shape) -> float | None:
    """HF's ``T5PreTrainedModel._init_weights`` standard deviation of parameter ``name``
    (initializer_factor 1); None: a norm gain, set to 1. Raises ValueError for a name no rule
    covers."""
    d, dkv, heads = shape.d_model, shape.d_kv, shape.heads
    if name.endswith("layer_norm.weight"):  # every block's norms and both final norms
        return None
    if name in ("shared.weight", "lm_head.weight") or name.endswith("embed_tokens.weight"):
        return 1.0
    if name.endswith("relative_attention_bias.weight"):
        return d ** -0.5
    parts = name.split(".")
    module = parts[-2] if len(parts) >= 2 and parts[-1] == "weight" else ""
    rules = {"q": (d * dkv) ** -0.5, "k": d ** -0.5, "v": d ** -0.5, "o": (heads * dkv) ** -0.5,
             "wi": d ** -0.5, "wi_0": d ** -0.5, "wi_1": d ** -0.5, "wo": shape.d_ff ** -0.5}
    if module not in rules:
        raise ValueError(f"no initialisation rule for parameter {name!r}")
    return rules[module]


def randomize_(model: torch.nn.Module, shape: T5Shape, seed: int) -> None:
    """Deterministic random weights with HF's T5 standard deviations (a generator per parameter
    on its device, seeded from ``seed`` and the name); the embedding row ``vocab - 1`` (the tied
    head's row too) is zeroed, so that token's logit is 0 and never the argmax nor in a beam's
    candidates."""
    never = shape.vocab - 1
    with torch.no_grad():
        for name, p in model.named_parameters():
            std = init_std(name, shape)
            if std is None:
                p.fill_(1.0)
                continue
            gen = torch.Generator(device=p.device)
            gen.manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (1 << 62))
            noise = torch.randn(p.shape, generator=gen, device=p.device, dtype=torch.float32)
            p.copy_(noise.mul_(std))
            del noise
        model.get_input_embeddings().weight[never].zero_()
        head = model.get_output_embeddings()
        if head is not None:
            head.weight[never].zero_()


def build_hf(shape: T5Shape, dtype: torch.dtype, device: str, seed: int) -> torch.nn.Module:
    """A random-init HF T5 of ``shape`` built directly on ``device`` in ``dtype`` (every
    parameter, ``wo`` included), in eval mode."""
    import transformers

    cfg = hf_config(shape)
    prev = torch.get_default_dtype()
    try:
        torch.set_default_dtype(dtype)
    except (TypeError, RuntimeError):  # a dtype torch refuses as default: build, then cast
        pass
    try:
        with torch.device(device):
            model = transformers.T5ForConditionalGeneration(cfg)
    finally:
        torch.set_default_dtype(prev)
    model = model.to(dtype).eval().requires_grad_(False)
    randomize_(model, shape, seed)
    return model


def scratch_need_bytes(shapes: list[T5Shape], dtype_name: str) -> float:
    """Disk the largest model needs while converting: its HF checkpoint and the converted copy
    (with the separate head file), plus 1 GB."""
    per = torch.empty((), dtype=DTYPES[dtype_name]).element_size()
    return 2.2 * max(s.param_count() for s in shapes) * per + (1 << 30)


def pick_scratch_base(candidates: list[Path], need: float,
                      free: Callable[[Path], float] | None = None) -> Path:
    """The first existing candidate folder with ``need`` bytes free (else the one with the
    most free space): where the scratch folder goes when --work-dir is not given."""
    free = free or (lambda p: shutil.disk_usage(p).free)
    best, best_free = None, -1.0
    for c in candidates:
        try:
            f = float(free(c))
        except OSError:
            continue
        if f >= need:
            return c
        if f > best_free:
            best, best_free = c, f
    if best is None:
        raise RuntimeError(f"none of {', '.join(map(str, candidates))} is usable for scratch")
    return best


def convert_model(hf: torch.nn.Module, shape: T5Shape, dtype_name: str, scratch: Path) -> Path:
    """``hf`` saved with save_pretrained and converted with warpformer.converters into
    ``scratch``; the HF folder is removed. Returns the converted ``1-gpu`` folder."""
    from warpformer.converters import convert

    nbytes = shape.param_count() * torch.empty((), dtype=DTYPES[dtype_name]).element_size()
    scratch.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(scratch).free
    need = 2.2 * nbytes + (1 << 30)
    if free < need:
        raise RuntimeError(f"not enough disk under {scratch}: {free / 1e9:.1f} GB free, "
                           f"{need / 1e9:.1f} GB needed to save and convert {shape.name}; "
                           "pass --work-dir")
    hf_dir, out_root = scratch / f"{shape.name}-hf", scratch / f"{shape.name}-converted"
    shutil.rmtree(hf_dir, ignore_errors=True)
    try:
        hf.save_pretrained(hf_dir)
        summary = convert(hf_dir, out_root, tensor_para_size=1, data_type=dtype_name,
                          processes=4 if nbytes > 2e9 else 1, force=True)
    finally:
        shutil.rmtree(hf_dir, ignore_errors=True)
    return Path(getattr(summary, "output_dir", out_root / "1-gpu"))


# --------------------------------------------------------------------------- HF
def hf_generate(hf: Any, ids: torch.Tensor, mask: torch.Tensor, n: int, beam: int,
                extra: dict[str, Any]) -> torch.Tensor:
    """HF generate of exactly ``n`` new tokens (eos disabled in the generation config)."""
    with torch.no_grad():
        return hf.generate(input_ids=ids, attention_mask=mask, do_sample=False, num_beams=beam,
                           num_return_sequences=1, min_new_tokens=n, max_new_tokens=n,
                           use_cache=True, **extra)


def prepare_hf(shape: T5Shape, args: argparse.Namespace, device: str,
               models: dict[str, Any]) -> Any:
    hf = build_hf(shape, DTYPES[args.dtype], device, args.seed)
    hf.generation_config.eos_token_id = None  # every call generates exactly its max_new_tokens
    fp = common.fingerprint(hf)
    want = models.get(shape.name, {}).get("fingerprint")
    if want is not None and fp != want:
        common.log(f"[{shape.name}] WARNING: the rebuilt HF model's weights differ from the "
                   "converted ones (fingerprint); the comparison is not on identical weights")
        models[shape.name]["rebuild_mismatch"] = True
    return hf


def run_hf_eager(hf: Any, row: Row, shape: T5Shape, args: argparse.Namespace, cuda: bool,
                 device: str) -> torch.Tensor:
    """Fills ``row.hf_eager``; returns the generated tokens [B, out] (CPU)."""
    n, t = row.output_len, row.hf_eager
    ids, _, mask = inputs(shape, row.batch, row.input_len, args.seed, device)
    ids = ids.long()
    reps = hf_reps(row.batch, row.beam, args)
    hf_generate(hf, ids, mask, 2, row.beam, {})  # warm-up: kernels, allocator
    one, _ = time_calls(lambda: hf_generate(hf, ids, mask, 1, row.beam, {}), reps=reps,
                        cuda=cuda)
    peak = Peak(cuda)
    peak.start()
    samples, out = time_calls(lambda: hf_generate(hf, ids, mask, n, row.beam, {}), reps=reps,
                              cuda=cuda, cap_s=args.hf_row_cap_s)
    t.peak_gb = peak.gb()
    t.samples_ms, t.ms = samples, common.median(samples)
    t.one_samples_ms, t.one_ms = one, common.median(one)
    t.full_length = tuple(out.shape) == (row.batch, 1 + n)
    if not t.full_length:
        t.note = f"SHORT OUTPUT {tuple(out.shape)}: timings not comparable"
    return out[:, 1:].cpu()


def cache_kwarg(hf: Any) -> str:
    """generate's name for a cache object: ``cache`` where the model's forward takes it (newer
    transformers 5), else ``past_key_values``."""
    import inspect

    try:
        params = inspect.signature(hf.forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params and "past_key_values" not in params else "past_key_values"


def static_cache_attempts(hf: Any, row: Row) -> list[tuple[dict[str, Any], Any, str]]:
    """The ways to ask HF for a static cache and a compiled forward, in order:
    (generate kwargs, untimed setup before each call or None, note). First one
    ``EncoderDecoderCache`` of two ``StaticCache`` made here and reset between calls (the
    compiled step's CUDA graphs then see the same buffers every call); then
    ``cache_implementation="static"`` (generate makes a new cache per call)."""
    from transformers import CompileConfig

    cc = CompileConfig(fullgraph=False, mode="reduce-overhead")
    attempts: list[tuple[dict[str, Any], Any, str]] = []
    try:
        from transformers import EncoderDecoderCache, StaticCache

        cache = EncoderDecoderCache(
            StaticCache(config=hf.config, max_cache_len=row.output_len + 1),
            StaticCache(config=hf.config, max_cache_len=row.input_len))
        attempts.append(({cache_kwarg(hf): cache, "compile_config": cc}, cache.reset,
                         "static cache (reset between calls)"))
    except Exception as exc:  # noqa: BLE001 - another transformers: the generation-config way
        common.log(f"[{row.model}] StaticCache made by hand failed ({common.short_error(exc)}); "
                   "using cache_implementation='static'")
    attempts.append(({"cache_implementation": "static", "compile_config": cc}, None,
                     "cache_implementation='static'"))
    return attempts


def run_hf_compiled(hf: Any, row: Row, shape: T5Shape, args: argparse.Namespace, cuda: bool,
                    device: str) -> torch.Tensor:
    """Fills ``row.hf_compiled`` (static cache + torch.compile mode reduce-overhead, through
    generate's compile_config) and returns its tokens [B, out] (CPU); raises the last attempt's
    error when every attempt failed."""
    n, t = row.output_len, row.hf_compiled
    ids, _, mask = inputs(shape, row.batch, row.input_len, args.seed, device)
    ids = ids.long()
    errors = []
    for extra, setup, note in static_cache_attempts(hf, row):
        try:
            t0 = time.monotonic()
            if setup:
                setup()
            hf_generate(hf, ids, mask, n, row.beam, extra)  # compile + record CUDA graphs
            if cuda:
                torch.cuda.synchronize()
            t.first_call_s = time.monotonic() - t0
        except Exception as exc:  # noqa: BLE001 - the next attempt, or n/a
            errors.append(common.short_error(exc))
            common.log(f"[{row.model}] HF compiled B={row.batch} beam {row.beam} ({note}): "
                       f"{errors[-1]}")
            if common.is_oom(exc):
                common.free_gpu()
            continue
        t.compiled = getattr(hf, "_compiled_call", None) is not None
        t.note = note if t.compiled else f"{note}; HF did not compile (ran eager)"
        if errors:
            t.note += f"; first attempt: {errors[0]}"
        reps = hf_reps(row.batch, row.beam, args)
        peak = Peak(cuda)
        peak.start()
        samples, out = time_calls(lambda extra=extra: hf_generate(hf, ids, mask, n, row.beam,
                                                                  extra),
                                  reps=reps, cuda=cuda, warmup=1, setup=setup,
                                  cap_s=args.hf_row_cap_s)
        t.peak_gb = peak.gb()
        t.samples_ms, t.ms = samples, common.median(samples)
        t.full_length = tuple(out.shape) == (row.batch, 1 + n)
        if not t.full_length:
            t.note += f"; SHORT OUTPUT {tuple(out.shape)}: timings not comparable"
        return out[:, 1:].cpu()
    raise RuntimeError(errors[-1] if errors else "no way to ask HF for a static cache")


def eager_phase(shape: T5Shape, rows: list[Row], args: argparse.Namespace, budget: common.Budget,
                cuda: bool, device: str, models: dict[str, Any],
                tokens: dict[tuple[str, int, int], torch.Tensor],
                hf_tokens: dict[tuple[str, int, int], torch.Tensor],
                checkpoint: Callable[[], Any] = lambda: None) -> None:
    """HF eager rows of one model, each run only if the budget allows its estimated time;
    their tokens go to ``hf_tokens`` and are compared with warpformer's (``tokens``);
    ``checkpoint()`` after each row (the result files)."""
    hf = None
    try:
        est_call = eager_call_guess_s(shape, args.output_len, max(args.beams))
        for row in rows:
            calls = 2 * hf_reps(row.batch, row.beam, args) + 1
            if not budget.allows(calls * est_call):
                row.hf_eager.skipped = "time budget"
                common.log(f"[{shape.name}] HF eager B={row.batch} beam {row.beam}: skipped "
                           f"(time budget, t={budget.elapsed():.0f}s)")
                continue
            if hf is None:
                hf = prepare_hf(shape, args, device, models)
                models[shape.name]["hf_attn"] = getattr(hf.config, "_attn_implementation", None)
            t0 = time.monotonic()
            try:
                ref = hf_tokens[row.key] = run_hf_eager(hf, row, shape, args, cuda, device)
                ours = tokens.get(row.key)
                if ours is not None:
                    row.agree_first_pct, row.agree_prefix_pct = agreement(ours, ref)
                common.log(f"[{shape.name}] HF eager B={row.batch} beam {row.beam}: "
                           f"{row.hf_eager.ms:.1f} ms (t={budget.elapsed():.0f}s)")
            except Exception as exc:  # noqa: BLE001
                fail(row.hf_eager, exc, f"[{shape.name}] HF eager B={row.batch} beam {row.beam}")
            per_call = (time.monotonic() - t0) / max(1, len(row.hf_eager.samples_ms) + 1)
            est_call = max(est_call, 1.5 * per_call)
            checkpoint()
    finally:
        del hf
        common.free_gpu()


def compiled_phase(shape: T5Shape, rows: list[Row], args: argparse.Namespace,
                   budget: common.Budget, models_left: int, cuda: bool, device: str,
                   models: dict[str, Any],
                   hf_tokens: dict[tuple[str, int, int], torch.Tensor],
                   checkpoint: Callable[[], Any] = lambda: None) -> None:
    """HF compiled rows of one model within its share of what is left of the budget; their
    tokens are compared with HF eager's (``hf_tokens``): a row whose first tokens differ in more
    than 10% of the sequences says so. ``checkpoint()`` after each row run."""
    hf = None
    deadline = share_deadline(budget.elapsed(), args.budget_s, models_left)
    models.setdefault(shape.name, {})["compiled_deadline_s"] = (
        None if math.isinf(deadline) else deadline)
    firsts: list[float] = []
    try:
        for row in compiled_order(rows):
            est = max(firsts) if firsts else compile_guess_s(shape)
            est += (hf_reps(row.batch, row.beam, args) + 1) * max(
                1.0, (row.hf_eager.ms or 0.0) / 1e3)
            if budget.elapsed() + est > deadline:
                row.hf_compiled.skipped = "time budget"
                common.log(f"[{shape.name}] HF compiled B={row.batch} beam {row.beam}: skipped "
                           f"(time budget: ~{est:.0f} s needed, t={budget.elapsed():.0f}s)")
                continue
            if hf is None:
                hf = prepare_hf(shape, args, device, models)
            try:
                toks = run_hf_compiled(hf, row, shape, args, cuda, device)
                ref = hf_tokens.get(row.key)
                if ref is not None:
                    first, _ = agreement(toks, ref)
                    if first < 90:
                        row.hf_compiled.note += (f"; first tokens equal HF eager's in {first:.0f}%"
                                                 " of the sequences")
                if row.hf_compiled.first_call_s is not None:
                    firsts.append(row.hf_compiled.first_call_s)
                common.log(f"[{shape.name}] HF compiled B={row.batch} beam {row.beam}: "
                           f"{row.hf_compiled.ms:.1f} ms (first call "
                           f"{row.hf_compiled.first_call_s:.0f} s, t={budget.elapsed():.0f}s)")
            except Exception as exc:  # noqa: BLE001
                fail(row.hf_compiled, exc,
                     f"[{shape.name}] HF compiled B={row.batch} beam {row.beam}")
            checkpoint()
    finally:
        del hf
        common.reset_compiled()
