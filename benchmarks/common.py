"""Shared pieces of the end-to-end benchmarks (bench_generate.py, bench_lambada.py).

- the device and its two ceilings measured in the same run: device-to-device copy bandwidth
  (bytes read + bytes written, as in bench_kernels.py) and the fp16 GEMM rate of a large
  ``torch.matmul``;
- CUDA-event timing with warm-up and the median of repeats;
- the model-shape table (real widths and layer counts of gpt2-medium, bloom-560m, opt-1.3b,
  gpt-j-6b, opt-6.7b), analytic parameter counts and the decode floor arithmetic;
- random-init fp16 HF models built directly on the GPU, converted once with
  ``warpformer.converters`` and cached under ``--cache-dir``;
- markdown tables and JSON/markdown result files.

Nothing here touches the GPU at import time; the arithmetic, tables and shapes are tested on the
CPU by tests/test_bench_common.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import gc
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CACHE_DIR = Path("~/.cache/warpformer-bench").expanduser()
DEFAULT_RESULTS_DIR = REPO / "benchmarks" / "results"

# Bump when the weight recipe below changes: cached converted dirs of another recipe are rebuilt.
RECIPE = 1
PEAK = 4.0  # output embedding scale: top-1 margins well above fp16 noise (greedy agreement)


# --------------------------------------------------------------------------- model shapes
@dataclass(frozen=True)
class ModelShape:
    """Dimensions of one decoder-only model (the real checkpoint's, random weights)."""

    name: str
    family: str  # "gpt2" | "bloom" | "opt" | "gptj" | "llama"
    hidden: int
    heads: int
    layers: int
    inter: int
    vocab: int
    positions: int  # rows of the learned position table (gpt2/opt); max context otherwise
    rotary_dim: int = 0
    kv_heads: int = 0  # llama: key/value heads (grouped-query attention); 0 = heads

    def with_layers(self, layers: int | None) -> ModelShape:
        """The same widths with ``layers`` decoder layers (None: unchanged)."""
        return self if not layers else dataclasses.replace(self, layers=layers)

    @property
    def tied(self) -> bool:
        """lm_head shares ``wte`` (all but GPT-J and Llama)."""
        return self.family not in ("gptj", "llama")

    @property
    def kv_width(self) -> int:
        """Width of one token's K (or V): ``kv_heads * head_dim``, the hidden size for MHA."""
        return (self.kv_heads or self.heads) * self.head_dim

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def layer_gemm_params(self) -> int:
        """Weights of one layer's matrix products: QKV + attention out (4h^2; Q, K, V of the
        K/V width and out for Llama) and the FFN (2hi; gate, up and down, 3hi, for Llama)."""
        h, i = self.hidden, self.inter
        if self.family == "llama":
            return 2 * h * h + 2 * h * self.kv_width + 3 * h * i
        return 4 * h * h + 2 * h * i

    def layer_params(self) -> int:
        """All parameters of one decoder layer (matrices, biases, layernorms)."""
        h, i = self.hidden, self.inter
        if self.family == "llama":  # no biases, two RMSNorm weights
            return self.layer_gemm_params() + 2 * h
        if self.family == "gptj":  # no attention biases, one shared layernorm
            return self.layer_gemm_params() + i + h + 2 * h
        # gpt2/bloom: qkv 3h + out h + fc i + fc2 h biases; opt: q,k,v,o 4h + fc i + fc2 h;
        # both have two layernorms (4h).
        return self.layer_gemm_params() + 5 * h + i + 4 * h

    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    def position_params(self) -> int:
        """Learned position table (OPT's has 2 offset rows); 0 for ALiBi/rotary."""
        if self.family == "gpt2":
            return self.positions * self.hidden
        if self.family == "opt":
            return (self.positions + 2) * self.hidden
        return 0

    def param_count(self) -> int:
        """Parameters as HF counts them (tied weights once)."""
        h = self.hidden
        n = self.embedding_params() + self.position_params() + self.layers * self.layer_params()
        n += h if self.family == "llama" else 2 * h  # final norm (RMSNorm: a weight only)
        if self.family == "bloom":
            n += 2 * h  # word_embeddings_layernorm
        if self.family == "gptj":
            n += self.vocab * h + self.vocab  # untied lm_head with bias
        if self.family == "llama":
            n += self.vocab * h  # untied lm_head
        return n

    def gemm_params(self) -> int:
        """Weights that every token multiplies: all layers' matrices + lm_head (V x h)."""
        return self.layers * self.layer_gemm_params() + self.vocab * self.hidden

    def decode_read_params(self) -> int:
        """Parameters a decode step must read: all but the tables it only gathers rows from
        (positions; ``wte`` when the head is untied: GPT-J)."""
        n = self.param_count() - self.position_params()
        return n if self.tied else n - self.embedding_params()

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """K and V of one token in every layer (K/V heads only: a quarter of MHA's at
        ``kv_heads = heads / 4``)."""
        return 2 * self.layers * self.kv_width * dtype_bytes


SHAPES: dict[str, ModelShape] = {s.name: s for s in (
    ModelShape("gpt2-medium", "gpt2", 1024, 16, 24, 4096, 50257, 1024),
    ModelShape("bloom-560m", "bloom", 1024, 16, 24, 4096, 250880, 2048),
    ModelShape("opt-1.3b", "opt", 2048, 32, 24, 8192, 50272, 2048),
    ModelShape("gpt-j-6b", "gptj", 4096, 16, 28, 16384, 50400, 2048, rotary_dim=64),
    ModelShape("opt-6.7b", "opt", 4096, 32, 32, 16384, 50272, 2048),
    ModelShape("llama-3-8b", "llama", 4096, 32, 32, 14336, 128256, 131072, rotary_dim=128,
               kv_heads=8),
)}


def hf_config(shape: ModelShape):
    """The transformers config of ``shape`` (fp16)."""
    import transformers

    s = shape
    if s.family == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=s.vocab, n_embd=s.hidden, n_head=s.heads,
                                      n_layer=s.layers, n_inner=s.inter, n_positions=s.positions,
                                      bos_token_id=min(50256, s.vocab - 1),
                                      eos_token_id=min(50256, s.vocab - 1))
    elif s.family == "bloom":
        cfg = transformers.BloomConfig(vocab_size=s.vocab, hidden_size=s.hidden, n_head=s.heads,
                                       n_layer=s.layers, bos_token_id=1, eos_token_id=2,
                                       pad_token_id=3)
    elif s.family == "opt":
        cfg = transformers.OPTConfig(vocab_size=s.vocab, hidden_size=s.hidden,
                                     num_attention_heads=s.heads, num_hidden_layers=s.layers,
                                     ffn_dim=s.inter, max_position_embeddings=s.positions,
                                     word_embed_proj_dim=s.hidden, do_layer_norm_before=True,
                                     pad_token_id=1, bos_token_id=2, eos_token_id=2)
    elif s.family == "gptj":
        cfg = transformers.GPTJConfig(vocab_size=s.vocab, n_embd=s.hidden, n_head=s.heads,
                                      n_layer=s.layers, n_inner=s.inter, n_positions=s.positions,
                                      rotary_dim=s.rotary_dim,
                                      bos_token_id=min(50256, s.vocab - 1),
                                      eos_token_id=min(50256, s.vocab - 1))
    elif s.family == "llama":
        cfg = transformers.LlamaConfig(vocab_size=s.vocab, hidden_size=s.hidden,
                                       num_attention_heads=s.heads,
                                       num_key_value_heads=s.kv_heads or s.heads,
                                       num_hidden_layers=s.layers, intermediate_size=s.inter,
                                       max_position_embeddings=s.positions, rms_norm_eps=1e-5,
                                       rope_parameters={"rope_type": "llama3",
                                                        "rope_theta": 500000.0, "factor": 8.0,
                                                        "low_freq_factor": 1.0,
                                                        "high_freq_factor": 4.0,
                                                        "original_max_position_embeddings": 8192},
                                       bos_token_id=128000, eos_token_id=128001)
    else:
        raise ValueError(f"unknown family {s.family!r}")
    cfg.dtype = torch.float16  # recorded in the saved config.json
    return cfg


def hf_class(family: str):
    import transformers

    return {"gpt2": transformers.GPT2LMHeadModel, "bloom": transformers.BloomForCausalLM,
            "opt": transformers.OPTForCausalLM, "gptj": transformers.GPTJForCausalLM,
            "llama": transformers.LlamaForCausalLM}[family]


def positive_ints(text: str) -> list[int]:
    """``"1,8,64"`` -> [1, 8, 64]: an argparse type; raises ArgumentTypeError unless every item is
    an integer >= 1."""
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return vals


def parse_models(text: str) -> list[ModelShape]:
    """``"gpt2-medium,gpt-j-6b"`` -> shapes; raises ValueError naming an unknown model."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in SHAPES]
    if bad or not names:
        raise ValueError(f"unknown model(s) {', '.join(bad) or '(none)'}; "
                         f"choose from {', '.join(SHAPES)}")
    return [SHAPES[n] for n in names]


# --------------------------------------------------------------------------- floor arithmetic
def mean_decode_context(input_len: int, output_len: int) -> float:
    """Mean attended length over the decode steps: step s = 1..out-1 attends in + s tokens."""
    return input_len + output_len / 2


def decode_floor_ms(shape: ModelShape, batch: int, context: float, copy_gbps: float,
                    gemm_tflops: float | None = None, dtype_bytes: int = 2,
                    layer_weight_bytes: float | None = None) -> tuple[float, float, float]:
    """(bandwidth floor, compute floor, floor) of one decode step in ms.

    Bandwidth: (weights read + KV cache read at ``context`` tokens per row) / copy bandwidth;
    ``layer_weight_bytes``: bytes per weight of the layers' matrices when they are stored
    otherwise (weight-only int8 / int4 with their scales), the rest in ``dtype_bytes``.
    Compute: 2 * gemm_params * batch flops / the measured GEMM rate (0 when unknown). Activations
    and logits traffic are left out (< 3% of the bytes at batch 64 for these models).
    """
    nbytes = shape.decode_read_params() * dtype_bytes
    if layer_weight_bytes is not None:
        nbytes += shape.layers * shape.layer_gemm_params() * (layer_weight_bytes - dtype_bytes)
    nbytes += shape.kv_bytes_per_token(dtype_bytes) * batch * context
    bw_ms = nbytes / (copy_gbps * 1e9) * 1e3
    comp_ms = 0.0
    if gemm_tflops:
        comp_ms = decode_gemm_flops(shape, batch) / (gemm_tflops * 1e12) * 1e3
    return bw_ms, comp_ms, max(bw_ms, comp_ms)


def decode_gemm_flops(shape: ModelShape, batch: int) -> float:
    """GEMM flops of one decode step (one token per row)."""
    return 2.0 * shape.gemm_params() * batch


def prefill_gemm_flops(shape: ModelShape, batch: int, input_len: int) -> float:
    """GEMM flops of a prefill: every prompt token through the layers, logits of the last one.
    (Attention's own products, ~1% here, are not GEMM weights and are left out.)"""
    layers = 2.0 * shape.layers * shape.layer_gemm_params() * batch * input_len
    return layers + 2.0 * shape.vocab * shape.hidden * batch


# --------------------------------------------------------------------------- device, timing
def gpu_name() -> str:
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no-gpu"


def slug(text: str) -> str:
    """``"NVIDIA H200"`` -> ``"nvidia-h200"``."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def time_cuda(fn: Callable[[], object], *, warmup: int = 1, reps: int = 3,
              setup: Callable[[], object] | None = None) -> list[float]:
    """Milliseconds of each of ``reps`` calls of ``fn`` (after ``warmup`` calls), CUDA events
    around the call only; ``setup`` runs untimed before every call."""
    for _ in range(warmup):
        if setup:
            setup()
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        if setup:
            setup()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def call_ms(fn: Callable[[], Any], cuda: bool) -> tuple[float, Any]:
    """(milliseconds, result) of one ``fn()``: CUDA events around the call, or the host clock."""
    if not cuda:
        t0 = time.perf_counter()
        out = fn()
        return (time.perf_counter() - t0) * 1e3, out
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    out = fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end), out


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def measure(full: Callable[[], Any], prefill: Callable[[], Any], reps: int,
            setup: Callable[[], object] | None = None) -> dict[str, Any]:
    """Times ``full`` (peak memory from its first timed call on) and ``prefill``; keeps the
    output of the last ``full`` call."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    last: dict[str, Any] = {}

    def run() -> None:
        last["out"] = full()

    totals = time_cuda(run, warmup=0, reps=reps, setup=setup)
    peak = torch.cuda.max_memory_allocated()
    prefills = time_cuda(prefill, warmup=1, reps=reps, setup=setup)
    return {"total_ms": median(totals), "prefill_ms": median(prefills), "peak_gb": peak / 1e9,
            "total_samples_ms": totals, "prefill_samples_ms": prefills, "out": last["out"]}


def copy_bandwidth_gbps() -> float:
    """Device-to-device copy bandwidth in GB/s (bytes read + written), 1 GiB buffers."""
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    ms = median(time_cuda(lambda: dst.copy_(src), warmup=3, reps=20))
    return 2 * n / (ms * 1e-3) / 1e9


def gemm_tflops(n: int = 8192, dtype: torch.dtype = torch.float16) -> float:
    """TFLOP/s of an n^3 ``torch.matmul`` on random data (cuBLAS, the ceiling for GEMMs)."""
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    c = torch.empty(n, n, device="cuda", dtype=dtype)
    ms = median(time_cuda(lambda: torch.matmul(a, b, out=c), warmup=5, reps=20))
    return 2.0 * n**3 / (ms * 1e-3) / 1e12


def free_gpu() -> None:
    """Frees what the previous engine left: unreferenced tensors, the caching allocator's free
    blocks, and torch's cuBLAS/cuBLASLt workspaces (32 MiB on Hopper, allocated by the first
    matmul and otherwise kept for the process), so that the next engine's peak memory does not
    carry the previous one's workspace (warpformer has its own)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is not None:
            clear()
        torch.cuda.empty_cache()


def reset_compiled() -> None:
    """Drop torch.compile state (graphs, CUDA-graph pools) between models."""
    try:
        torch._dynamo.reset()
    except Exception:  # noqa: BLE001 - best effort
        pass
    try:
        from torch._inductor import cudagraph_trees

        cudagraph_trees.reset_cudagraph_trees()
    except Exception:  # noqa: BLE001
        pass
    free_gpu()


def short_error(exc: BaseException, limit: int = 160) -> str:
    """One line ``Type: message`` for a table cell."""
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


class Budget:
    """Wall-clock budget for optional work (HF runs); 0 or less: unlimited."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.start = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def allows(self, need_s: float = 0.0) -> bool:
        return self.seconds <= 0 or self.elapsed() + need_s <= self.seconds


# NVLink multicast (NVLS) stays off on the lent multi-GPU machines (see the device notes).
NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                    "NVSHMEM_DISABLE_NVLS": "1"}


def run_ranks(ranks: int, script: str, args: Sequence[str], result: Path, timeout: float,
              env: dict[str, str] | None = None) -> dict[str, Any]:
    """Runs ``script args`` as ``ranks`` processes under ``torchrun --standalone`` (multicast off,
    plus ``env``) and returns the JSON its rank 0 wrote to ``result`` (the file is removed), or
    ``{"error": the tail of stderr}`` when the launch failed."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={ranks}", script, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **NO_MULTICAST_ENV, **(env or {})))
    if proc.returncode != 0:
        return {"error": proc.stderr[-800:]}
    out = json.loads(result.read_text())
    result.unlink()
    return out


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def env_info() -> dict[str, Any]:
    """Versions, device and commit recorded with every result file."""
    info: dict[str, Any] = {
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "gpu": gpu_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
    }
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        info["transformers"] = None
    try:
        rev = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=10)
        info["commit"] = rev.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        info["commit"] = None
    return info


# --------------------------------------------------------------------------- random models
_NORM = re.compile(r"(norm|(^|\.)ln_)")


def randomize_(model: torch.nn.Module, seed: int, never_id: int, peak: float = PEAK) -> None:
    """Deterministic random weights (per-parameter CUDA generator seeded from ``seed`` and the
    name): matrices and embeddings N(0, 0.02), biases N(0, 0.02), layernorm gains 1 + N(0, 0.1)
    and biases N(0, 0.1); the output embedding is scaled by ``peak`` and its row ``never_id`` is
    zeroed (bias -30) so that token is never the argmax: warpformer uses it as end_id and every
    row runs the full output length."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            gen = torch.Generator(device=p.device)
            gen.manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (1 << 62))
            noise = torch.randn(p.shape, generator=gen, device=p.device, dtype=torch.float32)
            if _NORM.search(name):
                p.copy_(1.0 + 0.1 * noise if name.endswith("weight") else 0.1 * noise)
            else:
                p.copy_(0.02 * noise)
            del noise
        head = model.get_output_embeddings()
        head.weight.mul_(peak)
        head.weight[never_id].zero_()
        if getattr(head, "bias", None) is not None:
            head.bias[never_id] = -30.0


def fingerprint(model: torch.nn.Module) -> str:
    """Exact hash of every parameter's bits (integer sums on the GPU, by sorted name)."""
    acc = 0
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        as_int = {2: torch.int16, 4: torch.int32}[p.element_size()]
        s = int(p.detach().contiguous().view(as_int).sum(dtype=torch.int64))
        acc = (acc * 1_000_003 + s + zlib.crc32(name.encode())) % (1 << 61)
    return f"{acc:016x}"


def build_hf_model(shape: ModelShape, seed: int) -> torch.nn.Module:
    """A random-init fp16 HF model of ``shape``, built directly on the GPU, in eval mode, with
    end-of-sequence disabled in its generation config (fixed output lengths)."""
    cfg = hf_config(shape)
    cls = hf_class(shape.family)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float16)
    try:
        with torch.device("cuda"):
            model = cls(cfg)
    finally:
        torch.set_default_dtype(prev)
    # Built under the fp16 default dtype, like from_pretrained(dtype=float16) (buffers included).
    if any(p.dtype != torch.float16 for p in model.parameters()):
        model = model.half()
    model.eval().requires_grad_(False)
    randomize_(model, seed, never_id=shape.vocab - 1)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.eos_token_id = None
    return model


@dataclass
class Prepared:
    """A model ready to benchmark: HF twin (or None) and the converted ``1-gpu`` dir."""

    shape: ModelShape
    model_dir: Path
    hf: torch.nn.Module | None
    build_s: float
    converted: bool  # converted in this run (False: cache hit)


def model_key(shape: ModelShape, seed: int) -> str:
    return f"{shape.name}-L{shape.layers}-s{seed}-r{RECIPE}"


def _cache_meta(root: Path) -> dict[str, Any] | None:
    try:
        return json.loads((root / "meta.json").read_text())
    except (OSError, ValueError):
        return None


def prepare_model(shape: ModelShape, cache_dir: Path, seed: int, need_hf: bool,
                  processes: int | None = None) -> Prepared:
    """Build (and cache) ``shape``: random HF weights on the GPU, saved to a temporary HF folder,
    converted to ``<cache>/<key>/1-gpu`` (fp16) with warpformer.converters, the HF folder
    removed (only the converted copy is kept: 30 GB for the five models). A later run rebuilds
    the HF model from the seed (fast on the GPU) and checks its fingerprint against the cache's;
    a mismatch (other GPU or torch) reconverts."""
    from warpformer.converters import convert

    start = time.monotonic()
    root = Path(cache_dir).expanduser() / model_key(shape, seed)
    meta = _cache_meta(root)
    valid = (meta is not None and meta.get("recipe") == RECIPE
             and meta.get("shape") == dataclasses.asdict(shape)
             and (root / "1-gpu" / "config.ini").is_file())
    if valid and not need_hf:
        return Prepared(shape, root / "1-gpu", None, time.monotonic() - start, False)
    hf = build_hf_model(shape, seed)
    fp = fingerprint(hf)
    if valid and meta.get("fingerprint") == fp:
        return Prepared(shape, root / "1-gpu", hf, time.monotonic() - start, False)
    if valid:
        log(f"[{shape.name}] cached weights differ from the rebuilt model (other GPU or torch?): "
            "reconverting")
    nbytes = 2 * shape.param_count()
    root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(root).free
    if free < 2.1 * nbytes + (1 << 30):
        raise RuntimeError(f"not enough disk under {root}: {free / 1e9:.1f} GB free, "
                           f"{(2.1 * nbytes + (1 << 30)) / 1e9:.1f} GB needed to convert "
                           f"{shape.name}; free space or pass --cache-dir")
    tmp = root / "hf-tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        hf.save_pretrained(tmp)
        procs = processes or (4 if nbytes > 2e9 else 1)
        convert(tmp, root, tensor_para_size=1, data_type="fp16", processes=procs, force=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    (root / "meta.json").write_text(json.dumps({
        "recipe": RECIPE, "seed": seed, "shape": dataclasses.asdict(shape), "fingerprint": fp,
        "gpu": gpu_name(), "torch": torch.__version__,
        "created": _dt.datetime.now().isoformat(timespec="seconds")}, indent=2))
    if not need_hf:  # it was built only to be converted
        del hf
        free_gpu()
        hf = None
    return Prepared(shape, root / "1-gpu", hf, time.monotonic() - start, True)


def make_prompts(vocab: int, batch: int, length: int, seed: int) -> torch.Tensor:
    """int32 ``[batch, length]`` token ids in [3, vocab - 1) (CPU; the same for every engine)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab - 1, (batch, length), generator=gen, dtype=torch.int32)


# --------------------------------------------------------------------------- tables and files
def fnum(x: float | None, digits: int = 2) -> str:
    """A number for a table cell; missing or non-finite values print as an em dash."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    return f"{x:.{digits}f}"


def fpct(x: float | None) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{x:.0f}%"


def fx(x: float | None) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{x:.2f}x"


def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]],
             align: str | None = None) -> str:
    """A GitHub markdown table. ``align`` has one ``l`` or ``r`` per column (default: the first
    column left, the others right); ``|`` in cells is escaped."""
    align = align or "l" + "r" * (len(headers) - 1)
    if len(align) != len(headers):
        raise ValueError(f"align has {len(align)} letters for {len(headers)} columns")

    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    head = "| " + " | ".join(cell(h) for h in headers) + " |"
    sep = "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"
    body = ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join([head, sep, *body])


def result_stem(kind: str, gpu: str, when: _dt.datetime | None = None) -> str:
    """``generate_nvidia-h200_20260105-1432``: the benchmark, the GPU and the local time."""
    when = when or _dt.datetime.now()
    return f"{kind}_{slug(gpu)}_{when.strftime('%Y%m%d-%H%M')}"


def write_results(out_dir: Path, stem: str, payload: dict[str, Any],
                  markdown: str) -> tuple[Path, Path]:
    """Write ``<stem>.json`` and ``<stem>.md`` (atomically: a partial run leaves valid files)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = (out_dir / f"{stem}.json", out_dir / f"{stem}.md")
    for path, text in zip(paths, (json.dumps(payload, indent=2, default=str), markdown),
                          strict=True):
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text + "\n")
        os.replace(tmp, path)
    return paths
