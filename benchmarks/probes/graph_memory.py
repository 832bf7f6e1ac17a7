"""Probe: the device memory CUDA graphs hold outside PyTorch's allocator.

The engine's captured decode steps and prompt passes are instantiated by the driver, whose
memory for them is not in ``torch.cuda.max_memory_allocated`` (what the benchmarks' peak-memory
columns report). This probe runs bench_lambada.py's workload (bloom-560m dimensions, batch 8,
greedy) on two instances over the same weights (``cuda_graphs`` is fixed when an instance is
built):

1. an instance built with ``cuda_graphs=False``, after a pass with the real new-token counts:
   plans, buffers and the workspace made, no graph;
2. an instance with CUDA graphs (the default), just built;
3. after two passes of one new token per batch (prompt passes alone: prompt graphs, no decode
   step): every key the workload repeats is captured in the first; the second shows whether
   anything still grows once they are;
4. after a pass with the real new-token counts (the decode steps' graphs added);

and after each reads the memory in use on the device outside PyTorch's allocator: the device's
used memory (``torch.cuda.mem_get_info``) less ``torch.cuda.memory_reserved``. The differences
between the points are what the graphs hold; divided by the prompt-graph keys held
(``prompt_graph_stats``; a key seen only once holds no graph yet) they give the memory per prompt
graph, as a range (after the first and after the second prompt pass). The driver's figure moves
in steps of about 2 MB. (Run 0520 of ``benchmarks/HISTORY.md`` used this probe's earlier form,
one instance switched per call by environment variables the engine no longer reads.)

    python benchmarks/probes/graph_memory.py [--batches 645]

Not part of the test suite or gpu_check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_lambada as bl  # noqa: E402
import common  # noqa: E402

from warpformer.models.gpt import build_gpt_model  # noqa: E402
from warpformer.options import EngineOptions  # noqa: E402
from warpformer.weights import load_weights, read_config  # noqa: E402


def outside_allocator_mb() -> float:
    """MB in use on the current device that PyTorch's caching allocator did not reserve (the
    CUDA context, library handles, the driver's graph memory...)."""
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return (total - free - torch.cuda.memory_reserved()) / 1e6


def run_all(model, packed, out_lens, end: int) -> None:
    """One pass of the workload with ``out_lens`` new tokens per batch."""
    for (ids, lens), n in zip(packed, out_lens, strict=True):
        model.generate(ids, lens, n, end)
    torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=None, help="default: the whole workload")
    ap.add_argument("--cache-dir", type=Path, default=common.DEFAULT_CACHE_DIR)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("graph_memory: no CUDA device visible; nothing to measure", file=sys.stderr)
        return 2
    shape = common.SHAPES["bloom-560m"]
    samples = bl.make_samples(bl.LAMBADA_SAMPLES, shape.vocab, 0)
    batches = bl.make_batches(len(samples), 8)[: args.batches]
    prep = common.prepare_model(shape, args.cache_dir, 0, need_hf=False)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # a first run converts the checkpoint on the GPU: not the engine's
    torch.cuda.reset_peak_memory_stats()
    max_len = max(len(s.context) for s in samples) + max(bl.TARGET_LENS)
    start = outside_allocator_mb()
    config = read_config(prep.model_dir)
    weights = load_weights(prep.model_dir, dtype=torch.float16, device="cuda")

    def build(cuda_graphs: bool):
        return build_gpt_model(config, weights, dtype=torch.float16, max_batch=8,
                               max_seq_len=max_len, options=EngineOptions(cuda_graphs=cuda_graphs))

    packed = [tuple(t.cuda() for t in bl.pack(samples, b, left=False)) for b in batches]
    out_lens = [max(samples[i].target_len for i in b) for b in batches]
    ones = [1] * len(batches)
    end = shape.vocab - 1

    rows = [("before the models", start, 0)]
    eager = build(False)
    run_all(eager, packed, out_lens, end)
    rows.append(("instance without CUDA graphs, after a pass", outside_allocator_mb(),
                 eager.prompt_graph_stats()[0]))
    model = build(True)
    rows.append(("instance with CUDA graphs, built", outside_allocator_mb(),
                 model.prompt_graph_stats()[0]))
    for k in (1, 2):
        run_all(model, packed, ones, end)
        rows.append((f"after prompt pass {k} (one new token a batch)", outside_allocator_mb(),
                     model.prompt_graph_stats()[0]))
    run_all(model, packed, out_lens, end)
    rows.append(("after a pass with the real new-token counts (step graphs)",
                 outside_allocator_mb(), model.prompt_graph_stats()[0]))
    print(f"## Graph memory: {shape.name}, batch 8, {len(batches)} batches, "
          f"{common.gpu_name()}\n")
    print(f"PyTorch's allocator: {torch.cuda.max_memory_allocated() / 1e9:.2f} GB peak allocated, "
          f"{torch.cuda.memory_reserved() / 1e9:.2f} GB reserved at the end\n")
    print("| point | MB outside PyTorch's allocator | change from the line above | prompt-graph "
          "keys held |\n|---|---:|---:|---:|")
    prev = None
    for label, mb, held in rows:
        delta = "" if prev is None else f"{mb - prev:+.1f}"
        print(f"| {label} | {mb:.1f} | {delta} | {held} |")
        prev = mb
    built, first, second, steps = (mb for _, mb, _ in rows[2:])
    held = rows[4][2]
    if held:
        lo, hi = sorted((first - built, second - built))
        print(f"\nprompt graphs: {lo:.1f}-{hi:.1f} MB for {held} keys, "
              f"{lo / held:.2f}-{hi / held:.2f} MB each; step graphs: {steps - second:+.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
