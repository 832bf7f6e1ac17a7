"""Where a decode step's time goes: kernels per step, their share of GPU time, and the launch
gaps (wall time the GPU spends idle between kernels), for a random-init model.

    python tools/profile_decode.py --model gpt2-medium --batch 1 --steps 32

Runs greedy generation on an engine built with ``cuda_graphs=False`` (every kernel launched by
the host, so each is visible to the profiler) and, timed only, on a second instance over the same
weights with CUDA graphs, and prints a per-kernel table for one step. ``--prefill`` profiles the
prompt pass instead (a generate() of one new token: the prompt through every layer, the logits of
each row's last token and the first greedy choice), per call. With programmatic dependent launch
(on wherever the GPU supports it; it has no off switch) a kernel's duration includes the time it
waits for the one ahead of it.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import common  # noqa: E402

from warpformer.models.gpt import build_gpt_model  # noqa: E402
from warpformer.options import EngineOptions  # noqa: E402
from warpformer.weights import load_weights, read_config  # noqa: E402


def kernel_name(full: str) -> str:
    """A profiler kernel name without return type, namespaces and arguments, keeping the
    template arguments (so that e.g. the GEMV's row counts stay apart), at most 70 characters."""
    name = full.replace("(anonymous namespace)::", "").replace("void ", "", 1)
    name = name.split("(")[0]
    for ns in ("warpformer::kernels::", "cublasLt::", "at::native::"):
        name = name.replace(ns, "")
    return name[:70]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt2-medium")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--cache-dir", type=Path, default=Path("~/.cache/warpformer-bench"))
    ap.add_argument("--prefill", action="store_true",
                    help="profile the prompt pass (generate of one token), per call")
    args = ap.parse_args(argv)
    if not args.prefill and args.steps < 2:
        ap.error("--steps must be at least 2 (a step is the time after the first token)")
    shape = common.parse_models(args.model)[0]
    prep = common.prepare_model(shape, args.cache_dir, seed=0, need_hf=False)
    config = read_config(prep.model_dir)
    weights = load_weights(prep.model_dir, dtype=torch.float16, device="cuda")

    def build(cuda_graphs: bool):
        return build_gpt_model(config, weights, dtype=torch.float16, max_batch=args.batch,
                               max_seq_len=args.input_len + args.steps,
                               options=EngineOptions(cuda_graphs=cuda_graphs))

    model = build(False)  # profiled: every kernel launched by the host
    ids = torch.randint(3, shape.vocab - 1, (args.batch, args.input_len), dtype=torch.int32,
                        device="cuda")
    lens = torch.full((args.batch,), args.input_len, dtype=torch.int32, device="cuda")
    end = shape.vocab - 1

    def step_ms(engine) -> float:
        full = common.median(common.time_cuda(lambda: engine.generate(ids, lens, args.steps, end),
                                              warmup=2, reps=5))
        one = common.median(common.time_cuda(lambda: engine.generate(ids, lens, 1, end),
                                             warmup=2, reps=5))
        return (full - one) / (args.steps - 1)

    if args.prefill:
        eager = common.median(common.time_cuda(lambda: model.generate(ids, lens, 1, end),
                                               warmup=2, reps=9))
        calls, unit = 5, "call"
    else:
        graphs = build(True)
        with_graphs, eager = step_ms(graphs), step_ms(model)
        del graphs
        calls, unit = args.steps, "step"
    model.generate(ids, lens, 1 if args.prefill else args.steps, end)
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        if args.prefill:
            for _ in range(calls):
                model.generate(ids, lens, 1, end)
        else:
            model.generate(ids, lens, args.steps, end)
        torch.cuda.synchronize()
    per = defaultdict(lambda: [0, 0.0])
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = 0.0
    for e in events:
        name = kernel_name(e.name)
        per[name][0] += 1
        per[name][1] += e.device_time_total / 1000.0
        busy += e.device_time_total / 1000.0
    steps = calls
    what = "Prompt pass" if args.prefill else "Decode step"
    print(f"\n## {what} profile: {shape.name}, batch {args.batch}, context "
          f"{args.input_len}, {common.gpu_name()}\n")
    timing = (f"call (eager): {eager:.3f} ms" if args.prefill else
              f"step with CUDA graphs: {with_graphs:.3f} ms; eager: {eager:.3f} ms")
    print(f"{timing}; GPU busy per {unit} (eager): {busy / steps:.3f} ms; launch gaps (eager): "
          f"{max(eager - busy / steps, 0):.3f} ms/{unit}; kernels per {unit}: "
          f"{len(events) / steps:.1f} ({len(events) / steps / shape.layers:.1f} per layer)\n")
    print(f"| kernel | launches/{unit} | ms/{unit} | share of GPU time |")
    print("|---|---:|---:|---:|")
    for name, (n, t) in sorted(per.items(), key=lambda kv: -kv[1][1])[:14]:
        print(f"| {name} | {n / steps:.1f} | {t / steps:.4f} | {100 * t / busy:.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
