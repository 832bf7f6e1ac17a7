"""Where a LAMBADA-shaped batch's time goes: the prompt pass against the decode steps, GPU busy
time against idle time, the kernels, and the host's CUDA API calls, for the workload of
benchmarks/bench_lambada.py (same samples, same batches, same calls).

    python tools/profile_lambada.py [--batches 96] [--model bloom-560m] [--api] [--in-flight 1,2,3]

Prints, per batch (medians and means over ``--batches`` batches of the workload, after warm-up):
the wall time of the benchmark's loop body (host -> device copies, ``generate``, the device ->
host copy) on the first pass over the batches (each new prompt token count plans its GEMMs, as
in the benchmark), on a second pass, on a second instance over the same weights built with
``cuda_graphs=False`` (after an untimed pass of its own), and with one new token (the prompt pass
alone); with ``--api`` also through ``GPT.generate`` (token lists, as ``warpformer
lambada`` calls it, and CPU tensors), with a cProfile of its host time; then, from a
torch.profiler trace of the same batches: GPU busy time (the union of kernel intervals, so
overlapping kernels under programmatic launch count once), idle time, the kernels and the
host-side CUDA runtime calls. ``--in-flight N[,N...]`` also times ``GPT.generate_batches`` over
the same batches (token lists) with N batches on the GPU at once (before any profiling) and sets
each wall against the GPU busy time of one batch at a time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_lambada as bl  # noqa: E402
import common  # noqa: E402
from profile_decode import kernel_name  # noqa: E402  (same folder)

from warpformer.gpt import GPT  # noqa: E402
from warpformer.models.gpt import build_gpt_model  # noqa: E402
from warpformer.options import EngineOptions  # noqa: E402
from warpformer.weights import load_weights, read_config  # noqa: E402


def union_us(intervals: list[tuple[float, float]]) -> float:
    """Total length of the union of ``(start, end)`` intervals (microseconds)."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def table(rows: dict[str, list[float]], per: int, unit: str, top: int) -> str:
    """Markdown: name, calls per batch, ms per batch, share; ``rows[name] = [count, us]``."""
    total = sum(t for _, t in rows.values()) or 1.0
    out = [f"| name | calls/{unit} | ms/{unit} | share |", "|---|---:|---:|---:|"]
    for name, (n, t) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:top]:
        out.append(f"| {name} | {n / per:.1f} | {t / per / 1000:.4f} | {100 * t / total:.1f}% |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=list(common.SHAPES), default="bloom-560m")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--batches", type=int, default=96, help="batches timed and profiled")
    ap.add_argument("--cache-dir", type=Path, default=common.DEFAULT_CACHE_DIR)
    ap.add_argument("--api", action="store_true",
                    help="also time the batches through GPT.generate (token lists and tensors) "
                         "and print a cProfile of its host time")
    ap.add_argument("--in-flight", type=bl._counts, default=(), metavar="N[,N...]",
                    help="also time GPT.generate_batches with N batches in flight (token "
                         "lists), for each N, against the GPU time of one batch at a time")
    args = ap.parse_args(argv)
    shape = common.SHAPES[args.model]
    samples = bl.make_samples(bl.LAMBADA_SAMPLES, shape.vocab, 0)
    batches = bl.make_batches(len(samples), args.batch)[: args.batches + 4]
    prep = common.prepare_model(shape, args.cache_dir, 0, need_hf=False)
    # The longest sample, and the one-row prompts of up to 213 tokens below.
    max_len = max(max(len(s.context) for s in samples) + max(bl.TARGET_LENS), 214)
    config = read_config(prep.model_dir)
    weights = load_weights(prep.model_dir, dtype=torch.float16, device="cuda")

    def build(cuda_graphs: bool):
        return build_gpt_model(config, weights, dtype=torch.float16, max_batch=args.batch,
                               max_seq_len=max_len, options=EngineOptions(cuda_graphs=cuda_graphs))

    model = build(True)
    packed = [bl.pack(samples, b, left=False) for b in batches]
    out_lens = [max(samples[i].target_len for i in b) for b in batches]
    end = shape.vocab - 1

    def body(i: int, n: int | None = None, engine=model) -> torch.Tensor:
        ids, lens = packed[i]
        out, _ = engine.generate(ids.cuda(), lens.cuda(), n or out_lens[i], end)
        return out.cpu()

    def walls(n: int | None, engine=model) -> list[float]:
        ms = []
        for i in range(4, len(batches)):
            t0 = time.perf_counter()
            body(i, n, engine)
            ms.append(1000 * (time.perf_counter() - t0))
        return ms

    for i in range(4):
        body(i)
    torch.cuda.synchronize()
    # The first pass meets each batch's prompt token count for the first time (its GEMM shapes
    # are planned then, as in the benchmark); the others repeat it.
    passes = {"benchmark loop, first pass": walls(None),
              "benchmark loop, again": walls(None)}
    eager = build(False)
    walls(None, eager)  # its own first pass: plans
    passes["benchmark loop, again, cuda_graphs=False (a second instance)"] = walls(None, eager)
    del eager
    passes["one new token (the prompt pass), again"] = walls(1)
    if args.api:
        # The same batches through the Python API: token lists as `warpformer lambada` passes
        # them, and CPU tensors with input_lengths (GPT.generate validates, then the engine).
        gpt = GPT(model, config, "cuda", torch.float16, torch.device("cuda"))
        lists = [[samples[j].context.tolist() for j in b] for b in batches]

        def api_walls(tensors: bool) -> list[float]:
            ms = []
            for i in range(4, len(batches)):
                t0 = time.perf_counter()
                if tensors:
                    gpt.generate(packed[i][0], out_lens[i], input_lengths=packed[i][1],
                                 end_id=end)
                else:
                    gpt.generate(lists[i], out_lens[i], end_id=end)
                ms.append(1000 * (time.perf_counter() - t0))
            return ms

        api_walls(False)
        passes["GPT.generate, token lists (warpformer lambada's call), again"] = api_walls(False)
        passes["GPT.generate, CPU tensors + input_lengths, again"] = api_walls(True)
    # Before any torch.profiler session: a profiled process keeps paying for the profiler's
    # callbacks on every CUDA call afterwards, which slows the host's launches.
    flight_gpt = GPT(model, config, "cuda", torch.float16, torch.device("cuda"))
    flights = {n: in_flight_wall(flight_gpt, n, samples, batches, out_lens, end)
               for n in args.in_flight}
    steps = [n - 1 for n in out_lens[4:]]
    tokens = [int(packed[i][1].sum()) for i in range(4, len(batches))]
    print(f"\n## LAMBADA batch profile: {shape.name}, batch {args.batch}, "
          f"{len(steps)} batches, {common.gpu_name()}\n")
    print(f"prompt tokens per batch: mean {statistics.mean(tokens):.0f}; decode steps per batch: "
          f"mean {statistics.mean(steps):.2f}\n")
    note = model.gemm_tuning_note()
    if note:  # a tuning file (gemm_config's fallback $WARPFORMER_GEMM_CONFIG): what it served
        print(f"{note}; cuBLASLt plans from it: {model.gemm_tuned_plans()} of "
              f"{model.gemm_cached_plans()} cached\n")
    print("| loop body | median ms | mean ms |\n|---|---:|---:|")
    for name, ms in passes.items():
        print(f"| {name} | {statistics.median(ms):.3f} | {statistics.mean(ms):.3f} |")
    again = passes["benchmark loop, again"]
    prompt = passes["one new token (the prompt pass), again"]
    dec = (statistics.mean(again) - statistics.mean(prompt)) / max(statistics.mean(steps), 1e-9)
    print(f"| difference per decode step (again) | | {dec:.3f} |")
    for n_flight, wall in flights.items():
        print(f"| GPT.generate_batches, {n_flight} in flight (token lists), again | | "
              f"{wall:.3f} |")
    print()

    if args.api:
        prof_py = cProfile.Profile()
        prof_py.enable()
        for i in range(4, len(batches)):
            gpt.generate(lists[i], out_lens[i], end_id=end)
        prof_py.disable()
        text = io.StringIO()
        pstats.Stats(prof_py, stream=text).sort_stats("tottime").print_stats(25)
        print("GPT.generate with token lists under cProfile (host time by function, "
              f"{len(batches) - 4} calls):\n\n```\n{text.getvalue().strip()}\n```\n")

    # What a new GEMM row count costs: prompt passes of one row of 150-213 tokens (counts the
    # batches above never made), each timed on its first call and again.
    def one_row(n: int) -> float:
        ids = packed[4][0][:1, :1].expand(1, n).contiguous().cuda()
        lens = torch.tensor([n], dtype=torch.int32, device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.forward(ids, lens)
        torch.cuda.synchronize()
        return 1000 * (time.perf_counter() - t0)

    q0 = model.gemm_heuristic_queries()
    cold = [one_row(n) for n in range(150, 214)]
    queries = model.gemm_heuristic_queries() - q0
    warm = [one_row(n) for n in range(150, 214)]
    print(f"a new GEMM row count: prompt pass of one row {statistics.mean(cold):.3f} ms on the "
          f"first call against {statistics.mean(warm):.3f} again, over {len(cold)} counts "
          f"({queries} cuBLASLt heuristic queries)\n")

    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for i in range(4, len(batches)):
            with torch.profiler.record_function("batch"):
                body(i)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())["traceEvents"]
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in trace
                   if e.get("name") == "batch" and e.get("cat") == "user_annotation")
    kernels = [e for e in trace if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    runtime = [e for e in trace if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    n = len(spans)
    if n == 0:
        print("the trace holds no 'batch' ranges (profiler without CPU events?)", file=sys.stderr)
        return 1
    wall = sum(e - s for s, e in spans)
    busy = union_us([(e["ts"], e["ts"] + e["dur"]) for e in kernels])
    per_k: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in kernels:
        per_k[kernel_name(e["name"])][0] += 1
        per_k[kernel_name(e["name"])][1] += e["dur"]
    per_r: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in runtime:
        per_r[e["name"]][0] += 1
        per_r[e["name"]][1] += e["dur"]
    # Idle stretches of the GPU inside the batches, by where they start: before the batch's
    # first kernel, and between kernels (attributed to the pair of kernels around them).
    starts = sorted((e["ts"], e["ts"] + e["dur"], kernel_name(e["name"])[:40]) for e in kernels)
    lead, gaps = 0.0, 0.0
    by_pair: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    j = 0
    for s, e in spans:
        while j < len(starts) and starts[j][0] < s:
            j += 1
        first = starts[j][0] if j < len(starts) else e
        lead += max(min(first, e) - s, 0.0)
        k, cur, prev = j, first, ""  # the first kernel starts at `first`: no gap before it
        while k < len(starts) and starts[k][0] < e:
            gap = starts[k][0] - cur
            if gap > 0:
                gaps += gap
                by_pair[f"{prev} -> {starts[k][2]}"][0] += 1
                by_pair[f"{prev} -> {starts[k][2]}"][1] += gap
            if starts[k][1] > cur:
                cur, prev = starts[k][1], starts[k][2]
            k += 1
    print(f"profiled (torch.profiler, CPU + CUDA): wall {wall / n / 1000:.3f} ms/batch, GPU busy "
          f"{busy / n / 1000:.3f} ms/batch, idle before the first kernel {lead / n / 1000:.3f}, "
          f"idle between kernels {gaps / n / 1000:.3f}; kernels per batch "
          f"{len(kernels) / n:.1f}\n")
    print(table(per_k, n, "batch", 18) + "\n")
    print("GPU idle between kernels, by the kernels around it:\n")
    print(table(by_pair, n, "batch", 12) + "\n")
    print("Host-side CUDA calls (their duration on the CPU):\n")
    print(table(per_r, n, "batch", 12))
    if flights:
        # A profiled process's host is slowed by the profiler's callbacks, which starves the GPU
        # of overlapping batches; so the overlap is read from the unprofiled walls instead.
        print("\nBatches in flight against the GPU time of one batch at a time (busy, profiled "
              "above): a wall below it means that kernels of different batches ran at once.\n")
        print("| in flight | wall ms/batch | GPU busy of one batch at a time / wall |\n"
              "|---:|---:|---:|")
        for n_flight, wall in flights.items():
            print(f"| {n_flight} | {wall:.3f} | {busy / n / 1000 / wall:.2f} |")
    return 0


def in_flight_wall(gpt: GPT, n: int, samples: list[bl.Sample], batches: list[list[int]],
                   out_lens: list[int], end: int) -> float:
    """ms per batch of ``gpt.generate_batches`` with ``n`` batches in flight over the profiled
    batches (token lists), after an untimed pass (which builds the replicas it needs and meets
    every prompt row count)."""
    lists = [[samples[j].context.tolist() for j in b] for b in batches[4:]]

    def run() -> None:
        for _ in gpt.generate_batches(lists, out_lens[4:], in_flight=n, end_id=end):
            pass

    run()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    run()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1000 / len(lists)


if __name__ == "__main__":
    sys.exit(main())
