"""All-reduce latency by message size: warpformer's one-shot peer (NVLink) all-reduce against
NCCL, both replayed from CUDA graphs as in a tensor-parallel decode step.

    python benchmarks/bench_allreduce.py --ranks 2,4 --out-dir OUT

The parent launches `torchrun --nproc-per-node N` of this script per group size; every rank
captures `--calls` back-to-back fp16 all-reduces of one size per path in a CUDA graph, replays it
(warm-up, CUDA events, median of `--reps`), and rank 0 reports microseconds per all-reduce. The
parent prints the markdown table and writes JSON + markdown under the output directory.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def worker(args: argparse.Namespace) -> None:
    """One rank: time graph-replayed all-reduces per size and path; rank 0 writes JSON."""
    from warpformer import distributed

    ctx = distributed.init(tensor_para_size=args.group_size, timeout_s=120)
    comm = ctx.tp_comm
    rows = []
    for size_kib in args.sizes:
        x = torch.randn(size_kib * 512, dtype=torch.float16, device="cuda") * 1e-3
        row = {"bytes": size_kib * 1024}
        for path in ("nccl", "peer"):
            if path == "peer" and not comm.peer_all_reduce():
                continue
            comm.all_reduce_(x, path)  # NCCL sets up its buffers outside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(args.calls):
                    comm.all_reduce_(x, path)
            ms = common.median(common.time_cuda(graph.replay, warmup=2, reps=args.reps))
            row[f"{path}_us"] = ms * 1e3 / args.calls
            del graph
        rows.append(row)
    if ctx.info.rank == 0:
        Path(args.result).write_text(json.dumps({
            "ranks": args.group_size, "peer": comm.peer_all_reduce(),
            "reason": comm.peer_all_reduce_reason(), "rows": rows}))
    ctx.shutdown()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="2", help="group sizes, e.g. 2,4")
    ap.add_argument("--sizes", default="8,16,32,64,128,256,512,1024",
                    help="message sizes in KiB (fp16)")
    ap.add_argument("--calls", type=int, default=50, help="all-reduces per graph replay")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out-dir", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--group-size", type=int, default=2, help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.sizes = [int(s) for s in str(args.sizes).split(",")]
    if args.worker:
        worker(args)
        return 0

    ngpu = torch.cuda.device_count()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for n in (int(r) for r in args.ranks.split(",")):
        if n > ngpu:
            common.log(f"skipping {n} ranks: {ngpu} GPUs")
            continue
        result = args.out_dir / f"allreduce_{n}.json"
        res = common.run_ranks(n, __file__, [
            "--worker", "--group-size", str(n), "--sizes", ",".join(map(str, args.sizes)),
            "--calls", str(args.calls), "--reps", str(args.reps), "--result", str(result)],
            result, timeout=300)
        if "error" in res:
            common.log(f"{n} ranks failed: {res['error']}")
            res["ranks"] = n
        results.append(res)
    lines = ["| GPUs | message | NCCL µs | peer µs | NCCL / peer |", "|---:|---:|---:|---:|---:|"]
    for res in results:
        if "error" in res:
            lines.append(f"| {res['ranks']} | error | — | — | — |")
            continue
        for r in res["rows"]:
            nccl, peer = r.get("nccl_us"), r.get("peer_us")
            lines.append(f"| {res['ranks']} | {r['bytes'] // 1024} KiB | {common.fnum(nccl)} | "
                         f"{common.fnum(peer)} | "
                         f"{common.fnum(nccl / peer if nccl and peer else None)}x |")
        if not res.get("peer"):
            lines.append(f"| {res['ranks']} | (no peer path: {res.get('reason')}) | | | |")
    table = "\n".join(lines)
    print(f"\n## All-reduce latency on {common.gpu_name()} (fp16, CUDA graphs, "
          f"{args.calls} calls per replay)\n\n{table}")
    stem = common.result_stem("allreduce", common.gpu_name())
    (args.out_dir / f"{stem}.json").write_text(json.dumps(results, indent=2))
    (args.out_dir / f"{stem}.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
