"""Probe: would a prompt pass gain from running its groups on two CUDA streams at once?

The engine runs a long prompt as groups of whole sequences, one after the other on one stream.
Its non-product kernels (norms, QKV preparation, context attention) are bound by latency rather
than bytes, and several of the products fill under two waves of the GPU at 2,048-4,096 rows; a
second group in flight could fill those gaps. This probe measures that without changing the
engine: two engines, each holding half of the batch, called from two threads on two streams
(the engine launches on the caller's current stream and releases the GIL in its calls), against
one engine holding the whole batch, in one process.

    python benchmarks/probes/concurrent_prefill.py [--model gpt2-medium] [--reps 10]

Prints one line per arrangement: the median wall time of a prompt pass with its first token
(generate of one token), and the engines' memory. Not part of the test suite or gpu_check.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import DEFAULT_CACHE_DIR, SHAPES, make_prompts, prepare_model  # noqa: E402


def timed(fn, reps: int) -> float:
    """Median wall ms of `fn` (after three warm-up calls), the GPU idle before and after."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def run_case(model_dir: Path, vocab: int, batch: int, n_in: int, group: int | None,
             reps: int) -> str:
    """One engine with the whole batch against two engines with half each, for one group size
    (None: the engine's default)."""
    from warpformer.models.gpt import load_gpt_model
    from warpformer.options import EngineOptions

    end_id = vocab - 1
    ids = make_prompts(vocab, batch, n_in, 0).cuda()
    lens = torch.full((batch,), n_in, dtype=torch.int32, device="cuda")

    def build(b: int):
        return load_gpt_model(model_dir, dtype=torch.float16, max_batch=b, max_seq_len=n_in + 1,
                              options=EngineOptions(prefill_tokens=group))

    one = build(batch)
    t_one = timed(lambda: one.generate(ids, lens, 1, end_id), reps)
    ref = one.generate(ids, lens, 1, end_id)[0]
    mem_one = one.memory_bytes()
    half = batch // 2
    parts = [(build(half), ids[:half].contiguous(), lens[:half]),
             (build(batch - half), ids[half:].contiguous(), lens[half:])]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    outs: list = [None, None]

    def run_part(i: int) -> None:
        eng, pids, plens = parts[i]
        with torch.cuda.stream(streams[i]):
            outs[i] = eng.generate(pids, plens, 1, end_id)[0]

    def two_threads() -> None:
        th = [threading.Thread(target=run_part, args=(i,)) for i in range(2)]
        for t in th:
            t.start()
        for t in th:
            t.join()

    t_two = timed(two_threads, reps)
    same = bool(torch.equal(torch.cat([outs[0], outs[1]]), ref))
    t_seq = timed(lambda: (run_part(0), run_part(1)), reps)
    mem_two = sum(p[0].memory_bytes() for p in parts)
    label = f"groups of {group}" if group else "default groups"
    return (f"{batch}x{n_in} {label:>16}: one engine {t_one:7.3f} ms ({mem_one / 1e9:.3f} GB) | "
            f"two engines, two streams {t_two:7.3f} ms | one after the other {t_seq:7.3f} ms "
            f"({mem_two / 1e9:.3f} GB) | tokens equal: {same}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gpt2-medium", choices=list(SHAPES))
    ap.add_argument("--cases", default="64x128,8x80,16x128",
                    help="batch x input length, comma list")
    ap.add_argument("--groups", default="0,2048,1024,512",
                    help="prompt group sizes (0: the engine's default), comma list")
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    shape = SHAPES[args.model]
    prep = prepare_model(shape, DEFAULT_CACHE_DIR, 0, need_hf=False)
    print(f"{torch.cuda.get_device_name()}, {args.model}", flush=True)
    for case in args.cases.split(","):
        batch, n_in = (int(v) for v in case.split("x"))
        for g in args.groups.split(","):
            print(run_case(prep.model_dir, shape.vocab, batch, n_in, int(g) or None, args.reps),
                  flush=True)
            torch.cuda.empty_cache()  # the case's engines are gone
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
