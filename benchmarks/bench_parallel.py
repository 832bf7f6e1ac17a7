"""Multi-GPU scaling: decode ms/step and prefill ms of a random-init model (gpt-j-6b shape by
default) at tensor/pipeline-parallel sizes, each configuration run under torchrun.

    python benchmarks/bench_parallel.py --grids 1x1,2x1,2x1-nccl,1x2 --batches 1,64 --out-dir OUT

A grid's suffix picks a comparison variant, an engine option its ranks build the model with:
"-nccl" runs with peer_allreduce=False (every all-reduce through NCCL instead of the one-shot
peer all-reduce), to show what that is worth.

The parent builds the model once on the GPU (benchmarks/common.py), converts it for every tensor-
parallel size needed, then launches `torchrun --nproc-per-node tp*pp` of this script in worker
mode per grid; rank 0 of each run times greedy generation (warm-up, CUDA events, median) and
writes JSON; the parent prints the table (and writes JSON + markdown).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

# grid suffix -> (engine options of its ranks, EngineOptions keywords; what the table calls it)
VARIANTS: dict[str, tuple[dict[str, Any], str]] = {
    "auto": ({}, ""),
    "nccl": ({"peer_allreduce": False}, "NCCL all-reduce"),
}
# Suffixes of switches the engine no longer has (issue 50): refused with that reason.
REMOVED_VARIANTS = ("whole", "parallel-off", "early-off")


def parse_grids(text: str) -> list[tuple[int, int, str]]:
    """"1x2,2x1-nccl" -> [(1, 2, "auto"), (2, 1, "nccl")]: TPxPP with an optional variant."""
    grids = []
    for g in text.split(","):
        dims, _, variant = g.partition("-")
        tp, _, pp = dims.partition("x")
        if not (tp.isdigit() and pp.isdigit() and int(tp) > 0 and int(pp) > 0):
            raise SystemExit(f"--grids: '{g}' is not TPxPP with positive sizes (e.g. 2x1)")
        if variant in REMOVED_VARIANTS:
            raise SystemExit(f"--grids: '-{variant}' in '{g}' switched off a path the engine now "
                             f"always runs (the switch was removed; benchmarks/HISTORY.md keeps "
                             f"its A/B)")
        if (variant or "auto") not in VARIANTS:
            raise SystemExit(f"--grids: unknown variant '-{variant}' in '{g}' (known: "
                             f"{', '.join('-' + v for v in VARIANTS if v != 'auto')})")
        grids.append((int(tp), int(pp), variant or "auto"))
    return grids


def worker_argv(model_dir: Path, tp: int, pp: int, variant: str, args: argparse.Namespace,
                result: Path, end_id: int) -> list[str]:
    """This script's arguments for the ranks of one grid: worker mode, the grid's shards and
    sizes, the workload, and the variant's engine options (``--options``, JSON)."""
    return ["--worker", "--model-dir", str(model_dir), "--tp", str(tp), "--pp", str(pp),
            "--batches", ",".join(map(str, args.batches)), "--input-len", str(args.input_len),
            "--output-len", str(args.output_len), "--result", str(result),
            "--end-id", str(end_id), "--options", json.dumps(VARIANTS[variant][0])]


def worker_options(text: str) -> Any:
    """The ``EngineOptions`` of a worker's ``--options`` JSON."""
    from warpformer.options import EngineOptions

    return EngineOptions(**json.loads(text))


def worker(args: argparse.Namespace) -> None:
    """One rank: load the shards, time generation, rank 0 writes the result JSON."""
    from warpformer import distributed

    model = distributed.load_gpt_model(args.model_dir, dtype=torch.float16,
                                       tensor_para_size=args.tp, pipeline_para_size=args.pp,
                                       max_batch=max(args.batches),
                                       max_seq_len=args.input_len + args.output_len,
                                       options=worker_options(args.options))
    ctx = distributed.get_context()
    rows = []
    for b in args.batches:
        ids = torch.randint(3, args.end_id, (b, args.input_len), dtype=torch.int32,
                            device="cuda", generator=torch.Generator(device="cuda").manual_seed(b))
        lens = torch.full((b,), args.input_len, dtype=torch.int32, device="cuda")
        end = args.end_id  # the random model never emits it: every row runs to output_len

        def run(n: int, ids=ids, lens=lens, end=end) -> None:
            model.generate(ids, lens, n, end)

        t_prefill = common.median(common.time_cuda(lambda: run(1), warmup=1, reps=3))
        t_full = common.median(common.time_cuda(lambda: run(args.output_len), warmup=1,
                                                reps=3))
        rows.append({"batch": b, "prefill_ms": t_prefill,
                     "decode_ms_per_step": (t_full - t_prefill) / (args.output_len - 1),
                     "total_ms": t_full,
                     "tokens_per_s": b * args.output_len / (t_full / 1e3)})
    if ctx is None or ctx.info.rank == 0:
        Path(args.result).write_text(json.dumps({"tp": args.tp, "pp": args.pp, "rows": rows}))
    if ctx is not None:
        ctx.shutdown()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt-j-6b", help="a shape of benchmarks/common.py")
    ap.add_argument("--grids", default="1x1,2x1,1x2",
                    help="TPxPP list; suffix -nccl: peer_allreduce=False (all-reduces through "
                         "NCCL only)")
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--cache-dir", type=Path, default=Path("~/.cache/warpformer-bench"))
    ap.add_argument("--out-dir", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    ap.add_argument("--tp", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--pp", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--end-id", type=int, default=50399, help=argparse.SUPPRESS)
    ap.add_argument("--options", default="{}", help=argparse.SUPPRESS)  # EngineOptions, JSON
    args = ap.parse_args(argv)
    args.batches = [int(x) for x in str(args.batches).split(",")]
    if args.worker:
        worker(args)
        return 0

    grids = parse_grids(args.grids)
    ngpu = torch.cuda.device_count()
    grids = [g for g in grids if g[0] * g[1] <= ngpu]
    shape = common.parse_models(args.model)[0]
    root = args.cache_dir.expanduser() / f"parallel-{shape.name}"
    hf_dir = root / "hf"
    t0 = time.monotonic()
    if not (hf_dir / "config.json").is_file():
        hf = common.build_hf_model(shape, seed=0)
        hf.save_pretrained(hf_dir)
        del hf
        common.free_gpu()
    from warpformer.converters import convert

    for tp in sorted({g[0] for g in grids}):
        if not (root / f"{tp}-gpu" / "config.ini").is_file():
            convert(hf_dir, root, tensor_para_size=tp, data_type="fp16",
                    processes=min(16, os.cpu_count() or 1), force=True)
    common.log(f"prepared {shape.name} in {time.monotonic() - t0:.0f} s")
    results = []
    for tp, pp, variant in grids:
        result = args.out_dir / f"parallel_{tp}x{pp}-{variant}.json"
        # bench models zero the last output-embedding row: that token never wins
        res = common.run_ranks(tp * pp, __file__,
                               worker_argv(root / f"{tp}-gpu", tp, pp, variant, args, result,
                                           shape.vocab - 1), result, timeout=400)
        if "error" in res:
            results.append({"tp": tp, "pp": pp, "variant": variant, "error": res["error"]})
            common.log(f"{tp}x{pp} failed: {res['error']}")
            continue
        results.append(dict(res, variant=variant))
    base = {r["batch"]: r["decode_ms_per_step"] for r in results[0].get("rows", [])}
    lines = ["| model | TP | PP | variant | batch | prefill ms | decode ms/step | vs first row "
             "| tokens/s |", "|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    for res in results:
        how = VARIANTS[res["variant"]][1] or "—"
        for r in res.get("rows", []):
            ratio = r["decode_ms_per_step"] / base[r["batch"]] if r["batch"] in base else None
            lines.append(f"| {shape.name} | {res['tp']} | {res['pp']} | {how} | {r['batch']} | "
                         f"{r['prefill_ms']:.2f} | {r['decode_ms_per_step']:.3f} | "
                         f"{common.fnum(ratio)}x | {r.get('tokens_per_s', 0):.0f} |")
        if "error" in res:
            lines.append(f"| {shape.name} | {res['tp']} | {res['pp']} | {how} | — | error | — "
                         "| — | — |")
    table = "\n".join(lines)
    print(f"\n## Multi-GPU scaling on {ngpu}x {common.gpu_name()} (fp16, in {args.input_len}, "
          f"out {args.output_len})\n\n{table}")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = common.result_stem("parallel", common.gpu_name())
    (args.out_dir / f"{stem}.json").write_text(json.dumps({"gpus": ngpu, "results": results},
                                                          indent=2))
    (args.out_dir / f"{stem}.md").write_text(table + "\n")
    if os.environ.get("WARPFORMER_BENCH_KEEP_CACHE", "1") == "0":
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
