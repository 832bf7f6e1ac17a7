"""The prompt pass's matrix products alone: how close to the GEMM rate a prompt pass could come if
everything but its products were free.

For each model shape, prompt batch (``BxL``: B prompts of L tokens) and prefill group size, it
lists the cuBLASLt products the engine runs for the prompt (``warpformer.gemm_tune``'s shapes: the
four per layer at each group's token count, and the lm_head on the last tokens unless there are
at most ``GEMV_LM_HEAD_ROWS`` of them, which the engine's GEMV runs), times each with
cuBLASLt's heuristic choice and with the fastest of its first ``--max-algos`` candidates
(``warpformer.gemm_tune.tune``: a CUDA graph of back-to-back launches on random operands), and
sums them per prompt pass. The sums are set against those products' flops and the fp16 GEMM rate
(8192^3 ``torch.matmul``) measured in the same run. With the lm_head on cuBLASLt (more than 8
prompts) the flops are ``bench_generate.py``'s prompt flops, and the "% of GEMM rate" column is
the ceiling of its ``prefill_pct_gemm`` for that configuration. Group sizes other than the
engine's default are what the ``prefill_tokens`` engine option would give (the engine built with
its default ``cuda_graphs=True``, so a one-group pass runs at its prompt graph's padded count).

    python benchmarks/bench_gemm_shapes.py --models gpt2-medium,bloom-560m,gpt-j-6b \\
        --cases 64x128,8x80 --groups 2048,4096,8192

Each distinct shape is timed once; the weights are random (the products' speed does not depend
on the values).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from warpformer.gemm_tune import (  # noqa: E402
    GemmShape,
    ModelDims,
    layer_shapes,
    logits_shapes,
    prompt_pass_rows,
)

# The engine runs a transposed ([n, k]) lm_head of at most this many rows on its GEMV, not on
# cuBLASLt (kernels::kGemvPreferredRowsNK, 16-bit types).
GEMV_LM_HEAD_ROWS = 8

# Each family's MLP activation, lm_head bias and residual form (as the converters set them).
_FAMILY = {
    "gpt2": ("gelu_tanh", False, False),
    "bloom": ("gelu_tanh", False, False),
    "opt": ("relu", False, False),
    "gptj": ("gelu_tanh", True, True),
}


def model_dims(shape: common.ModelShape) -> ModelDims:
    """The GEMM-deciding dimensions and switches of a benchmark model shape."""
    activation, lm_head_bias, parallel = _FAMILY[shape.family]
    return ModelDims(shape.hidden, shape.inter, shape.vocab, parallel_residual=parallel,
                     activation=activation, lm_head_bias=lm_head_bias)


@dataclass(frozen=True)
class Case:
    """``batch`` prompts of ``length`` tokens."""

    batch: int
    length: int

    @property
    def label(self) -> str:
        return f"{self.batch}x{self.length}"


def parse_cases(text: str) -> list[Case]:
    """``"64x128,8x80"`` -> cases; each side an integer >= 1."""
    cases = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) != 2 or not all(p.isdigit() and int(p) >= 1 for p in parts):
            raise ValueError(f"a case is BATCHxLENGTH with both >= 1, got {item!r}")
        cases.append(Case(int(parts[0]), int(parts[1])))
    return cases


def prompt_products(shape: common.ModelShape, case: Case,
                    group_tokens: int) -> tuple[list[int], list[tuple[GemmShape, int]]]:
    """The groups' row counts (a one-group pass's padded count when it runs as a prompt graph)
    and every cuBLASLt product of one prompt pass with its count:
    ``layers`` per group for the layer products, once for the logits of the last tokens (but not
    a transposed lm_head of at most ``GEMV_LM_HEAD_ROWS`` rows: the engine's GEMV runs it)."""
    dims = model_dims(shape)
    groups = prompt_pass_rows([case.length] * case.batch, group_tokens, dims)
    products: list[tuple[GemmShape, int]] = []
    for tokens in groups:
        products += [(s, shape.layers) for s in layer_shapes(dims, tokens, "context")]
    products += [(s, 1) for s in logits_shapes(dims, case.batch, "context")
                 if not (s.transposed and s.m <= GEMV_LM_HEAD_ROWS)]
    return groups, products


def products_flops(products: list[tuple[GemmShape, int]]) -> float:
    """2 m n k summed over a pass's products, each times its count."""
    return sum(2.0 * s.m * s.n * s.k * n for s, n in products)


def pass_ms(products: list[tuple[GemmShape, int]],
            times_us: dict[tuple, tuple[float, float]]) -> tuple[float, float]:
    """(heuristic, best) milliseconds of a prompt pass's products from per-shape microseconds."""
    heur = sum(times_us[s.key()][0] * n for s, n in products) / 1e3
    best = sum(times_us[s.key()][1] * n for s, n in products) / 1e3
    return heur, best


def pct_of_rate(flops: float, ms: float, rate_tflops: float) -> float:
    """flops done in ``ms`` as a percentage of ``rate_tflops``."""
    return 100.0 * flops / (ms * 1e-3) / 1e12 / rate_tflops


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gpt2-medium,bloom-560m,gpt-j-6b",
                    help="model shapes of benchmarks/common.py (comma list)")
    ap.add_argument("--cases", default="64x128,8x80", help="prompt batches BATCHxLENGTH")
    ap.add_argument("--groups", type=common.positive_ints, default=[2048, 4096, 8192],
                    help="prefill group sizes in tokens (comma list)")
    ap.add_argument("--max-algos", type=int, default=32, help="cuBLASLt candidates per shape")
    ap.add_argument("--reps", type=int, default=20, help="timed launches per candidate")
    ap.add_argument("--out-dir", type=Path, default=common.DEFAULT_RESULTS_DIR)
    args = ap.parse_args(argv)
    try:
        args.shapes = common.parse_models(args.models)
        args.case_list = parse_cases(args.cases)
    except ValueError as e:
        ap.error(str(e))
    if not 1 <= args.max_algos <= 64:
        ap.error(f"--max-algos must be in [1, 64], got {args.max_algos}")
    if not 1 <= args.reps <= 1000:
        ap.error(f"--reps must be in [1, 1000], got {args.reps}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_gemm_shapes: needs a CUDA device")
    import warpformer  # noqa: F401  (registers the ops)
    from warpformer.gemm_tune import tune

    gpu = common.gpu_name()
    rate = common.gemm_tflops()
    common.log(f"{gpu}: fp16 GEMM rate {rate:.0f} TFLOP/s (8192^3 torch.matmul)")
    times: dict[tuple, tuple[float, float]] = {}  # shared: models of equal widths share shapes
    shape_rows, pass_rows, records = [], [], []
    for shape in args.shapes:
        listed: set[tuple] = set()
        for case in args.case_list:
            for g in args.groups:
                groups, products = prompt_products(shape, case, g)
                todo = [s for s, _ in products if s.key() not in times]
                for s, _, best, heur in tune(list({s.key(): s for s in todo}.values()),
                                             torch.float16, args.max_algos, args.reps):
                    times[s.key()] = (heur, best)
                for s, _ in products:
                    if s.key() in times and s.key() not in listed:
                        listed.add(s.key())
                        heur, best = times[s.key()]
                        tf = 2.0 * s.m * s.n * s.k / (heur * 1e-6) / 1e12
                        shape_rows.append([shape.name, s.what, s.m, s.n, s.k, s.epilogue,
                                           common.fnum(heur), common.fnum(best), f"{tf:.0f}",
                                           common.fpct(100 * tf / rate)])
                missing = [s for s, _ in products if s.key() not in times]
                if missing:
                    raise SystemExit(f"bench_gemm_shapes: no cuBLASLt algorithm ran "
                                     f"{missing[0]}")
                heur, best = pass_ms(products, times)
                flops = products_flops(products)
                rec = {"model": shape.name, "case": case.label, "group_tokens": g,
                       "groups": groups, "products_ms_heuristic": heur,
                       "products_ms_best": best,
                       "pct_gemm_heuristic": pct_of_rate(flops, heur, rate),
                       "pct_gemm_best": pct_of_rate(flops, best, rate)}
                records.append(rec)
                pass_rows.append([shape.name, case.label, g, len(groups), common.fnum(heur),
                                  common.fnum(best), common.fpct(rec["pct_gemm_heuristic"]),
                                  common.fpct(rec["pct_gemm_best"])])
                common.log(f"{shape.name} {case.label} groups of {g}: products "
                           f"{heur:.2f} ms ({rec['pct_gemm_heuristic']:.0f}% of the GEMM rate), "
                           f"best candidates {best:.2f} ms ({rec['pct_gemm_best']:.0f}%)")
    md = "\n\n".join([
        f"## Prompt-pass products alone ({gpu}, fp16 GEMM rate {rate:.0f} TFLOP/s)",
        common.md_table(["model", "prompts", "group tokens", "groups", "products ms (heuristic)",
                         "best candidates ms", "% of GEMM rate (heuristic)",
                         "% (best candidates)"], pass_rows),
        "### Per shape (microseconds per call)",
        common.md_table(["model", "product", "m", "n", "k", "epilogue", "heuristic us",
                         "best us", "TFLOP/s (heuristic)", "% of GEMM rate"], shape_rows),
    ])
    payload: dict[str, Any] = {"env": common.env_info(), "gemm_tflops": rate,
                               "max_algos": args.max_algos, "reps": args.reps,
                               "passes": records}
    paths = common.write_results(args.out_dir, common.result_stem("gemm_shapes", gpu), payload,
                                 md)
    print(md)
    print(f"wrote {paths[0]} and {paths[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
