"""Probe: the device memory CUDA graphs hold outside PyTorch's allocator.

The engine's captured decode steps and prompt passes are instantiated by the driver, whose
memory for them is not in ``torch.cuda.max_memory_allocated`` (what the benchmarks' peak-memory
columns report). This probe runs bench_lambada.py's workload (bloom-560m dimensions, batch 8,
greedy, the real new-token counts) four times on one instance, both graph variables set
explicitly for each pass (the engine reads them per call):

1. without CUDA graphs (``WARPFORMER_CUDA_GRAPHS=0``): plans, buffers and the workspace made;
2. with step graphs only (``WARPFORMER_PROMPT_GRAPHS=0``);
3. with prompt graphs too, twice: every key the workload repeats is captured in the first of
   these passes; the second shows whether anything still grows once they are;

and after each reads the memory in use on the device outside PyTorch's allocator: the device's
used memory (``torch.cuda.mem_get_info``) less ``torch.cuda.memory_reserved``. The differences
between the passes are what the graphs hold; divided by the prompt-graph keys held
(``prompt_graph_stats``; a key seen only once holds no graph yet) they give the memory per prompt
graph, as a range (after the first and after the second prompt-graph pass). The driver's
figure moves in steps of about 2 MB.

    python benchmarks/probes/graph_memory.py [--batches 645]

Not part of the test suite or gpu_check.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_lambada as bl  # noqa: E402
import common  # noqa: E402

from warpformer.models.gpt import load_gpt_model  # noqa: E402


def outside_allocator_mb() -> float:
    """MB in use on the current device that PyTorch's caching allocator did not reserve (the
    CUDA context, library handles, the driver's graph memory...)."""
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return (total - free - torch.cuda.memory_reserved()) / 1e6


def run_all(model, packed, out_lens, end: int, env: dict[str, str]) -> None:
    """One pass of the workload with `env` set (the engine reads it per call; restored after)."""
    with mock.patch.dict(os.environ, env):
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
    model = load_gpt_model(prep.model_dir, dtype=torch.float16, max_batch=8, max_seq_len=max_len)
    packed = [tuple(t.cuda() for t in bl.pack(samples, b, left=False)) for b in batches]
    out_lens = [max(samples[i].target_len for i in b) for b in batches]
    end = shape.vocab - 1

    rows = [("before the model", start, 0)]
    run_all(model, packed, out_lens, end, {"WARPFORMER_CUDA_GRAPHS": "0"})
    rows.append(("after a pass without CUDA graphs", outside_allocator_mb(),
                 model.prompt_graph_stats()[0]))
    run_all(model, packed, out_lens, end,
            {"WARPFORMER_CUDA_GRAPHS": "1", "WARPFORMER_PROMPT_GRAPHS": "0"})
    rows.append(("after a pass with step graphs only", outside_allocator_mb(),
                 model.prompt_graph_stats()[0]))
    for k in (1, 2):
        run_all(model, packed, out_lens, end,
                {"WARPFORMER_CUDA_GRAPHS": "1", "WARPFORMER_PROMPT_GRAPHS": "1"})
        rows.append((f"after pass {k} with prompt graphs", outside_allocator_mb(),
                     model.prompt_graph_stats()[0]))
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
    step_only, first, last = rows[2][1], rows[3][1], rows[-1][1]
    held = rows[-1][2]
    if held:
        lo, hi = sorted((first - step_only, last - step_only))
        print(f"\nprompt graphs: {lo:.1f}-{hi:.1f} MB for {held} keys, "
              f"{lo / held:.2f}-{hi / held:.2f} MB each")
    return 0


if __name__ == "__main__":
    sys.exit(main())
