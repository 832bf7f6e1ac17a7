"""Kernel benchmark: achieved bandwidth of each warpformer element-wise kernel against the
device-to-device copy bandwidth measured in the same run, and its time against the PyTorch
composition it replaces; and the decode-sized GEMV (1 and 8 rows) against cuBLASLt and
torch.matmul on the weight shapes of gpt2-medium and gpt-j-6b; with --quant, weight-only int8 and
int4 products against fp16 on the same shapes.

Method: inputs are rotated among several copies whose total exceeds 4x the L2 cache, so the
numbers are DRAM numbers; each case is warmed up, then timed with CUDA events per call; the
median is reported. Bytes counted are the fewest a kernel must move (each input read once,
each output written once).

    python benchmarks/bench_kernels.py [--json benchmarks/results/kernels.json] [--quick]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

import warpformer  # noqa: F401

ops = torch.ops.warpformer


@dataclass
class Row:
    kernel: str
    dtype: str
    shape: str
    mbytes: float
    wf_us: float
    gbps: float
    pct_copy: float
    torch_us: float
    speedup: float


def time_calls(fns: list[Callable[[], object]], warmup: int = 5, reps: int = 40) -> float:
    """Median time in microseconds of one call, cycling through `fns` (one per input copy)."""
    for i in range(warmup):
        fns[i % len(fns)]()
    torch.cuda.synchronize()
    times = []
    for i in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        fn = fns[i % len(fns)]
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def copies_needed(bytes_per_set: int) -> int:
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(2, min(16, -(-4 * l2 // max(bytes_per_set, 1))))


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in GB/s (bytes read + bytes written)."""
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    us = time_calls([lambda: dst.copy_(src)], warmup=3, reps=20)
    return 2 * n / (us * 1e-6) / 1e9


def bench_case(name: str, dtype: torch.dtype, shape: str, nbytes: int,
               make: Callable[[], tuple[Callable[[], object], Callable[[], object]]],
               copy_gbps: float) -> Row:
    sets = [make() for _ in range(copies_needed(nbytes))]
    wf_us = time_calls([s[0] for s in sets])
    torch_us = time_calls([s[1] for s in sets])
    gbps = nbytes / (wf_us * 1e-6) / 1e9
    return Row(name, str(dtype).replace("torch.", ""), shape, nbytes / 1e6, wf_us, gbps,
               100 * gbps / copy_gbps, torch_us, torch_us / wf_us)


@dataclass
class GemvRow:
    matrix: str
    dtype: str
    m: int
    mbytes: float
    gemv_us: float
    gbps: float
    pct_copy: float
    cublaslt_us: float
    torch_us: float
    speedup_vs_cublaslt: float


# (label, n, k, transposed): [k, n] weights as the engine stores them; lm_head is [vocab, hidden].
GEMV_SHAPES = [
    ("gpt2-medium qkv", 3072, 1024, False),
    ("gpt2-medium attn out", 1024, 1024, False),
    ("gpt2-medium fc1", 4096, 1024, False),
    ("gpt2-medium fc2", 1024, 4096, False),
    ("gpt2-medium lm_head", 50257, 1024, True),
    ("gpt-j-6b qkv", 12288, 4096, False),
    ("gpt-j-6b attn out", 4096, 4096, False),
    ("gpt-j-6b fc1", 16384, 4096, False),
    ("gpt-j-6b fc2", 4096, 16384, False),
    ("gpt-j-6b qkv+fc1", 28672, 4096, False),
]
# --gemv-transposed: the 1,024-wide layer products again with their weights stored [n, k], to
# compare the [n, k] kernel (tensor cores from 3 rows) with the [k, n] one and cuBLASLt.
GEMV_SHAPES_NK = [(f"{label} [n, k]", n, k, True) for label, n, k, transposed in GEMV_SHAPES[:4]]


def time_graph(fns: list[Callable[[], object]], reps: int = 20) -> float | None:
    """Median microseconds per call of `fns` captured back to back in one CUDA graph (GPU time
    without the host's per-call overhead, which exceeds a small GEMV's run time); None when the
    calls cannot be captured."""
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for fn in fns:  # warm-up outside the capture (plans, lazily created state)
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for fn in fns:
                fn()
    except Exception as exc:  # noqa: BLE001 - fall back to per-call timing
        print(f"bench_kernels: graph capture failed ({exc}); timing calls one by one",
              file=sys.stderr)
        return None
    return time_calls([graph.replay], warmup=3, reps=reps) / len(fns)


def _gemm_calls(x: torch.Tensor, weights: list[torch.Tensor], transposed: bool,
                backend: str) -> list[Callable[[], object]]:
    """One call per weight copy: warpformer's gemm op with `backend`, or torch.matmul."""
    if backend == "torch":
        return [functools.partial(torch.matmul, x, w.t() if transposed else w) for w in weights]
    return [functools.partial(ops.gemm, x, w, None, transposed, "none", backend)
            for w in weights]


def gemv_rows(dtype: torch.dtype, quick: bool, copy_gbps: float,
              rows_list: tuple[int, ...] = (1, 8), transposed_too: bool = False) -> list[GemvRow]:
    """Times out = in[m, k] @ W for each m in `rows_list`: GEMV backend, cuBLASLt backend and
    torch.matmul, each as a CUDA graph of one call per weight copy (GPU time per call).
    `transposed_too` adds the 1,024-wide layer products with [n, k] weights."""
    es = torch.tensor([], dtype=dtype).element_size()
    out = []
    shapes = GEMV_SHAPES[:5] + GEMV_SHAPES[7:8] if quick else GEMV_SHAPES
    if transposed_too:
        shapes = shapes + GEMV_SHAPES_NK
    for label, n, k, transposed in shapes:
        wbytes = n * k * es
        sets = []
        for _ in range(copies_needed(wbytes)):
            w = torch.randn((n, k) if transposed else (k, n), device="cuda", dtype=dtype)
            sets.append(w / k ** 0.5)
        for m in rows_list:
            x = torch.randn(m, k, device="cuda", dtype=dtype)
            timed = []
            for backend in ("gemv", "cublaslt", "torch"):
                calls = _gemm_calls(x, sets, transposed, backend)
                t = time_graph(calls)
                timed.append(t if t is not None else time_calls(calls))
            gemv_us, lt_us, torch_us = timed
            nbytes = wbytes + (m * k + m * n) * es
            gbps = nbytes / (gemv_us * 1e-6) / 1e9
            out.append(GemvRow(label, str(dtype).replace("torch.", ""), m, nbytes / 1e6, gemv_us,
                               gbps, 100 * gbps / copy_gbps, lt_us, torch_us, lt_us / gemv_us))
        del sets
        torch.cuda.empty_cache()
    return out


@dataclass
class QuantRow:
    matrix: str
    m: int
    fp16_us: float
    int8_us: float
    int4_us: float
    int8_pct_copy: float  # the int8 call's bytes (weight, scales, input, output) over its time
    int4_pct_copy: float
    int8_speedup: float   # fp16 time / int8 time
    int4_speedup: float


# Rows of the prefill comparison: batch 64 x 128 prompt tokens.
PREFILL_ROWS = 8192


def quant_rows(quick: bool, copy_gbps: float, rows_list: tuple[int, ...]) -> list[QuantRow]:
    """fp16 against weight-only int8 (per channel) and int4 (group 128) on the [k, n] layer
    shapes: the GEMV rows of `rows_list` (each backend's 'auto' path) and a batch-64 prefill
    (PREFILL_ROWS rows: fp16 cuBLASLt against dequantize + cuBLASLt). Each as a CUDA graph of
    one call per weight copy."""
    from warpformer.converters.quantize import quantize

    out = []
    shapes = [s for s in GEMV_SHAPES if not s[3]]
    if quick:
        shapes = shapes[:2] + shapes[5:6]
    for label, n, k, _ in shapes:
        dense, q8, q4 = [], [], []
        for _ in range(copies_needed(n * k * 2)):
            w = torch.randn(k, n, device="cuda") / k ** 0.5
            dense.append(w.half())
            q8.append(quantize(w, "int8", 0, torch.float16))
            q4.append(quantize(w, "int4", 128, torch.float16))
            del w
        for m in (*rows_list, PREFILL_ROWS):
            x = torch.randn(m, k, device="cuda", dtype=torch.float16)
            calls = {
                "fp16": [functools.partial(ops.gemm, x, w, None, False, "none", "auto")
                         for w in dense],
                "int8": [functools.partial(ops.gemm_quant, x, q.data, q.scale, None, None, 0,
                                           "none", "auto") for q in q8],
                "int4": [functools.partial(ops.gemm_quant, x, q.data, q.scale, None, None, 128,
                                           "none", "auto") for q in q4]}
            us = {}
            for name, fns in calls.items():
                t = time_graph(fns)
                us[name] = t if t is not None else time_calls(fns)
            io = (m * k + m * n) * 2
            pct = [100 * (q.data.numel() + q.scale.numel() * 2 + io) / (us[name] * 1e-6) / 1e9
                   / copy_gbps for q, name in ((q8[0], "int8"), (q4[0], "int4"))]
            out.append(QuantRow(label, m, us["fp16"], us["int8"], us["int4"], *pct,
                                us["fp16"] / us["int8"], us["fp16"] / us["int4"]))
        del dense, q8, q4
        torch.cuda.empty_cache()
    return out


def cases(dtype: torch.dtype, quick: bool) -> list[tuple]:
    es = torch.tensor([], dtype=dtype).element_size()
    rows, h = (4096, 4096) if quick else (16384, 4096)
    inter = 4 * h
    act_rows = rows // 4

    def rnd(*s: int) -> torch.Tensor:
        return torch.randn(*s, device="cuda", dtype=dtype)

    def ln():
        x, w, b = rnd(rows, h), rnd(h), rnd(h)
        return (lambda: ops.layer_norm(x, w, b, 1e-5),
                lambda: F.layer_norm(x, (h,), w, b, 1e-5))

    def rms():
        x, w = rnd(rows, h), rnd(h)
        return (lambda: ops.rms_norm(x, w, 1e-6),
                lambda: x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(dtype)
                * w)

    def add_ln():
        x, r, b, w = rnd(rows, h), rnd(rows, h), rnd(h), rnd(h)

        def torch_fn():
            r.add_(x + b)
            return F.layer_norm(r, (h,), w, b, 1e-5)

        return (lambda: ops.add_layer_norm(x, r, b, w, b, 1e-5), torch_fn)

    def gelu():
        x, b = rnd(act_rows, inter), rnd(inter)
        return (lambda: ops.bias_act(x, b, "gelu_tanh"),
                lambda: F.gelu(x + b, approximate="tanh"))

    def swiglu():
        x, b = rnd(act_rows, 2 * inter), rnd(2 * inter)

        def torch_fn():
            y = x + b
            return F.silu(y[:, :inter]) * y[:, inter:]

        return (lambda: ops.gated_act(x, b, "silu"), torch_fn)

    def emb():
        vocab, npos = 50304, 2048
        wte, wpe = rnd(vocab, h), rnd(npos, h)
        ids = torch.randint(0, vocab, (rows // npos if rows >= npos else 1, npos), device="cuda",
                            dtype=torch.int32)
        pos = torch.arange(npos, device="cuda").expand_as(ids)
        ids64 = ids.long()
        return (lambda: ops.embedding(ids, wte, wpe),
                lambda: F.embedding(ids64, wte) + F.embedding(pos, wpe))

    tok = (rows // 2048) * 2048 if rows >= 2048 else 2048
    return [
        ("layer_norm", f"[{rows}, {h}]", 2 * rows * h * es + 2 * h * es, ln),
        ("rms_norm", f"[{rows}, {h}]", 2 * rows * h * es + h * es, rms),
        ("add_layer_norm", f"[{rows}, {h}]", 4 * rows * h * es + 3 * h * es, add_ln),
        ("bias_act gelu_tanh", f"[{act_rows}, {inter}]", 2 * act_rows * inter * es, gelu),
        ("gated_act silu", f"[{act_rows}, {2 * inter}]", 3 * act_rows * inter * es, swiglu),
        # token rows read + position rows read + output written (+ ids)
        ("embedding", f"[{tok} tokens, {h}]", 3 * tok * h * es + 4 * tok, emb),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=None, help="write the rows as JSON here")
    ap.add_argument("--quick", action="store_true", help="smaller tensors (still >= 16 MB)")
    ap.add_argument("--gemv-only", action="store_true", help="only the GEMV table")
    ap.add_argument("--gemv-rows", default="1,8",
                    help="comma-separated row counts for the GEMV table (default 1,8)")
    ap.add_argument("--gemv-transposed", action="store_true",
                    help="also time the 1,024-wide layer products with [n, k] weights")
    ap.add_argument("--quant", action="store_true",
                    help="also the weight-only int8/int4 table (GEMV rows and a batch-64 prefill)")
    ap.add_argument("--quant-only", action="store_true", help="only the int8/int4 table")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_kernels: no CUDA device visible; nothing to measure", file=sys.stderr)
        return 2
    gpu = torch.cuda.get_device_name(0)
    copy_gbps = copy_bandwidth()
    rows: list[Row] = []
    for dtype in () if args.gemv_only or args.quant_only else (torch.float16, torch.bfloat16,
                                                                torch.float32):
        for name, shape, nbytes, make in cases(dtype, args.quick):
            rows.append(bench_case(name, dtype, shape, nbytes, make, copy_gbps))
            torch.cuda.empty_cache()
    print(f"\n## Kernel bandwidth on {gpu} (copy bandwidth {copy_gbps:.0f} GB/s, read+write)\n")
    print("| kernel | dtype | shape | MB moved | warpformer us | GB/s | % of copy | torch us | "
          "speedup |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r.kernel} | {r.dtype} | {r.shape} | {r.mbytes:.0f} | {r.wf_us:.1f} | "
              f"{r.gbps:.0f} | {r.pct_copy:.0f}% | {r.torch_us:.1f} | {r.speedup:.2f}x |")
    gemv: list[GemvRow] = []
    for dtype in () if args.quant_only else (torch.float16, torch.bfloat16):
        gemv += gemv_rows(dtype, args.quick, copy_gbps,
                          tuple(int(t) for t in args.gemv_rows.split(",")),
                          args.gemv_transposed)
    print(f"\n## Decode-sized GEMV on {gpu} (GPU time per call, from a CUDA graph of one call "
          "per weight copy; weights from DRAM; bytes = weight + input + output)\n")
    print("| matrix | dtype | m | MB | GEMV us | GB/s | % of copy | cuBLASLt us | torch us | "
          "GEMV vs cuBLASLt |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for g in gemv:
        print(f"| {g.matrix} | {g.dtype} | {g.m} | {g.mbytes:.1f} | {g.gemv_us:.1f} | "
              f"{g.gbps:.0f} | {g.pct_copy:.0f}% | {g.cublaslt_us:.1f} | {g.torch_us:.1f} | "
              f"{g.speedup_vs_cublaslt:.2f}x |")
    quant: list[QuantRow] = []
    if args.quant or args.quant_only:
        quant = quant_rows(args.quick, copy_gbps, tuple(int(t) for t in args.gemv_rows.split(",")))
        print(f"\n## Weight-only int8 / int4 (group 128) against fp16 on {gpu} (backend 'auto': "
              f"the GEMV up to 8 rows, dequantize + cuBLASLt past them; m = {PREFILL_ROWS} is a "
              "batch-64 prefill; % of copy: the call's own bytes)\n")
        print("| matrix | m | fp16 us | int8 us | int4 us | int8 % of copy | int4 % of copy | "
              "int8 vs fp16 | int4 vs fp16 |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in quant:
            print(f"| {r.matrix} | {r.m} | {r.fp16_us:.1f} | {r.int8_us:.1f} | {r.int4_us:.1f} | "
                  f"{r.int8_pct_copy:.0f}% | {r.int4_pct_copy:.0f}% | {r.int8_speedup:.2f}x | "
                  f"{r.int4_speedup:.2f}x |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"gpu": gpu, "copy_gbps": copy_gbps,
                                         "rows": [asdict(r) for r in rows],
                                         "gemv": [asdict(g) for g in gemv],
                                         "quant": [asdict(r) for r in quant]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
