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
import math
import shutil
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
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


# --------------------------------------------------------------------------- timing
def call_ms(fn: Callable[[], Any], cuda: bool) -> tuple[float, Any]:
    """(milliseconds, result) of one ``fn()``: CUDA events around the call, or the host clock."""
    if not cuda:
        t0 = time.perf_counter()
        out = fn()
        return (time.perf_counter() - t0) * 1e3, out
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    out = fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end), out


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
        ms, out = call_ms(fn, cuda)
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


def fail(t: Timing, exc: BaseException, where: str) -> None:
    """Record ``exc`` in ``t`` (the table shows n/a) and free memory after an OOM."""
    t.error = common.short_error(exc)
    common.log(f"{where}: {t.error}")
    if common.is_oom(exc):
        common.free_gpu()


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
