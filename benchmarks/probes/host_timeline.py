"""Probe: where the host spends a LAMBADA-shaped batch, and whether it is the bound.

``engine.generate`` is meant to queue a batch's work and return while the GPU runs it. This probe
measures, per batch of bench_lambada.py's workload (bloom-560m dimensions, batch 8, CPU inputs
as ``GPT.generate`` passes them): the host time inside the engine's call, whether the GPU was
still busy when the call returned (``torch.cuda.Stream.query``), and the wait that followed; with
the real new-token counts and with one token (the prompt pass alone), each on the default
instance and on a second one over the same weights built with ``cuda_graphs=False`` (every
kernel launched by the host, prompts over their exact token count).
Then ``GPT.generate_batches`` at 1-6 in flight, its host time split into the argument checks,
the engine's call, the wait for the GPU before each batch's outputs are read, and the output
conversion: where that host time nearly fills the wall, the host is the bound. (Run 0129 of
``benchmarks/HISTORY.md`` measured the instances driven from worker threads with this probe's
earlier form, code ``4451d23``. Its runs before the engine options also had rows without
prompt graphs alone and without shared step graphs, switched per call by environment variables
the engine no longer reads.)

    python benchmarks/probes/host_timeline.py [--batches 200]

Not part of the test suite or gpu_check.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_lambada as bl  # noqa: E402
import common  # noqa: E402

from warpformer.gpt import GPT  # noqa: E402
from warpformer.models.gpt import build_gpt_model  # noqa: E402
from warpformer.options import EngineOptions  # noqa: E402
from warpformer.weights import load_weights, read_config  # noqa: E402


def engine_calls(model, packed, out_lens, end, one_token: bool) -> dict[str, float]:
    """ms per batch: host time in generate, share of calls that returned with the GPU busy,
    the wait after it."""
    call, wait, busy = [], [], 0
    stream = torch.cuda.current_stream()
    for (ids, lens), n in zip(packed, out_lens, strict=True):
        t0 = time.perf_counter()
        out, _ = model.generate(ids, lens, 1 if one_token else n, end)
        t1 = time.perf_counter()
        busy += not stream.query()
        stream.synchronize()
        t2 = time.perf_counter()
        call.append(1000 * (t1 - t0))
        wait.append(1000 * (t2 - t1))
    return {"call": statistics.mean(call), "call_median": statistics.median(call),
            "wait": statistics.mean(wait), "busy_at_return": busy / len(packed)}


def flight_split(gpt: GPT, lists, out_lens, end, n: int) -> dict[str, float]:
    """ms per batch of generate_batches at ``n`` in flight, and its host time by part."""
    acc: dict[str, float] = defaultdict(float)
    orig_inputs, orig_prepare, orig_output = gpt._inputs, gpt._prepare, gpt._output

    def add(name: str, t0: float) -> None:
        acc[name] += time.perf_counter() - t0

    def inputs(*a, **k):
        t0 = time.perf_counter()
        try:
            return orig_inputs(*a, **k)
        finally:
            add("input checks (Python)", t0)

    def prepare(*a, **k):
        t0 = time.perf_counter()
        call = orig_prepare(*a, **k)
        add("argument checks (inputs included)", t0)

        def timed_call(engine):
            t1 = time.perf_counter()
            try:
                return call(engine)
            finally:
                add("engine call", t1)
        return timed_call

    def output(result, lengths):
        t0 = time.perf_counter()
        torch.cuda.current_stream().synchronize()  # the batch's stream
        add("wait for the GPU", t0)
        t1 = time.perf_counter()
        try:
            return orig_output(result, lengths)
        finally:
            add("outputs (host)", t1)

    for _ in gpt.generate_batches(lists, out_lens, in_flight=n, end_id=end):
        pass  # untimed: replicas built, every row count met
    torch.cuda.synchronize()
    gpt._inputs, gpt._prepare, gpt._output = inputs, prepare, output
    try:
        t0 = time.perf_counter()
        for _ in gpt.generate_batches(lists, out_lens, in_flight=n, end_id=end):
            pass
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    finally:
        del gpt._inputs, gpt._prepare, gpt._output
    res = {k: 1000 * v / len(lists) for k, v in acc.items()}
    res["wall"] = 1000 * wall / len(lists)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--cache-dir", type=Path, default=common.DEFAULT_CACHE_DIR)
    args = ap.parse_args(argv)
    shape = common.SHAPES["bloom-560m"]
    samples = bl.make_samples(bl.LAMBADA_SAMPLES, shape.vocab, 0)
    batches = bl.make_batches(len(samples), 8)[: args.batches]
    prep = common.prepare_model(shape, args.cache_dir, 0, need_hf=False)
    max_len = max(len(s.context) for s in samples) + max(bl.TARGET_LENS)
    config = read_config(prep.model_dir)
    weights = load_weights(prep.model_dir, dtype=torch.float16, device="cuda")

    def build(cuda_graphs: bool):
        return build_gpt_model(config, weights, dtype=torch.float16, max_batch=8,
                               max_seq_len=max_len, options=EngineOptions(cuda_graphs=cuda_graphs))

    model, eager = build(True), build(False)
    packed = [bl.pack(samples, b, left=False) for b in batches]
    out_lens = [max(samples[i].target_len for i in b) for b in batches]
    end = shape.vocab - 1
    print(f"## Host timeline: {shape.name}, batch 8, {len(batches)} batches, "
          f"{common.gpu_name()}\n")
    print("| engine.generate (CPU inputs) | host ms in the call (mean / median) | returned with "
          "the GPU busy | wait after it ms |\n|---|---:|---:|---:|")
    for label, one, engine in (("new tokens as in the workload", False, model),
                               ("one new token (prompt pass)", True, model),
                               ("new tokens, cuda_graphs=False", False, eager),
                               ("one new token, cuda_graphs=False", True, eager)):
        engine_calls(engine, packed, out_lens, end, one)  # warm: plans, graphs
        r = engine_calls(engine, packed, out_lens, end, one)
        print(f"| {label} | {r['call']:.3f} / {r['call_median']:.3f} | "
              f"{100 * r['busy_at_return']:.0f}% | {r['wait']:.3f} |")
    del eager
    gpt = GPT(model, config, "cuda", torch.float16, torch.device("cuda"))
    lists = [[samples[j].context.tolist() for j in b] for b in batches]
    splits = {f"{n} in flight": flight_split(gpt, lists, out_lens, end, n)
              for n in (1, 2, 3, 4, 6)}
    names = ["wall", "argument checks (inputs included)", "input checks (Python)",
             "engine call", "wait for the GPU", "outputs (host)"]
    print("\nGPT.generate_batches, ms per batch:\n")
    print("| | " + " | ".join(names) + " |\n|---|" + "---:|" * len(names))
    for label, r in splits.items():
        print(f"| {label} | " + " | ".join(f"{r.get(k, 0.0):.3f}" for k in names) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
