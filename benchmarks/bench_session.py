"""Interactive sessions: a turn's prompt pass in a session (``GPT.start_session``) against
recomputing the whole history in one ``GPT.generate`` call.

For each model, ``--turns`` turns of ``--turn-tokens`` random new tokens per row, each turn
generating one token (``max_new_tokens=1``: the prompt pass and one lm_head). Turn k is timed two
ways: ``session.generate(new_k, 1)`` in a session that ran turns 1..k-1 (the engine reuses each
row's cached prefix and runs the prompt pass over the turn's tokens only), and
``gpt.generate(history + new_k, 1)``, the same tokens recomputed from scratch (the history comes
from ``session.history``: every earlier turn's new tokens and its generated token).

Method: ``--warmup`` + ``--repeats`` fresh sessions each run turns 1..K, every turn timed (so
turn k of every session starts from the same history); the first ``--warmup`` sessions are not
counted. The one-shot calls of each turn run after all sessions are closed, ``--warmup`` untimed
then ``--repeats`` timed (the engine captures a prompt graph on a shape's second call). Medians;
CUDA events around each whole call on the cuda backend (host work included: both calls return
host token lists), the host clock on the reference backend. The end id (``vocab - 1``) is never
produced, so every turn adds ``turn-tokens + 1`` tokens to the history. ``same tokens``: the
session's turn generated what the one-shot call did.

    python benchmarks/bench_session.py --models gpt-j-6b,llama-3-8b --turns 10 --turn-tokens 64
    python benchmarks/bench_session.py --backend reference --models tiny --turns 3 \\
        --turn-tokens 4                        # CPU smoke run: a tiny random model, no GPU

Weights are random at the real sizes (benchmarks/common.py's table and converted cache, as
bench_generate.py); ``tiny`` is a 2-layer GPT-2 built on the CPU for smoke runs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
# A tiny GPT-2 (head size 32, which the engine's kernels take) for smoke runs on either backend.
TINY = common.ModelShape("tiny", "gpt2", 64, 2, 2, 256, 512, 2048)
HEADERS = ["turn", "history tokens", "session turn ms", "recompute ms", "recompute / session",
           "same tokens"]


@dataclass
class Row:
    """Turn ``turn`` (1-based) of one model."""

    model: str
    turn: int
    history: int  # tokens per row before the turn (earlier turns' new and generated tokens)
    new: int  # the turn's new tokens per row
    session_ms: float
    recompute_ms: float
    same_tokens: bool
    session_samples_ms: list[float] = field(default_factory=list)
    recompute_samples_ms: list[float] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return self.recompute_ms / self.session_ms if self.session_ms > 0 else float("nan")


def _positive(text: str) -> int:
    vals = common.positive_ints(text)
    if len(vals) != 1:
        raise argparse.ArgumentTypeError(f"expected one integer >= 1, got {text!r}")
    return vals[0]


def _models(text: str) -> list[common.ModelShape]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    try:
        return [TINY if n == TINY.name else common.parse_models(n)[0] for n in names] or \
            common.parse_models("")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (or {TINY.name})") from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=_models, default=[common.SHAPES["gpt-j-6b"]],
                    help=f"comma list of {','.join(common.SHAPES)} or {TINY.name} "
                         "(default gpt-j-6b)")
    ap.add_argument("--layers", type=_positive, default=None,
                    help="truncate every model to N layers (default: real counts)")
    ap.add_argument("--turns", type=_positive, default=10)
    ap.add_argument("--turn-tokens", type=_positive, default=64, help="new tokens per row a turn")
    ap.add_argument("--batch", type=_positive, default=1, help="rows (conversations)")
    ap.add_argument("--dtype", choices=tuple(DTYPES), default="fp16")
    ap.add_argument("--backend", choices=("cuda", "reference"), default="cuda",
                    help="reference: plain PyTorch on the CPU (a smoke run; use --models tiny)")
    ap.add_argument("--repeats", type=_positive, default=5, help="timed calls (sessions) a turn")
    ap.add_argument("--warmup", type=int, default=2, help="untimed calls (sessions) first")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache-dir", type=Path, default=common.DEFAULT_CACHE_DIR,
                    help="converted models (cuda backend; default %(default)s)")
    ap.add_argument("--out-dir", type=Path, default=common.DEFAULT_RESULTS_DIR,
                    help="JSON + markdown results go here (default benchmarks/results)")
    args = ap.parse_args(argv)
    if args.warmup < 0:
        ap.error("--warmup must be >= 0")
    args.shapes = [s.with_layers(args.layers) for s in args.models]
    args.max_len = args.turns * (args.turn_tokens + 1)
    for s in args.shapes:
        if s.family in ("gpt2", "opt") and args.max_len > s.positions:
            ap.error(f"{s.name}: --turns x (--turn-tokens + 1) = {args.max_len} positions, more "
                     f"than its {s.positions}")
    return args


# --------------------------------------------------------------------------- models, timing
def build_on_cpu(shape: common.ModelShape, seed: int, root: Path) -> Path:
    """``common.prepare_model``'s random weights on the CPU (fp32, uncached): the HF model of
    ``shape`` randomized with ``common.randomize_``, converted into ``root``; returns
    ``root/1-gpu``."""
    from warpformer.converters import convert

    model = common.hf_class(shape.family)(common.hf_config(shape)).float()
    model.eval().requires_grad_(False)
    common.randomize_(model, seed, never_id=shape.vocab - 1)
    model.save_pretrained(root / "hf")
    convert(root / "hf", root, tensor_para_size=1, data_type="fp32", force=True)
    return root / "1-gpu"


def converted_model(shape: common.ModelShape, args: argparse.Namespace, scratch: Path) -> Path:
    if args.backend == "cuda":
        return common.prepare_model(shape, args.cache_dir.expanduser(), args.seed,
                                    need_hf=False).model_dir
    return build_on_cpu(shape, args.seed, scratch / common.model_key(shape, args.seed))


def bench_model(gpt: Any, name: str, args: argparse.Namespace) -> list[Row]:
    """Every turn of one model: session turns first (fresh sessions), then the one-shot calls."""
    B, K, T = args.batch, args.turns, args.turn_tokens
    end = gpt.vocab_size - 1
    cuda = gpt.backend == "cuda"
    news = [common.make_prompts(gpt.vocab_size, B, T, seed=args.seed * 1000 + k).tolist()
            for k in range(K)]
    session_ms: list[list[float]] = [[] for _ in range(K)]
    fulls: list[list[list[int]]] = []  # the first session's history + new ids, per turn
    tokens: list[list] = []  # the first session's generated tokens, per turn
    for s in range(args.warmup + args.repeats):
        with gpt.start_session(B, args.max_len) as chat:
            for k, new in enumerate(news):
                if s == 0:
                    fulls.append([h + n for h, n in zip(chat.history, new, strict=True)])
                ms, out = common.call_ms(lambda new=new: chat.generate(new, 1, end_id=end), cuda)
                if s == 0:
                    tokens.append(out.tokens)
                if s >= args.warmup:
                    session_ms[k].append(ms)
    rows = []
    for k, full in enumerate(fulls):
        samples, same = [], True
        for i in range(args.warmup + args.repeats):
            ms, out = common.call_ms(lambda full=full: gpt.generate(full, 1, end_id=end), cuda)
            same = same and out.tokens == tokens[k]
            if i >= args.warmup:
                samples.append(ms)
        rows.append(Row(name, k + 1, len(full[0]) - T, T, common.median(session_ms[k]),
                        common.median(samples), same, session_ms[k], samples))
        common.log(f"[{name}] turn {k + 1}: session {rows[-1].session_ms:.3f} ms, recompute "
                   f"{rows[-1].recompute_ms:.3f} ms")
    return rows


# --------------------------------------------------------------------------- report
def table(rows: list[Row]) -> str:
    """Markdown: one row per turn (see :data:`HEADERS`)."""
    return common.md_table(HEADERS, [
        [r.turn, r.history, common.fnum(r.session_ms, 3), common.fnum(r.recompute_ms, 3),
         common.fx(r.ratio), "yes" if r.same_tokens else "no"] for r in rows])


def report(args: argparse.Namespace, head: str, rows: list[Row],
           errors: dict[str, str]) -> str:
    parts = [head]
    for shape in args.shapes:
        parts.append(f"### {shape.name} ({shape.layers} layers)")
        mine = [r for r in rows if r.model == shape.name]
        parts.append(table(mine) if mine else f"error: {errors.get(shape.name, 'not run')}")
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cuda = args.backend == "cuda"
    if cuda and not torch.cuda.is_available():
        print("bench_session: no CUDA device visible; use --backend reference --models tiny",
              file=sys.stderr)
        return 2
    from warpformer.gpt import GPT

    device = common.gpu_name() if cuda else "cpu"
    env = common.env_info()
    stem = common.result_stem("session", device)
    command = " ".join(["python benchmarks/bench_session.py", *(sys.argv[1:] if argv is None
                                                                  else argv)])
    head = (f"## Session turns vs recompute on {device}, {env['date']}\n\n"
            f"{args.backend} backend, {args.dtype}, batch {args.batch}, {args.turns} turns of "
            f"{args.turn_tokens} new tokens + 1 generated; ms per call, median of "
            f"{args.repeats} after {args.warmup} warm-up. Session turn: "
            "`session.generate(new, 1)`; recompute: `gpt.generate(history + new, 1)`. "
            f"torch {env['torch']}, commit {env['commit']}; `{command}`")
    rows: list[Row] = []
    errors: dict[str, str] = {}

    def save() -> tuple[Path, Path]:
        payload = {"benchmark": "session", "env": env,
                   "args": {k: (str(v) if isinstance(v, Path) else v)
                            for k, v in vars(args).items() if k not in ("models", "shapes")},
                   "models": [asdict(s) for s in args.shapes], "errors": errors,
                   "rows": [dict(asdict(r), ratio=r.ratio) for r in rows]}
        return common.write_results(args.out_dir, stem, payload,
                                    report(args, head, rows, errors))

    with tempfile.TemporaryDirectory(prefix="bench_session_") as scratch:
        for shape in args.shapes:
            common.log(f"[{shape.name}] preparing ({shape.layers} layers)")
            gpt = None
            try:
                model_dir = converted_model(shape, args, Path(scratch))
                gpt = GPT.from_pretrained(model_dir, dtype=DTYPES[args.dtype],
                                          max_batch=args.batch, max_seq_len=args.max_len,
                                          backend=args.backend)
                rows += bench_model(gpt, shape.name, args)
            except Exception as exc:  # noqa: BLE001 - recorded; the next model still runs
                errors[shape.name] = common.short_error(exc)
                common.log(f"[{shape.name}] failed: {errors[shape.name]}")
            del gpt
            common.free_gpu()
            save()
    json_path, md_path = save()
    print(report(args, head, rows, errors))
    print(f"\nresults: {json_path} and {md_path}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
