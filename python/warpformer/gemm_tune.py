"""``warpformer gemm-tune``: time cuBLASLt's candidate algorithms for every GEMM a model will run
and write the fastest choice per shape to a tuning file.

Arguments follow FasterTransformer's ``gpt_gemm`` (batch, beam, max input length, heads, head
size, inter size, vocab, data type, tensor-parallel size); ``--model-dir`` takes the dimensions and
architecture switches from a converted checkpoint instead. The engine reads the file from the
``gemm_config`` engine option (``GPT.from_pretrained(..., gemm_config=PATH)``) or from
``$WARPFORMER_GEMM_CONFIG``; shapes absent from it, or a file made on another GPU or cuBLASLt
version, fall back to cuBLASLt's heuristic with a one-line warning. Each candidate is timed with
its weight read from DRAM (copies spanning twice the L2 cache, taken in turn), as a model's pass
reads it; ``--warm-weights`` times one copy instead.

File format (text): ``# fingerprint gpu=<name>;cublaslt=<version>`` then one line per shape:
``dtype m n k transposed epilogue accumulate algo_index best_us heuristic_us``, where algo_index
is the position of the chosen algorithm in cuBLASLt's heuristic list for that shape.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

import torch

from warpformer.config import GptConfig
from warpformer.config import local_vocab as config_local_vocab

__all__ = ["EXACT_ROWS", "MAX_PREFILL_GROUP_TOKENS", "MAX_WEIGHT_COPIES",
           "PREFILL_ACTIVATION_BYTES", "PREFILL_GROUP_TOKENS", "GemmShape", "ModelDims",
           "activation_bytes_per_token", "add_arguments", "decode_rows",
           "default_cold_bytes", "ffn_in_epilogue", "gemm_shapes", "heuristic_rows",
           "layer_shapes", "local_vocab", "logits_shapes", "parse_prompt_rows",
           "prefill_group_tokens", "prefill_groups", "prompt_graph_tokens", "prompt_pass_rows",
           "row_buckets", "run", "tune", "weight_copies"]

_TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class GemmShape:
    """One GEMM of the engine: ``out[m, n] = in[m, k] @ W`` (W ``[k, n]``, or ``[n, k]`` when
    ``transposed``), with a cuBLASLt epilogue and optional accumulation into ``out``."""

    m: int
    n: int
    k: int
    transposed: bool = False
    epilogue: str = "none"
    accumulate: bool = False
    what: str = ""

    def key(self) -> tuple[int, int, int, bool, str, bool]:
        """What decides the kernel (and a tuning-file line): all but the label."""
        return (self.m, self.n, self.k, self.transposed, self.epilogue, self.accumulate)


@dataclass(frozen=True)
class ModelDims:
    """The dimensions and switches that decide the engine's GEMM shapes."""

    hidden: int
    inter: int
    vocab: int
    tensor_para_size: int = 1
    word_embed_proj_dim: int = 0
    parallel_residual: bool = False
    activation: str = "gelu_tanh"  # the MLP's: gelu_tanh, gelu_erf, relu or silu
    lm_head_bias: bool = False
    pre_layernorm: bool = True  # False: OPT-350m's post-norm layers
    # Pipeline stages the layers are run on (a runtime choice, not the checkpoint's): with more
    # than one, prompts run at their exact token counts (no prompt graphs) and greedy or sampled
    # decode steps also at micro-batch row counts (decode_rows).
    pipeline_para_size: int = 1

    @classmethod
    def from_config(cls, c: GptConfig, tensor_para_size: int | None = None,
                    pipeline_para_size: int = 1) -> ModelDims:
        """The dimensions and switches of a converted checkpoint's ``GptConfig``, at the
        checkpoint's tensor-parallel size unless ``tensor_para_size`` says otherwise, run on
        ``pipeline_para_size`` stages."""
        tp = c.tensor_para_size if tensor_para_size is None else tensor_para_size
        return cls(c.hidden_size, c.inter_size, c.vocab_size, tp,
                   c.word_embed_proj_dim, c.parallel_residual, c.activation_type,
                   c.has_lm_head_bias, c.layernorm_type == "pre_layernorm", pipeline_para_size)


# Gemm::kExactRows (csrc/core/gemm.h): products of more rows borrow the algorithm chosen for
# their row count rounded up (heuristic_rows), which a tuning file's entry for that count sets.
EXACT_ROWS = 64


def heuristic_rows(m: int) -> int:
    """The row count whose algorithm an ``m``-row product uses (mirrors ``Gemm::heuristic_rows``):
    ``m`` itself up to ``EXACT_ROWS``, else ``m`` rounded up to a multiple of
    ``max(16, bit_ceil(m) / 16)``."""
    if m <= EXACT_ROWS:
        return m
    step = max(16, (1 << (m - 1).bit_length()) // 16)
    return -(-m // step) * step


def row_buckets(lo: int, hi: int) -> list[int]:
    """Every row count ``heuristic_rows(m)`` for ``lo <= m <= hi``, ascending: the counts a
    tuning file needs for prompts of ``lo`` to ``hi`` tokens in a prefill group."""
    if not 1 <= lo <= hi:
        raise ValueError(f"prompt rows must satisfy 1 <= lo <= hi, got {lo}:{hi}")
    out, m = [], lo
    while m <= hi:
        r = heuristic_rows(m)
        out.append(r)
        m = r + 1
    return out


# GptModel's prefill groups (csrc/models/gpt/gpt_model.h): whole sequences of at most
# PREFILL_GROUP_TOKENS tokens together, doubled up to MAX_PREFILL_GROUP_TOKENS while the group's
# activations fit PREFILL_ACTIVATION_BYTES; the prefill_tokens engine option overrides.
PREFILL_GROUP_TOKENS = 2048
MAX_PREFILL_GROUP_TOKENS = 4096
PREFILL_ACTIVATION_BYTES = 64 << 20


def activation_bytes_per_token(dims: ModelDims, dtype_bytes: int = 2) -> int:
    """The engine's activation bytes per prompt token of a group (mirrors
    ``GptModel::activation_bytes_per_token``): x, n and p; y for post-norm layers; the larger of
    the qkv / q / attention-output region and the MLP hidden; OPT-350m's narrow embedding."""
    tp = dims.tensor_para_size
    h, lh, li = dims.hidden, dims.hidden // tp, dims.inter // tp
    words = (3 if dims.pre_layernorm else 4) * h + max(5 * lh, li) + dims.word_embed_proj_dim
    return words * dtype_bytes


def prefill_group_tokens(dims: ModelDims, dtype_bytes: int = 2,
                         prefill_tokens: int | None = None) -> int:
    """The engine's prefill group size in tokens for this model and element size (mirrors
    ``GptModel::prefill_group_size``): ``prefill_tokens`` (the engine option) when given, else
    ``PREFILL_GROUP_TOKENS`` doubled while twice as many tokens' activations fit
    ``PREFILL_ACTIVATION_BYTES``, up to ``MAX_PREFILL_GROUP_TOKENS``."""
    if prefill_tokens is not None:
        if isinstance(prefill_tokens, bool) or not isinstance(prefill_tokens, int) \
                or prefill_tokens < 1:
            raise ValueError(f"prefill_tokens must be a positive number of tokens, got "
                             f"{prefill_tokens!r}")
        return prefill_tokens
    tokens = PREFILL_GROUP_TOKENS
    per_token = activation_bytes_per_token(dims, dtype_bytes)
    while tokens < MAX_PREFILL_GROUP_TOKENS and 2 * tokens * per_token <= PREFILL_ACTIVATION_BYTES:
        tokens *= 2
    return tokens


def ffn_in_epilogue(dims: ModelDims, dtype_bytes: int = 2) -> str:
    """The cuBLASLt epilogue of the engine's MLP-in product at prompt sizes (``Gemm::run_act``):
    ReLU always rides on it, tanh-GELU for 16-bit types, other activations run as a kernel after
    a plain product."""
    if dims.activation == "relu":
        return "bias_relu"
    if dims.activation == "gelu_tanh" and dtype_bytes == 2:
        return "bias_gelu_tanh"
    return "none"


def prefill_groups(lengths: list[int], size: int) -> list[int]:
    """Token counts of the groups the engine runs a prompt batch of ``lengths`` in, for group
    size ``size`` (mirrors ``GptModel::plan_prefill``): as few groups as ``size`` allows, each
    closed once it reaches total / groups tokens or when the next sequence would exceed ``size``."""
    total = sum(lengths)
    n = -(-total // size)
    target = -(-total // n)
    groups: list[int] = []
    cur = 0
    for i, length in enumerate(lengths):
        if cur and cur + length > size:
            groups.append(cur)
            cur = 0
        cur += length
        if cur >= target and i + 1 < len(lengths):
            groups.append(cur)
            cur = 0
    groups.append(cur)
    return groups


# kernels::kGemvMaxRows: up to this many rows the products run on the GEMV path.
GEMV_MAX_ROWS = 8


def prompt_graph_tokens(tokens: int, dims: ModelDims, cuda_graphs: bool = True) -> int:
    """The padded token count a one-group prompt pass of ``tokens`` tokens runs at as a CUDA
    graph, or 0 when it runs unpadded (mirrors ``GptModel::prompt_graph_tokens``): padded to a
    multiple of 16 up to 128 tokens, of 64 beyond, on one GPU (``tensor_para_size`` and
    ``pipeline_para_size`` 1) past ``GEMV_MAX_ROWS`` tokens, unless the engine runs without
    ``cuda_graphs``."""
    if (not cuda_graphs or dims.tensor_para_size != 1 or dims.pipeline_para_size != 1
            or tokens <= GEMV_MAX_ROWS):
        return 0
    step = 16 if tokens <= 128 else 64
    return -(-tokens // step) * step


def decode_rows(rows: int, beam: int, dims: ModelDims) -> list[int]:
    """The row counts a decode step's products run at for ``rows`` rows (``batch * beam``),
    ascending (mirrors ``GptModel::decode_micro_batches`` and ``decode_steps_split``): ``rows``,
    and with P > 1 pipeline stages, no beam search and at least P rows, the sizes of the P
    micro-batches that runs of steps are split into (micro-batch m holds rows
    ``[m * rows // P, (m + 1) * rows // P)``)."""
    p = dims.pipeline_para_size
    counts = {rows}
    if p > 1 and beam == 1 and rows >= p:
        counts |= {(m + 1) * rows // p - m * rows // p for m in range(p)}
    return sorted(counts)


def prompt_pass_rows(lengths: list[int], size: int, dims: ModelDims,
                     cuda_graphs: bool = True) -> list[int]:
    """The row counts of a prompt pass's layer products, one per group: ``prefill_groups``'
    token counts, or the padded count of a single group that runs as a prompt graph
    (``prompt_graph_tokens``)."""
    groups = prefill_groups(lengths, size)
    padded = prompt_graph_tokens(groups[0], dims, cuda_graphs) if len(groups) == 1 else 0
    return [padded] if padded else groups


def layer_shapes(dims: ModelDims, m: int, phase: str, dtype_bytes: int = 2) -> list[GemmShape]:
    """The products of one decoder layer at ``m`` rows (mirroring csrc/layers): QKV,
    attention-out, FFN-in (its activation on the epilogue where ``ffn_in_epilogue`` says so),
    FFN-out (accumulating in the parallel-residual form), and OPT-350m's project_in.
    ``phase`` ("context" or "decode") only labels them."""
    tp = dims.tensor_para_size
    h, lh, li = dims.hidden, dims.hidden // tp, dims.inter // tp
    e = dims.word_embed_proj_dim or h
    shapes = [GemmShape(m, 3 * lh, h, what=f"{phase} qkv"),
              GemmShape(m, h, lh, what=f"{phase} attention out"),
              GemmShape(m, li, h, epilogue=ffn_in_epilogue(dims, dtype_bytes),
                        what=f"{phase} ffn in"),
              GemmShape(m, h, li, accumulate=dims.parallel_residual, what=f"{phase} ffn out")]
    if dims.word_embed_proj_dim:
        shapes.append(GemmShape(m, h, e, what=f"{phase} project_in"))
    return shapes


def local_vocab(dims: ModelDims) -> int:
    """The lm_head columns one rank computes (:func:`warpformer.config.local_vocab`)."""
    return config_local_vocab(dims.vocab, dims.tensor_para_size)


def logits_shapes(dims: ModelDims, m: int, phase: str) -> list[GemmShape]:
    """The products after the last layer at ``m`` rows: OPT-350m's project_out, then the lm_head
    (``[V, e]``, transposed, its bias as the epilogue; under tensor parallelism each rank's
    vocabulary slice, ``local_vocab``)."""
    h, e = dims.hidden, dims.word_embed_proj_dim or dims.hidden
    shapes = []
    if dims.word_embed_proj_dim:
        shapes.append(GemmShape(m, e, h, what=f"{phase} project_out"))
    shapes.append(GemmShape(m, local_vocab(dims), e, transposed=True,
                            epilogue="bias" if dims.lm_head_bias else "none",
                            what=f"{phase} lm_head"))
    return shapes


def gemm_shapes(dims: ModelDims, batch: int, beam: int, max_input_len: int,
                dtype_bytes: int = 2, group_tokens: int | None = None,
                prompt_rows: tuple[int, int] | None = None,
                cuda_graphs: bool = True) -> list[GemmShape]:
    """Every distinct GEMM the engine runs for this workload: the layers' products
    (``layer_shapes``) in the context phase at each prefill group's row count (``batch``
    prompts of ``max_input_len`` tokens, rows as ``prompt_pass_rows`` with groups of
    ``group_tokens``, default ``prefill_group_tokens(dims, dtype_bytes)``; a single group that
    runs as a prompt graph at its padded count) and in decode at ``batch * beam`` rows (and
    pipeline micro-batches', ``decode_rows``); the logits' (``logits_shapes``) at ``batch`` rows
    after the prompt and at the decode row counts.
    ``dtype_bytes`` is the element size (it decides the MLP-in epilogue). ``prompt_rows``
    ``(lo, hi)`` adds the layers' products at every rounded row count of that range
    (``row_buckets``) and at the rounded padded count of a one-group pass of each length in it
    (``prompt_graph_tokens``), whose entries serve every prompt group of ``lo`` to ``hi``
    tokens. ``group_tokens`` and ``cuda_graphs`` are the engine options ``prefill_tokens`` and
    ``cuda_graphs`` the tuned model will run with."""
    if group_tokens is not None and group_tokens < 1:
        raise ValueError(f"group_tokens must be >= 1 (or None for the engine's default), got "
                         f"{group_tokens}")
    size = prefill_group_tokens(dims, dtype_bytes) if group_tokens is None else group_tokens
    shapes: list[GemmShape] = []
    for tokens in sorted(set(prompt_pass_rows([max_input_len] * batch, size, dims,
                                              cuda_graphs))):
        shapes += layer_shapes(dims, tokens, "context", dtype_bytes)
    if prompt_rows is not None:
        lo, hi = prompt_rows
        counts = set(row_buckets(lo, hi))
        # A one-group pass of m tokens runs its products at its padded count (a prompt graph).
        counts |= {heuristic_rows(p) for m in range(lo, hi + 1)
                   if (p := prompt_graph_tokens(m, dims, cuda_graphs))}
        for rows in sorted(counts):
            shapes += layer_shapes(dims, rows, "context", dtype_bytes)
    shapes += logits_shapes(dims, batch, "context")
    for rows in decode_rows(batch * beam, beam, dims):
        shapes += layer_shapes(dims, rows, "decode", dtype_bytes)
        shapes += logits_shapes(dims, rows, "decode")
    seen: dict[tuple, GemmShape] = {}
    for s in shapes:
        seen.setdefault(s.key(), s)
    return list(seen.values())


# At most this many weight copies per shape (the op's limit on launches per timing is 1,000).
MAX_WEIGHT_COPIES = 256


def weight_copies(weight_bytes: int, cold_bytes: int) -> int:
    """How many copies of a ``weight_bytes`` weight the tuner's launches take in turn so that
    together they span ``cold_bytes`` (each copy is then evicted from L2 before it is read
    again): ``ceil(cold_bytes / weight_bytes)``, at least 1 and at most ``MAX_WEIGHT_COPIES``."""
    if weight_bytes < 1:
        raise ValueError(f"weight_bytes must be >= 1, got {weight_bytes}")
    if cold_bytes < 0:
        raise ValueError(f"cold_bytes must be >= 0, got {cold_bytes}")
    return max(1, min(MAX_WEIGHT_COPIES, -(-cold_bytes // weight_bytes)))


def default_cold_bytes(device: int = 0) -> int:
    """Twice the L2 cache of ``cuda:<device>``: the bytes of weight copies that make each timed
    launch read its weight from DRAM, as the engine's passes over a model larger than L2 do."""
    return 2 * int(torch.cuda.get_device_properties(device).L2_cache_size)


TuneResult = tuple[GemmShape, int, float, float]


def tune(shapes: list[GemmShape], dtype: torch.dtype, max_algos: int = 16, reps: int = 20,
         device: int = 0, cold_bytes: int | None = None) -> list[TuneResult]:
    """Time each shape's candidates (at most ``max_algos``, ``reps`` launches each) on
    ``cuda:<device>`` with random operands of ``dtype`` (fp32, fp16 or bf16); returns
    ``(shape, best_index, best_us, heuristic_us)`` per shape that has a working candidate.

    The launches take ``weight_copies(weight bytes, cold_bytes)`` copies of the weight in turn
    (and at least one launch per copy), so a weight smaller than L2 is timed read from DRAM as in
    a model's pass, not from L2 after its first launch (weights under ``cold_bytes /
    MAX_WEIGHT_COPIES`` stay partly warm); ``cold_bytes`` defaults to
    ``default_cold_bytes(device)``, and 0 times one copy, warm."""
    out = []
    gen = torch.Generator(device=f"cuda:{device}").manual_seed(0)
    if cold_bytes is None:
        cold_bytes = default_cold_bytes(device)
    for s in shapes:
        a = torch.randn(s.m, s.k, device=f"cuda:{device}", generator=gen).to(dtype)
        wshape = (s.n, s.k) if s.transposed else (s.k, s.n)
        copies = weight_copies(s.n * s.k * a.element_size(), cold_bytes)
        # Each copy starts 256-byte aligned, as cuBLASLt's heuristic assumes of every pointer.
        pitch = -(-s.n * s.k * a.element_size() // 256) * 256 // a.element_size()
        flat = (torch.randn(copies * pitch, device=f"cuda:{device}", generator=gen)
                * 0.05).to(dtype)
        w = flat.as_strided((copies, *wshape), (pitch, wshape[1], 1))
        bias = (torch.randn(s.n, device=f"cuda:{device}", generator=gen).to(dtype)
                if s.epilogue != "none" else None)
        times = torch.ops.warpformer.gemm_benchmark(a, w, bias, s.transposed, s.epilogue,
                                                    s.accumulate, max_algos,
                                                    max(reps, copies)).tolist()
        valid = [(t, i) for i, t in enumerate(times) if t > 0]
        if not valid:
            continue
        best_t, best_i = min(valid)
        out.append((s, best_i, best_t, times[0] if times[0] > 0 else best_t))
        del a, w, bias
    return out


def write_tuning_file(path: str, dtype_name: str,
                      results: list[tuple[GemmShape, int, float, float]], device: int = 0) -> None:
    """Write the tuning file (format in the module docstring)."""
    lines = [f"# fingerprint {torch.ops.warpformer.gemm_fingerprint(device)}",
             "# dtype m n k transposed epilogue accumulate algo_index best_us heuristic_us"]
    for s, i, best, heur in results:
        lines.append(f"{dtype_name} {s.m} {s.n} {s.k} {int(s.transposed)} {s.epilogue} "
                     f"{int(s.accumulate)} {i} {best:.2f} {heur:.2f}")
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, path)


def dims_from_args(args: argparse.Namespace) -> ModelDims:
    """Model dimensions from ``--model-dir`` or from the FT-style size arguments."""
    if args.model_dir:
        from warpformer.weights import read_config

        return ModelDims.from_config(read_config(args.model_dir), args.tensor_para_size,
                                     args.pipeline_para_size)
    missing = [n for n in ("head_num", "size_per_head", "inter_size", "vocab_size")
               if getattr(args, n) is None]
    if missing:
        raise SystemExit("gemm-tune: give --model-dir, or all of "
                         + ", ".join("--" + m.replace("_", "-") for m in missing))
    return ModelDims(args.head_num * args.size_per_head, args.inter_size, args.vocab_size,
                     args.tensor_para_size or 1, activation=args.activation_type,
                     pipeline_para_size=args.pipeline_para_size)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """FT gpt_gemm-style arguments."""
    p.add_argument("--batch-size", type=int, default=1,
                   help="batch size the engine will run (default 1); the decode-step "
                        "products have batch x beam rows")
    p.add_argument("--beam-width", type=int, default=1, help="beams per row (default 1)")
    p.add_argument("--max-input-len", type=int, default=128,
                   help="prompt length of each row: the prompt pass's products run over "
                        "batch x this many tokens, in prefill groups (default 128)")
    p.add_argument("--head-num", type=int,
                   help="attention heads (FT's head_num); taken from the checkpoint with "
                        "--model-dir")
    p.add_argument("--size-per-head", type=int,
                   help="head dimension (FT's size_per_head); taken from the checkpoint with "
                        "--model-dir")
    p.add_argument("--inter-size", type=int,
                   help="MLP inner width (FT's inter_size); taken from the checkpoint with "
                        "--model-dir")
    p.add_argument("--vocab-size", type=int,
                   help="vocabulary size (the lm_head product); taken from the checkpoint "
                        "with --model-dir")
    p.add_argument("--data-type", choices=sorted(_TORCH_DTYPES), default="fp16",
                   help="the products' data type (default fp16)")
    p.add_argument("--activation-type", choices=("gelu_tanh", "gelu_erf", "relu", "silu"),
                   default="gelu_tanh",
                   help="the MLP's activation (sets the MLP-in product's epilogue); taken from "
                        "the checkpoint with --model-dir")
    p.add_argument("--tensor-para-size", type=int, default=None,
                   help="tensor-parallel size (default: the checkpoint's with --model-dir, else 1)")
    p.add_argument("--pipeline-para-size", type=int, default=1,
                   help="pipeline stages the model will run on (default 1): with more, prompts "
                        "run at their exact token counts rather than padded for prompt graphs, "
                        "and decode steps also at the stages' micro-batch row counts")
    p.add_argument("--model-dir", help="converted <tp>-gpu dir: take dims and switches from it")
    p.add_argument("--prompt-rows", metavar="LO:HI",
                   help="also tune the prompt's products for every rounded row count between LO "
                        "and HI tokens a prefill group (prompts of varying length, e.g. 256:2048), "
                        "and for the padded count a one-group pass of each such length runs at "
                        "(prompt graphs); products of other counts borrow these choices")
    p.add_argument("--prefill-tokens", type=int, default=None, metavar="N",
                   help="the prefill_tokens engine option the model will run with (default: "
                        "the engine's own group size)")
    p.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false",
                   help="the model will run with cuda_graphs=False (prompts then run at their "
                        "exact token counts, not padded for prompt graphs)")
    p.add_argument("--output", default="gemm_config.tsv", help="tuning file to write")
    p.add_argument("--max-algos", type=int, default=16, help="candidates timed per shape")
    p.add_argument("--reps", type=int, default=20,
                   help="timed launches per candidate (at least one per weight copy)")
    p.add_argument("--warm-weights", action="store_true",
                   help="time every launch on one copy of the weight, which stays in L2 when it "
                        "fits (the default takes copies spanning twice the L2 cache in turn, so "
                        "each weight is read from DRAM as in a model's pass)")


def parse_prompt_rows(text: str | None) -> tuple[int, int] | None:
    """``"256:2048"`` -> (256, 2048); None stays None; anything else exits naming the option."""
    if text is None:
        return None
    parts = text.split(":")
    if len(parts) == 2 and all(p.strip().isdigit() for p in parts):
        lo, hi = int(parts[0]), int(parts[1])
        if 1 <= lo <= hi:
            return lo, hi
    raise SystemExit(f"gemm-tune: --prompt-rows must be LO:HI with 1 <= LO <= HI, got {text!r}")


def run(args: argparse.Namespace) -> int:
    """Tune and write the file; print per-shape gains."""
    for name in ("batch_size", "beam_width", "max_input_len", "tensor_para_size",
                 "pipeline_para_size", "max_algos", "prefill_tokens"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise SystemExit(f"gemm-tune: --{name.replace('_', '-')} must be >= 1")
    prompt_rows = parse_prompt_rows(args.prompt_rows)
    dims = dims_from_args(args)
    if not torch.cuda.is_available():
        raise SystemExit("gemm-tune: needs a CUDA device (tuning times kernels on the GPU)")
    import warpformer  # noqa: F401  (registers the ops)

    dtype = _TORCH_DTYPES[args.data_type]
    shapes = gemm_shapes(dims, args.batch_size, args.beam_width, args.max_input_len,
                         dtype_bytes=torch.empty(0, dtype=dtype).element_size(),
                         group_tokens=args.prefill_tokens, prompt_rows=prompt_rows,
                         cuda_graphs=args.cuda_graphs)
    results = tune(shapes, _TORCH_DTYPES[args.data_type], args.max_algos, args.reps,
                   cold_bytes=0 if args.warm_weights else None)
    write_tuning_file(args.output, args.data_type, results)
    print(f"{'shape':<28} {'m':>7} {'n':>7} {'k':>7} {'heuristic us':>13} {'tuned us':>9} "
          f"{'gain':>6}")
    for s, _, best, heur in results:
        print(f"{s.what:<28} {s.m:>7} {s.n:>7} {s.k:>7} {heur:>13.2f} {best:>9.2f} "
              f"{heur / best:>5.2f}x")
    print(f"wrote {len(results)} shapes to {args.output}")
    return 0
