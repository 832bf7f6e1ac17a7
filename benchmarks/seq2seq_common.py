"""What bench_seq2seq.py's phases share: the model shapes, the decoder step's bandwidth floor, the
rows and their timings, timing and peak memory, and the report (tables, issue 51's targets)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

SPEC_GBPS = 4800.0  # H200 HBM3e specification (GB/s); the measured copy bandwidth is the other
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
MAX_BEAM = 16  # the engine's kMaxBeamWidth
# Issue 51's targets.
TARGET_EAGER = ("t5-base", 1, 4, 20.0)  # model, batch, beam, x HF eager
TARGET_FLOOR = ("t5-3b", 1, 1, 80.0)  # model, batch, beam, % of the step's bandwidth floor


# --------------------------------------------------------------------------- model shapes
@dataclass(frozen=True)
class T5Shape:
    """Dimensions of an original-T5 model (ReLU FFN, tied head, relative position buckets)."""

    name: str
    d_model: int
    d_kv: int
    d_ff: int
    layers: int  # encoder layers
    decoder_layers: int
    heads: int
    vocab: int = 32128
    buckets: int = 32
    max_distance: int = 128

    @property
    def inner(self) -> int:
        """Width of Q, K, V and of the attention output's input: heads * d_kv."""
        return self.heads * self.d_kv

    def encoder_layer_params(self) -> int:
        """Self-attention q, k, v, o; FFN wi, wo; two RMS norm gains."""
        d = self.d_model
        return 4 * d * self.inner + 2 * d * self.d_ff + 2 * d

    def decoder_layer_params(self) -> int:
        """Self-attention q, k, v, o; cross-attention q, k, v, o; FFN wi, wo; three norm gains."""
        d = self.d_model
        return 8 * d * self.inner + 2 * d * self.d_ff + 3 * d

    def param_count(self) -> int:
        """Parameters as HF counts them (the tied head once)."""
        d = self.d_model
        return (self.vocab * d + self.layers * self.encoder_layer_params()
                + self.decoder_layers * self.decoder_layer_params()
                + 2 * self.buckets * self.heads + 2 * d)

    def decoder_step_params(self) -> int:
        """Parameters one decoder step reads: every decoder layer but its cross-attention K and V
        projections (applied once, to the encoder output), the final norm and the lm_head
        (``vocab x d_model``: the tied embedding, read whole as the head). Gathered rows (the
        token embedding) and the relative-bias table (a few KB) are left out."""
        d = self.d_model
        per_layer = self.decoder_layer_params() - 2 * d * self.inner
        return self.decoder_layers * per_layer + self.vocab * d + d

    def cross_kv_bytes(self, batch: int, input_len: int, dtype_bytes: int = 2) -> int:
        """The cached cross-attention K and V of every decoder layer: one copy per input row
        (the engine's beams of a row share it)."""
        return self.decoder_layers * 2 * batch * input_len * self.inner * dtype_bytes

    def self_kv_bytes(self, rows: int, context: float, dtype_bytes: int = 2) -> float:
        """The decoder's self-attention K and V read by a step attending ``context`` tokens, for
        ``rows`` sequences (batch x beam)."""
        return self.decoder_layers * 2 * rows * context * self.inner * dtype_bytes


SHAPES: dict[str, T5Shape] = {s.name: s for s in (
    T5Shape("t5-base", 768, 64, 3072, 12, 12, 12),
    T5Shape("t5-3b", 1024, 128, 16384, 24, 24, 32),
    # A tiny model for CPU smoke runs (--backend reference); not in the default set.
    T5Shape("t5-tiny", 64, 16, 128, 2, 2, 4, vocab=512, buckets=8, max_distance=16),
)}
DEFAULT_MODELS = ("t5-base", "t5-3b")


# --------------------------------------------------------------------------- floor arithmetic
def mean_step_context(output_len: int) -> float:
    """Mean number of decoder tokens a timed step attends: the per-step time is taken over
    steps 2..out, and step s attends s tokens (the start token and s - 1 generated)."""
    return (output_len + 2) / 2


def step_bytes(shape: T5Shape, batch: int, beam: int, input_len: int, output_len: int,
               dtype_bytes: int = 2) -> float:
    """Bytes one decoder step must read: weights + cached cross K/V + self K/V."""
    return (shape.decoder_step_params() * dtype_bytes
            + shape.cross_kv_bytes(batch, input_len, dtype_bytes)
            + shape.self_kv_bytes(batch * beam, mean_step_context(output_len), dtype_bytes))


def floor_ms(nbytes: float, gbps: float | None) -> float | None:
    """Milliseconds to move ``nbytes`` at ``gbps`` GB/s (None when the bandwidth is unknown)."""
    if not gbps or gbps <= 0:
        return None
    return nbytes / (gbps * 1e9) * 1e3


def per_step_ms(full_ms: float | None, one_ms: float | None, output_len: int) -> float | None:
    """Decoder ms/step from a call generating ``output_len`` tokens and one generating 1 token
    (same inputs): (full - one) / (output_len - 1)."""
    if full_ms is None or one_ms is None or output_len < 2:
        return None
    return (full_ms - one_ms) / (output_len - 1)


def pct(floor: float | None, measured: float | None) -> float | None:
    """``floor`` as a percentage of ``measured`` (100% = at the floor)."""
    if floor is None or measured is None or measured <= 0:
        return None
    return 100.0 * floor / measured


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None unless both are positive."""
    return a / b if a is not None and b is not None and a > 0 and b > 0 else None


# --------------------------------------------------------------------------- rows
@dataclass
class Timing:
    """One engine's measurement of one configuration."""

    ms: float | None = None  # median ms of a full call (encode + output_len steps)
    one_ms: float | None = None  # median ms of a 1-token call (encode + the first step)
    samples_ms: list[float] = field(default_factory=list)
    one_samples_ms: list[float] = field(default_factory=list)
    peak_gb: float | None = None
    full_length: bool | None = None  # every row generated exactly output_len tokens
    first_call_s: float | None = None  # HF compiled: compile + first generate (wall clock)
    compiled: bool | None = None  # HF compiled: generate took its compiled path
    error: str | None = None  # the exception's first line (cell: n/a)
    skipped: str | None = None  # why it did not run (cell: skipped)
    note: str = ""

    def step_ms(self, output_len: int) -> float | None:
        return per_step_ms(self.ms, self.one_ms, output_len)


@dataclass
class Row:
    model: str
    batch: int
    beam: int
    input_len: int
    output_len: int
    wf: Timing = field(default_factory=Timing)
    hf_eager: Timing = field(default_factory=Timing)
    hf_compiled: Timing = field(default_factory=Timing)
    step_bytes: float | None = None
    floor_ms: float | None = None  # at the measured copy bandwidth
    floor_spec_ms: float | None = None  # at --spec-gbps
    agree_first_pct: float | None = None  # warpformer's best beam's first tokens vs HF eager's
    agree_prefix_pct: float | None = None  # mean common prefix of the two

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.model, self.batch, self.beam)

    @property
    def wf_step_ms(self) -> float | None:
        return self.wf.step_ms(self.output_len)

    @property
    def pct_floor(self) -> float | None:
        return pct(self.floor_ms, self.wf_step_ms)

    @property
    def pct_floor_spec(self) -> float | None:
        return pct(self.floor_spec_ms, self.wf_step_ms)

    @property
    def speedup_eager(self) -> float | None:
        return ratio(self.hf_eager.ms, self.wf.ms)

    @property
    def speedup_compiled(self) -> float | None:
        return ratio(self.hf_compiled.ms, self.wf.ms)

    def derived(self) -> dict[str, Any]:
        return {"wf_step_ms": self.wf_step_ms, "hf_eager_step_ms":
                self.hf_eager.step_ms(self.output_len), "pct_floor": self.pct_floor,
                "pct_floor_spec": self.pct_floor_spec, "speedup_eager": self.speedup_eager,
                "speedup_compiled": self.speedup_compiled}


def make_rows(args: argparse.Namespace) -> list[Row]:
    """Every (model, batch, beam) row in table order."""
    return [Row(s.name, b, k, args.input_len, args.output_len)
            for s in args.shapes for b in args.batches for k in args.beams]


def derive(row: Row, shape: T5Shape, copy_gbps: float | None, spec_gbps: float,
           dtype_bytes: int) -> None:
    """The row's step bytes and floors."""
    row.step_bytes = step_bytes(shape, row.batch, row.beam, row.input_len, row.output_len,
                                dtype_bytes)
    row.floor_ms = floor_ms(row.step_bytes, copy_gbps)
    row.floor_spec_ms = floor_ms(row.step_bytes, spec_gbps)


def agreement(ours: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(% rows whose first token matches, mean % common prefix) of two [B, n] token arrays."""
    n = min(ours.shape[1], ref.shape[1])
    same = (ours[:, :n].long() == ref[:, :n].long()).int()
    prefix = same.cumprod(dim=1).sum(dim=1).float()
    return float(same[:, 0].float().mean() * 100), float((prefix / n).mean() * 100)


# --------------------------------------------------------------------------- timing
def time_calls(fn: Callable[[], Any], *, reps: int, cuda: bool, warmup: int = 0,
               setup: Callable[[], Any] | None = None, cap_s: float | None = None,
               clock: Callable[[], float] = time.monotonic) -> tuple[list[float], Any]:
    """``warmup`` untimed then up to ``reps`` timed calls of ``fn`` (``setup`` untimed before
    each); the timed calls stop early once they took ``cap_s`` seconds (at least one runs).
    Returns (ms of each timed call, the last result)."""
    out = None
    for _ in range(warmup):
        if setup:
            setup()
        out = fn()
    samples: list[float] = []
    t0 = clock()
    for _ in range(reps):
        if setup:
            setup()
        ms, out = common.call_ms(fn, cuda)
        samples.append(ms)
        if cap_s is not None and clock() - t0 > cap_s:
            break
    return samples, out


class Peak:
    """Peak GPU memory from ``start()`` on, in GB (None on the CPU)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda

    def start(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()

    def gb(self) -> float | None:
        if not self.cuda:
            return None
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() / 1e9


def inputs(shape: T5Shape, batch: int, input_len: int, seed: int, device: str):
    """(int32 ids [B, S] on ``device``, int32 lengths [B] on the CPU, long mask on ``device``):
    the same random tokens in [3, vocab - 1) for every engine."""
    ids = common.make_prompts(shape.vocab, batch, input_len,
                              seed=seed * 7919 + batch * 1000 + input_len)
    lengths = torch.full((batch,), input_len, dtype=torch.int32)
    return ids.to(device), lengths, torch.ones(batch, input_len, dtype=torch.long, device=device)


def fail(t: Timing, exc: BaseException, where: str) -> None:
    """Record ``exc`` in ``t`` (the table shows n/a) and free memory after an OOM."""
    t.error = common.short_error(exc)
    common.log(f"{where}: {t.error}")
    if common.is_oom(exc):
        common.free_gpu()


# --------------------------------------------------------------------------- report
def _cell(t: Timing, digits: int = 2) -> str:
    if t.ms is not None:
        return common.fnum(t.ms, digits)
    if t.error:
        return "n/a"
    if t.skipped:
        return "skipped"
    return "—"


HEADERS = ["model", "B", "beam", "warpformer ms", "HF eager ms", "HF compiled ms", "x HF eager",
           "x HF compiled", "wf encode + 1 step ms", "wf ms/step", "HF eager ms/step",
           "peak GB: wf / eager / compiled", "same tokens as HF eager (first / prefix)"]
STEP_HEADERS = ["model", "B", "beam", "wf ms/step", "MB read/step", "floor ms (copy BW)",
                "% of floor", "floor ms (spec BW)", "% of spec floor"]


def main_table(rows: list[Row]) -> str:
    body = []
    for r in rows:
        agree = "—" if r.agree_first_pct is None else (
            f"{r.agree_first_pct:.0f}% / {r.agree_prefix_pct:.0f}%")
        peaks = " / ".join(common.fnum(t.peak_gb) for t in (r.wf, r.hf_eager, r.hf_compiled))
        body.append([r.model, r.batch, r.beam, _cell(r.wf), _cell(r.hf_eager),
                     _cell(r.hf_compiled), common.fx(r.speedup_eager),
                     common.fx(r.speedup_compiled), common.fnum(r.wf.one_ms),
                     common.fnum(r.wf_step_ms, 3), common.fnum(r.hf_eager.step_ms(r.output_len)),
                     peaks, agree])
    return common.md_table(HEADERS, body, align="lrr" + "r" * (len(HEADERS) - 3))


def step_table(rows: list[Row]) -> str:
    body = [[r.model, r.batch, r.beam, common.fnum(r.wf_step_ms, 3),
             common.fnum(None if r.step_bytes is None else r.step_bytes / 1e6, 1),
             common.fnum(r.floor_ms, 3), common.fpct(r.pct_floor),
             common.fnum(r.floor_spec_ms, 3), common.fpct(r.pct_floor_spec)] for r in rows]
    return common.md_table(STEP_HEADERS, body, align="lrr" + "r" * (len(STEP_HEADERS) - 3))


def notes(rows: list[Row]) -> list[str]:
    """One line per error, skip or remark, naming the row and the engine."""
    out = []
    for r in rows:
        for label, t in (("warpformer", r.wf), ("HF eager", r.hf_eager),
                         ("HF compiled", r.hf_compiled)):
            what = []
            if t.error:
                what.append(f"n/a: {t.error}")
            if t.skipped:
                what.append(f"skipped: {t.skipped}")
            if t.note:
                what.append(t.note)
            if t.first_call_s is not None:
                what.append(f"compile + first call {t.first_call_s:.0f} s")
            if what:
                out.append(f"- {r.model} B={r.batch} beam {r.beam}, {label}: {'; '.join(what)}")
    return out


def _find(rows: list[Row], model: str, batch: int, beam: int) -> Row | None:
    return next((r for r in rows if r.key == (model, batch, beam)), None)


def evaluate_targets(rows: list[Row], dtype: str) -> list[list[str]]:
    """Issue 51's targets: [target, measured, verdict] for those whose rows were run."""
    out = []
    model, batch, beam, want = TARGET_EAGER
    r = _find(rows, model, batch, beam)
    if r is not None:
        x = r.speedup_eager
        measured = ("not measured" if x is None else
                    f"{x:.1f}x ({r.wf.ms:.2f} ms vs {r.hf_eager.ms:.1f} ms)")
        verdict = "—" if x is None else ("met" if x >= want else "missed")
        if dtype != "fp16" and x is not None:
            verdict += f" (run in {dtype}, not the target's fp16)"
        out.append([f"{model} fp16 B={batch} beam {beam}: >= {want:.0f}x HF eager", measured,
                    verdict])
    measured_rows = [x for x in rows if x.speedup_compiled is not None]
    if any(x.hf_compiled.ms is not None or x.hf_compiled.error or x.hf_compiled.skipped
           for x in rows):
        slower = [x for x in measured_rows if x.speedup_compiled <= 1.0]
        missing = len(rows) - len(measured_rows)
        text = (f"{len(measured_rows) - len(slower)} of {len(measured_rows)} measured rows "
                f"faster; {missing} rows without an HF compiled time")
        eager = sum(1 for x in measured_rows if x.hf_compiled.compiled is False)
        if eager:
            text += f"; in {eager} measured rows HF did not compile (ran eager)"
        if slower:
            verdict = "missed: " + ", ".join(f"{x.model} B={x.batch} beam {x.beam} "
                                             f"({common.fx(x.speedup_compiled)})" for x in slower)
        elif not measured_rows:
            verdict = "—"
        elif missing:
            verdict = f"met where measured ({missing} rows not measured)"
        else:
            verdict = "met"
        out.append(["faster than HF compiled in every row", text, verdict])
    model, batch, beam, want = TARGET_FLOOR
    r = _find(rows, model, batch, beam)
    if r is not None:
        step = r.wf_step_ms
        if step is None:
            out.append([f"{model} B={batch} beam {beam} decoder step >= {want:.0f}% of its "
                        "bandwidth floor", "not measured", "—"])
        else:
            p, ps = r.pct_floor, r.pct_floor_spec
            measured = (f"{step:.3f} ms/step; floor {common.fnum(r.floor_ms, 3)} ms at the "
                        f"copy bandwidth ({common.fpct(p)}), {common.fnum(r.floor_spec_ms, 3)} "
                        f"ms at the spec bandwidth ({common.fpct(ps)})")
            verdict = ", ".join(f"{'met' if v >= want else 'missed'} ({name})"
                                for v, name in ((p, "copy BW"), (ps, "spec BW"))
                                if v is not None) or "—"
            out.append([f"{model} B={batch} beam {beam} decoder step >= {want:.0f}% of its "
                        "bandwidth floor", measured, verdict])
    return out


def report(rows: list[Row], head: str, dtype: str, with_notes: bool = True) -> str:
    parts = [head, "### Calls (encode + all decoder steps)", main_table(rows),
             "### Decoder step against its bandwidth floor (warpformer)", step_table(rows)]
    targets = evaluate_targets(rows, dtype)
    if targets:
        parts += ["### Issue 51 targets", common.md_table(["target", "measured", "verdict"],
                                                         targets, align="lll")]
    lines = notes(rows) if with_notes else []
    if lines:
        parts += ["### Notes", "\n".join(lines)]
    return "\n\n".join(parts)


def header(args: argparse.Namespace, device_name: str, env: dict[str, Any],
           copy_gbps: float | None, command: str) -> str:
    bw = "not measured" if copy_gbps is None else f"{copy_gbps:.0f} GB/s (read + write)"
    return (f"## Encoder-decoder generation on {device_name}, {env['date']}\n\n"
            f"{args.backend} backend, dtype {args.dtype}, {args.input_len} input / "
            f"{args.output_len} output tokens, random weights; ms per call: warpformer median "
            f"of {args.repeats} after {args.warmup} warm-up, HF median of {args.hf_repeats} "
            f"(once from {args.hf_once_rows} sequences); copy bandwidth {bw}, spec "
            f"{args.spec_gbps:.0f} GB/s; torch {env['torch']}, transformers "
            f"{env['transformers']}, commit {env['commit']}; `{command}`")
