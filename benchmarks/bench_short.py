"""Short generations: milliseconds per ``generate()`` call against the number of new tokens,
on an engine launching every kernel itself (``eager``: built with ``cuda_graphs=False``) and on
one replaying decode steps and prompt passes from CUDA graphs (``graphs``: the default; a step
graph is captured on the third step of a session), two instances over the same weights, plus the
GPU's busy time and kernel count per call (torch profiler, graphs). LAMBADA-style
evaluation generates 1-3 tokens per batch: this splits such a call into the prompt plus first
token (1 new token) and each further token, and shows what the graph costs and saves there.

    python benchmarks/bench_short.py --model bloom-560m --batch 8 --input-len 80 \\
        --outputs 1,2,3,4,6,8,16

Weights are random (as bench_generate.py), prompts random; the end id is never produced, so every
call runs exactly the asked number of steps. CUDA events around each call, median of --repeats.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

SETTINGS = ("eager", "graphs")


def _positive(text: str) -> int:
    vals = common.positive_ints(text)
    if len(vals) != 1:
        raise argparse.ArgumentTypeError(f"expected one integer >= 1, got {text!r}")
    return vals[0]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bloom-560m", help="a model shape of benchmarks/common.py")
    ap.add_argument("--batch", type=_positive, default=8)
    ap.add_argument("--input-len", type=_positive, default=80)
    ap.add_argument("--outputs", type=common.positive_ints, default=[1, 2, 3, 4, 6, 8, 16],
                    help="new tokens per call (comma list)")
    ap.add_argument("--repeats", type=_positive, default=20, help="timed calls per cell")
    ap.add_argument("--cache-dir", type=Path, default=Path("~/.cache/warpformer-bench"))
    ap.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent / "results")
    args = ap.parse_args(argv)
    try:
        common.parse_models(args.model)
    except ValueError as e:
        ap.error(f"--model: {e}")
    return args


def table(outputs: list[int], ms: dict[str, dict[int, float]],
          busy: dict[int, tuple[float, int]]) -> str:
    """Markdown: one row per output length: ms per call eager and with graphs, their difference
    (negative: the graph pays), the graphs' ms per token after the first ((t(n) - t(1)) /
    (n - 1), when 1 was measured), and the GPU busy ms and kernels of one call (graphs)."""
    rows = []
    first = ms["graphs"].get(1)
    for n in outputs:
        e, g = ms["eager"].get(n), ms["graphs"].get(n)
        per = None if first is None or g is None or n == 1 else (g - first) / (n - 1)
        b, k = busy.get(n, (None, None))
        rows.append([n, common.fnum(e, 3), common.fnum(g, 3),
                     common.fnum(None if e is None or g is None else g - e, 3),
                     common.fnum(per, 3), common.fnum(b, 3), "—" if k is None else k])
    return common.md_table(["new tokens", "eager ms", "graphs ms", "graphs - eager",
                            "graphs: ms per token after the first", "GPU busy ms", "kernels"],
                           rows)


def gpu_busy(fn: Callable[[], object]) -> tuple[float, int]:
    """(summed kernel ms, kernel count) of one fn() call, from the torch profiler."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(e.device_time_total for e in kernels) / 1000.0, len(kernels)


def time_calls(generate: Callable[[int], object], outputs: list[int],
               reps: int) -> dict[int, float]:
    """Median ms per ``generate(n)`` for each n."""
    return {n: common.median(common.time_cuda(lambda n=n: generate(n), warmup=3, reps=reps))
            for n in outputs}


def engines(config: object, weights: dict[str, torch.Tensor], batch: int,
            max_len: int) -> dict[str, object]:
    """One engine instance per setting over the same weights (``cuda_graphs`` is fixed when an
    instance is built): ``eager`` with ``cuda_graphs=False``, ``graphs`` with the default."""
    from warpformer.models.gpt import build_gpt_model
    from warpformer.options import EngineOptions

    return {setting: build_gpt_model(config, weights, dtype=torch.float16, max_batch=batch,
                                      max_seq_len=max_len,
                                      options=EngineOptions(cuda_graphs=setting == "graphs"))
            for setting in SETTINGS}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from warpformer.weights import load_weights, read_config

    shape = common.parse_models(args.model)[0]
    prep = common.prepare_model(shape, args.cache_dir.expanduser(), seed=0, need_hf=False)
    ids = common.make_prompts(shape.vocab, args.batch, args.input_len, seed=1).to(
        "cuda", torch.int32)
    lens = torch.full((args.batch,), args.input_len, dtype=torch.int32, device="cuda")
    end = shape.vocab - 1  # never produced by the prepared models
    max_len = args.input_len + max(args.outputs)
    config = read_config(prep.model_dir)
    weights = load_weights(prep.model_dir, dtype=torch.float16, device="cuda")
    models = engines(config, weights, args.batch, max_len)

    def generator(setting: str) -> Callable[[int], object]:
        return lambda n: models[setting].generate(ids, lens, n, end)

    ms = {setting: time_calls(generator(setting), args.outputs, args.repeats)
          for setting in SETTINGS}
    gen = generator("graphs")
    busy = {n: gpu_busy(lambda n=n: gen(n)) for n in args.outputs}
    for setting, row in ms.items():
        common.log(f"{setting}: " + ", ".join(f"{n}: {v:.3f} ms" for n, v in row.items()))
    gpu = common.gpu_name()
    md = (f"## Short generations: {shape.name}, batch {args.batch}, {args.input_len} prompt "
          f"tokens, {gpu}\n\nms per generate() call (median of {args.repeats}).\n\n"
          + table(args.outputs, ms, busy))
    payload = {"model": shape.name, "batch": args.batch, "input_len": args.input_len,
               "repeats": args.repeats, "ms_per_call": ms,
               "gpu_busy_ms": {n: b for n, (b, _) in busy.items()},
               "kernels_per_call": {n: k for n, (_, k) in busy.items()}, "env": common.env_info()}
    paths = common.write_results(args.out_dir, common.result_stem("short", gpu), payload, md)
    print(md)
    print(f"\nresults: {paths[0]} and {paths[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
