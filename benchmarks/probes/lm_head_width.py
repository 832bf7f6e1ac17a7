"""Probe: does the lm_head product's speed on cuBLASLt depend on the vocabulary's width?

GPT-2's 50,257 entries are odd. At 64 rows the engine's lm_head ([64, 1024] x [50257, 1024]^T,
fp16) ran on a CUTLASS sm_75 kernel named ``align1`` in a batch-64 decode profile. This times the
same product through the engine's Gemm (``torch.ops.warpformer.gemm``, transposed weight,
cuBLASLt) for the odd width and for widths padded to multiples of 8 and 64, and torch's
``F.linear`` on the same tensors, from CUDA graphs (median of 5 replays of 20 calls).

    python benchmarks/probes/lm_head_width.py [--rows 16,64] [--hidden 1024]
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F

import warpformer  # noqa: F401


def graph_us(fn, calls: int = 20, replays: int = 5) -> float:
    """Median microseconds per call of `fn`, replayed from a CUDA graph of `calls` calls."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()  # plans (and sizes the workspace) outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    times = []
    for _ in range(replays):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3 / calls)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="16,64")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--widths", default="50257,50264,50304")
    args = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}, fp16, hidden {args.hidden}")
    print("| rows | vocabulary width | warpformer Gemm (cuBLASLt) us | torch F.linear us |")
    print("|---:|---:|---:|---:|")
    for m in (int(v) for v in args.rows.split(",")):
        x = torch.randn(m, args.hidden, device="cuda", dtype=torch.float16)
        for n in (int(v) for v in args.widths.split(",")):
            w = torch.randn(n, args.hidden, device="cuda", dtype=torch.float16) * 0.02
            ours = graph_us(lambda x=x, w=w: torch.ops.warpformer.gemm(
                x, w, None, transposed=True, backend="cublaslt"))
            ref = graph_us(lambda x=x, w=w: F.linear(x, w))
            print(f"| {m} | {n} | {ours:.1f} | {ref:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
