"""The prompt pass's matrix products alone: how close to the GEMM rate a prompt pass could come if
everything but its products were free.

For each model shape, prompt batch (``BxL``: B prompts of L tokens) and prefill group size, the
engine says which cuBLASLt products the prompt runs: ``warpformer.gemm_tune.collect_shapes``
builds the model of that shape (its converted config, random weights) with the ``prefill_tokens``
engine option set to the group size and the default ``cuda_graphs=True`` (so a one-group pass
runs at its prompt graph's padded count), runs the prompt and reads the shapes it planned;
products the engine's GEMV runs (the lm_head of at most 8 prompts) are not among them. Each
shape is timed with cuBLASLt's heuristic choice and with the fastest of its first
``--max-algos`` candidates (``warpformer.gemm_tune.tune``: a CUDA graph of back-to-back
launches on random operands), and the times are summed per prompt pass, each as often as the
pass runs that product (:func:`pass_products` says what is counted). The sums are set against
those products' flops and the fp16 GEMM rate (8192^3 ``torch.matmul``) measured in the same
run. With the lm_head on cuBLASLt (more than 8 prompts) and no padded rows the flops are
``bench_generate.py``'s prompt flops, and the "% of GEMM rate" column is the ceiling of its
``prefill_pct_gemm`` for that configuration.

    python benchmarks/bench_gemm_shapes.py --models gpt2-medium,bloom-560m,gpt-j-6b \\
        --cases 64x128,8x80 --groups 2048,4096,8192

Each distinct shape is timed once; the weights are random (the products' speed does not depend
on the values).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from warpformer.config import GptConfig  # noqa: E402
from warpformer.gemm_tune import GemmShape, collect_shapes, tune  # noqa: E402
from warpformer.weights import weight_specs  # noqa: E402


def gpt_config(shape: common.ModelShape) -> GptConfig:
    """The engine's config of ``shape``: what warpformer.converters makes of its HF config (one
    GPU, fp16), as the checkpoint bench_generate.py converts holds it."""
    from warpformer.converters import REGISTRY
    from warpformer.converters.mapping import ConfigDict

    hf = ConfigDict(common.hf_config(shape).to_dict(), shape.name)
    return REGISTRY[common.hf_class(shape.family).__name__].make_config(hf, 1, "fp16")


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


def prompt_pass(shapes: list[GemmShape], batch: int) -> list[GemmShape]:
    """A prompt pass's shapes among ``collect_shapes``': the layers' prompt products, and the
    lm_head over each prompt's last token, which the engine runs with the first generation step
    (the transposed product of ``batch`` rows)."""
    return [s for s in shapes
            if s.what == "prompt" or (s.what == "generation" and s.transposed and s.m == batch)]


def pass_products(planned: list[GemmShape], config: GptConfig,
                  case: Case) -> tuple[list[int], list[tuple[GemmShape, int]]]:
    """The row counts of a prompt pass's groups, and its cuBLASLt products each with the number
    of times the pass runs it, from the distinct shapes the engine planned for the pass
    (``planned``: ``collect_shapes``' "prompt" shapes for ``case``, on ``config``).

    What is counted: the engine runs the groups one after another, each through every layer
    (a layer's products at the group's row count, once per layer: ``config.num_layer`` times),
    then the lm_head once over every prompt's last token (the one transposed product). A layer
    product is named after its weight in the engine's weight table (:func:`weight_specs`, found
    by its full ``[k, n]``); a product that is neither (OPT-350m's project_in/out), or a layer
    with two weights of one shape (one plan for two products a layer), stops the benchmark.

    The engine plans each distinct shape once, so how many groups ran at a row count is not in
    its list. The groups share the B x L prompt tokens: one row count at or above B x L is one
    group (padded for a prompt graph); below, the groups of equal prompts are all alike but the
    last, which holds the rest (``GptModel::plan_prefill``). Row counts that do not add up to
    the tokens that way stop the benchmark."""
    weights = {name[len("layers.0."):-len(".weight")]: (spec.shape[0], math.prod(spec.shape[1:]))
               for name, spec in weight_specs(config).items()
               if spec.layer == 0 and name.endswith(".weight") and len(spec.shape) > 1}
    layer = {kn: name for name, kn in weights.items()}
    if len(layer) < len(weights):
        raise SystemExit(f"bench_gemm_shapes: two of a layer's weights have one shape {weights}")
    rows = sorted({s.m for s in planned if not s.transposed}, reverse=True)
    tokens = case.batch * case.length
    rest = tokens - sum(rows[1:])  # the tokens of the groups of the largest count
    if len(rows) == 1 and rows[0] >= tokens:
        groups = rows
    elif len(rows) in (1, 2) and rest >= rows[0] and rest % rows[0] == 0:
        groups = [rows[0]] * (rest // rows[0]) + rows[1:]
    elif rows:
        raise SystemExit(f"bench_gemm_shapes: {case.label}'s {tokens} prompt tokens are not "
                         f"groups of the planned row counts {rows}")
    else:
        groups = []  # every layer product on the GEMV
    products: list[tuple[GemmShape, int]] = []
    order = {kn: i for i, kn in enumerate(weights.values())}  # the table's: QKV first
    for s in sorted(planned, key=lambda s: (s.transposed, -s.m, order.get((s.k, s.n), 0))):
        if s.transposed:
            products.append((replace(s, what="lm_head"), 1))
        elif (s.k, s.n) in layer:
            products.append((replace(s, what=layer[(s.k, s.n)]),
                             config.num_layer * groups.count(s.m)))
        else:
            raise SystemExit(f"bench_gemm_shapes: {s} is neither a layer's product nor the "
                             f"lm_head")
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
    gpu = common.gpu_name()
    rate = common.gemm_tflops()
    common.log(f"{gpu}: fp16 GEMM rate {rate:.0f} TFLOP/s (8192^3 torch.matmul)")
    times: dict[tuple, tuple[float, float]] = {}  # shared: models of equal widths share shapes
    shape_rows, pass_rows, records = [], [], []
    for shape in args.shapes:
        config = gpt_config(shape)
        listed: set[tuple] = set()
        for case in args.case_list:
            for g in args.groups:
                planned = prompt_pass(collect_shapes(config, case.batch, 1, case.length,
                                                     prefill_tokens=g), case.batch)
                torch.cuda.empty_cache()  # the collecting instance's buffers
                groups, products = pass_products(planned, config, case)
                if not products:
                    common.log(f"{shape.name} {case.label}: the GEMV runs every product of the "
                               f"prompt; nothing to time")
                    continue
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
