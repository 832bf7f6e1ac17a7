"""``warpformer gemm-tune``: time cuBLASLt's candidate algorithms for every GEMM a model will run
and write the fastest choice per shape to a tuning file.

Arguments follow FasterTransformer's ``gpt_gemm`` (batch, beam, max input length, heads, head
size, inter size, vocab, data type, tensor-parallel size); ``--model-dir`` takes the dimensions and
architecture switches from a converted checkpoint instead, also an encoder-decoder one (T5, BART:
FT's ``t5_gemm`` workload of batch, beam and encoder input length, on a ``Seq2SeqModel``). The
shapes are the engine's own: the tuner builds a ``torch.classes.warpformer.GptModel`` of those
dimensions with random weights on the GPU, runs the workload described (a prompt pass of the
batch, then generation steps at its batch and beam width) and reads the cuBLASLt shapes the
instance planned (``gemm_plan_shapes()``).
Products the GEMV kernels run are not among them, and need no tuning. A tensor- or
pipeline-parallel model, which one GPU cannot run, is stood in for by the one-GPU model
(:func:`collect_shapes`).

The engine reads the file from the ``gemm_config`` engine option
(``GPT.from_pretrained(..., gemm_config=PATH)``) or from ``$WARPFORMER_GEMM_CONFIG``; shapes
absent from it, or a file made on another GPU or cuBLASLt version, fall back to cuBLASLt's
heuristic with a one-line warning. Each candidate is timed with its weight read from DRAM (copies
spanning twice the L2 cache, taken in turn), as a model's pass reads it; ``--warm-weights`` times
one copy instead.

File format (text): ``# fingerprint gpu=<name>;cublaslt=<version>`` then one line per shape:
``dtype m n k transposed epilogue accumulate algo_index best_us heuristic_us``, where algo_index
is the position of the chosen algorithm in cuBLASLt's heuristic list for that shape.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from dataclasses import dataclass

import torch

from warpformer.config import GptConfig, local_vocab
from warpformer.t5_config import T5Config
from warpformer.weights import DTYPES, weight_specs

__all__ = ["GENERATION_STEPS", "MAX_WEIGHT_COPIES", "SHAPE_LAYERS", "GemmShape", "add_arguments",
           "collect_seq2seq_shapes", "collect_shapes", "config_from_args", "default_cold_bytes",
           "heuristic_rows", "one_gpu_config", "parse_plan_line", "parse_prompt_rows",
           "random_weights", "rank_shapes", "row_buckets", "run", "tune", "weight_copies",
           "write_tuning_file"]


@dataclass(frozen=True)
class GemmShape:
    """One GEMM of the engine: ``out[m, n] = in[m, k] @ W`` (W ``[k, n]``, or ``[n, k]`` when
    ``transposed``), with a cuBLASLt epilogue and optional accumulation into ``out``; ``what``
    says which part of the workload planned it (a label only)."""

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


def parse_plan_line(line: str, what: str = "") -> GemmShape:
    """One line of ``GptModel.gemm_plan_shapes()`` (``Gemm::plan_shapes``: the tuning file's key
    columns, ``"float16 m n k transposed epilogue accumulate"``) as a :class:`GemmShape`
    labelled ``what``; ValueError quoting the line for anything else."""
    fields = line.split()
    if (len(fields) == 7 and fields[0] in ("float32", "float16", "bfloat16")
            and all(f.isdigit() for f in fields[1:4]) and fields[4] in ("0", "1")
            and fields[6] in ("0", "1") and fields[5].replace("_", "").isalpha()):
        _, m, n, k, transposed, epilogue, accumulate = fields
        return GemmShape(int(m), int(n), int(k), transposed == "1", epilogue, accumulate == "1",
                         what)
    raise ValueError(f"not a gemm_plan_shapes() line (dtype m n k transposed epilogue "
                     f"accumulate): {line!r}")


# heuristic_rows and row_buckets describe how the engine reads a tuning file (which entry serves
# which row count), not the workload it runs: --prompt-rows uses them to pick entries that serve
# whole ranges of prompt lengths.
def heuristic_rows(m: int) -> int:
    """The row count whose tuning-file entry an ``m``-row product uses (``Gemm::heuristic_rows``):
    ``m`` itself up to 64 (``Gemm::kExactRows``), else ``m`` rounded up to a multiple of
    ``max(16, bit_ceil(m) / 16)``."""
    if m <= 64:
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


# ---------------------------------------------------------------------- asking the engine
# Decode steps the workload runs after the prompt: the first token comes from the prompt's
# logits, the next steps run the layers at batch x beam rows (the later ones from a step graph).
GENERATION_STEPS = 3
# Layers of the model the shapes are collected on: every layer runs the same products, so a
# deep model's list is a two-layer model's (a first and a last layer) at a fraction of the
# memory and of the time its random weights take to draw.
SHAPE_LAYERS = 2


def one_gpu_config(config: GptConfig, seq_len: int) -> GptConfig:
    """The model the shapes are collected on: ``config`` on one GPU (``tensor_para_size`` 1), with
    at most ``SHAPE_LAYERS`` layers and, for learned positions, a table of at least ``seq_len``
    rows (positions are an embedding, not a product)."""
    positions = config.max_pos_seq_len
    if config.has_positional_encoding:
        positions = max(positions, seq_len)
    return dataclasses.replace(config, tensor_para_size=1,
                               num_layer=min(config.num_layer, SHAPE_LAYERS),
                               max_pos_seq_len=positions)


def random_weights(config: GptConfig, dtype: torch.dtype,
                   device: int = 0) -> dict[str, torch.Tensor]:
    """Tensor-parallel rank 0's weights of ``config`` (names and shapes from the engine's table,
    :func:`warpformer.weights.weight_specs`) on ``cuda:<device>`` in ``dtype``: normal values of
    standard deviation 0.02, norm gains 1. The optional ``lm_head.weight`` is left out (the head
    is tied to ``wte``: the same product)."""
    gen = torch.Generator(device=f"cuda:{device}").manual_seed(0)
    out = {}
    for name, spec in weight_specs(config).items():
        if spec.optional:
            continue
        t = torch.empty(spec.shard_shape(config.tensor_para_size), dtype=dtype,
                        device=f"cuda:{device}")
        if name.endswith("layernorm.weight"):
            t.fill_(1.0)
        else:
            t.normal_(0.0, 0.02, generator=gen)
        out[name] = t
    return out


def _build(config: GptConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype,
           max_batch: int, max_seq_len: int, cuda_graphs: bool,
           prefill_tokens: int | None) -> torch.ScriptObject:
    from warpformer.models.gpt import build_gpt_model
    from warpformer.options import EngineOptions

    return build_gpt_model(config, weights, dtype=dtype, max_batch=max_batch,
                           max_seq_len=max_seq_len,
                           options=EngineOptions(cuda_graphs=cuda_graphs,
                                                 prefill_tokens=prefill_tokens))


def _note(found: dict[tuple, GemmShape], lines: set[str], what: str, rounded: bool = False) -> None:
    """Add the shapes of ``lines`` not in ``found`` yet, labelled ``what``; ``rounded``: at the
    row count whose tuning-file entry serves them (heuristic_rows)."""
    for line in sorted(lines):
        s = parse_plan_line(line, what)
        if rounded:
            s = dataclasses.replace(s, m=heuristic_rows(s.m))
        found.setdefault(s.key(), s)


def _generation(engine: torch.ScriptObject, batch: int, length: int, beam: int,
                gen: torch.Generator) -> tuple[set[str], set[str]]:
    """Generate ``GENERATION_STEPS`` tokens for ``batch`` random prompts of ``length`` tokens at
    beam width ``beam``; returns the plans made by the prompt pass (decode_start) and by the
    steps after it. min_length keeps every row from ending early."""
    vocab = int(engine.vocab_size())
    ids = torch.randint(0, vocab, (batch, length), dtype=torch.int32, generator=gen)
    lengths = torch.full((batch,), length, dtype=torch.int32)
    options = {"beam_width": torch.tensor(beam, dtype=torch.int32),
               "min_length": torch.tensor(GENERATION_STEPS, dtype=torch.int32)}
    before = set(engine.gemm_plan_shapes())
    engine.decode_start(ids, lengths, GENERATION_STEPS, options)
    prompt = set(engine.gemm_plan_shapes())
    engine.decode_step(GENERATION_STEPS)
    engine.decode_finish()
    return prompt - before, set(engine.gemm_plan_shapes()) - prompt


def collect_shapes(config: GptConfig, batch: int, beam: int, max_input_len: int, *,
                   dtype: torch.dtype = torch.float16, cuda_graphs: bool = True,
                   prefill_tokens: int | None = None, prompt_rows: tuple[int, int] | None = None,
                   pipeline_para_size: int = 1, device: int = 0) -> list[GemmShape]:
    """Every distinct cuBLASLt GEMM the engine plans for this workload, as the engine reports it:
    an instance of ``config`` with random weights (:func:`random_weights`) on ``cuda:<device>``
    generates for ``batch`` prompts of ``max_input_len`` tokens at beam width ``beam``, with the
    engine options ``cuda_graphs`` and ``prefill_tokens`` (so the prompt pass is cut into groups,
    and padded for prompt graphs, exactly as the tuned model's will be), and its
    ``gemm_plan_shapes()`` are the list (labelled "prompt" and "generation").

    ``prompt_rows`` ``(lo, hi)`` also runs one prompt of each length ``row_buckets(lo, hi)``
    returns (a one-group pass, padded where it runs as a prompt graph) and, with CUDA graphs, the
    same on an instance without them (the exact count a group of a several-group pass runs at);
    those shapes are listed at their rounded row counts (``heuristic_rows``, labelled "prompt
    rows"), whose entries serve every prompt group of ``lo`` to ``hi`` tokens.

    With ``config.tensor_para_size`` or ``pipeline_para_size`` above 1 the parallel model cannot
    run on one GPU (its layers and lm_head need NCCL groups of that many ranks, one GPU each); the
    shapes are then derived from the one-GPU model without CUDA graphs (a parallel model runs its
    prompts at their exact token counts), narrowed to one rank's widths by :func:`rank_shapes`;
    with pipeline stages and no beam search, generation also runs at the sizes of the stages'
    micro-batches. (What the one-GPU model cannot tell: a tensor-parallel rank's default prefill
    group size, which grows as tensor parallelism splits its activations, can be larger than its
    own, so a batch of more than 2,048 prompt tokens may be grouped differently unless
    ``prefill_tokens`` pins the size.)"""
    tp, pp = config.tensor_para_size, pipeline_para_size
    lengths = row_buckets(*prompt_rows) if prompt_rows is not None else []
    one = one_gpu_config(config, max([max_input_len, *lengths]) + GENERATION_STEPS)
    graphs = cuda_graphs and tp == 1 and pp == 1  # GptModel::prompt_graph_tokens
    weights = random_weights(one, dtype, device)
    gen = torch.Generator().manual_seed(0)
    found: dict[tuple, GemmShape] = {}
    with torch.cuda.device(device):
        engine = _build(one, weights, dtype, batch, max_input_len + GENERATION_STEPS, graphs,
                        prefill_tokens)
        prompt, steps = _generation(engine, batch, max_input_len, beam, gen)
        _note(found, prompt, "prompt")
        _note(found, steps, "generation")
        if pp > 1 and beam == 1 and batch >= pp:
            # Session::micro_batches: P stages run greedy or sampled steps after the first as P
            # micro-batches, rows [i * B // P, (i + 1) * B // P). Generating from one-token
            # prompts at those batch sizes plans what such a step runs (their prompt pass, one
            # token a row, runs the same products at the same row count).
            for rows in sorted({(i + 1) * batch // pp - i * batch // pp for i in range(pp)}):
                prompt, steps = _generation(engine, rows, 1, 1, gen)
                _note(found, prompt | steps, "generation (micro-batch)")
        del engine
        # One-group passes run at a prompt graph's padded count where there are graphs; the
        # groups of a several-group pass at their exact counts, as without graphs.
        instances = ((True, False) if graphs else (False,)) if lengths else ()
        for with_graphs in instances:
            engine = _build(one, weights, dtype, 1, max(lengths) + GENERATION_STEPS, with_graphs,
                            prefill_tokens)
            for n in lengths:
                # Read after every prompt: a wide range plans more shapes than the engine's
                # plan cache keeps (Gemm::kMaxPlans).
                _note(found, _generation(engine, 1, n, 1, gen)[0], "prompt rows", rounded=True)
            del engine
    del weights
    shapes = list(found.values())
    return rank_shapes(shapes, config) if tp > 1 else shapes


def collect_seq2seq_shapes(config: T5Config, batch: int, beam: int, max_input_len: int, *,
                           dtype: torch.dtype = torch.float16, cuda_graphs: bool = True,
                           device: int = 0) -> list[GemmShape]:
    """:func:`collect_shapes` for an encoder-decoder ``config`` (T5 / BART families): an instance
    of at most ``SHAPE_LAYERS`` layers a stack with random weights encodes ``batch`` inputs of
    ``max_input_len`` tokens and generates at beam width ``beam``; its ``gemm_plan_shapes()``
    are the list ("encode + prompt": the encoder, the cross-attention memory and the decoder's
    first pass; "generation"). One GPU only: the encoder-decoder engine has no tensor or
    pipeline parallelism yet."""
    if config.tensor_para_size != 1:
        raise SystemExit("gemm-tune: an encoder-decoder model runs on one GPU (tensor_para_size "
                         f"1), got {config.tensor_para_size}")
    from warpformer.options import EngineOptions
    from warpformer.seq2seq import build_seq2seq_model
    from warpformer.t5_weights import t5_weight_specs

    seq = max(max_input_len, 1 + GENERATION_STEPS)
    stacks = {}
    for name in ("encoder", "decoder"):
        stack = getattr(config, name)
        positions = max(stack.max_pos_seq_len, seq) if config.is_bart else 0
        stacks[name] = dataclasses.replace(stack, num_layers=min(stack.num_layers, SHAPE_LAYERS),
                                           max_pos_seq_len=positions)
    one = dataclasses.replace(config, **stacks)
    gen = torch.Generator(device=f"cuda:{device}").manual_seed(0)
    weights = {}
    for name, spec in t5_weight_specs(one).items():
        t = torch.empty(spec.shard_shape(1), dtype=dtype, device=f"cuda:{device}")
        if name.endswith("layer_norm.weight"):
            t.fill_(1.0)
        else:
            t.normal_(0.0, 0.02, generator=gen)
        weights[name] = t
    found: dict[tuple, GemmShape] = {}
    with torch.cuda.device(device):
        engine = build_seq2seq_model(one, weights, dtype=dtype, max_batch=batch, max_seq_len=seq,
                                     options=EngineOptions(cuda_graphs=cuda_graphs))
        prompt, steps = _generation(engine, batch, max_input_len, beam,
                                    torch.Generator().manual_seed(0))
        _note(found, prompt, "encode + prompt")
        _note(found, steps, "generation")
        del engine
    return list(found.values())


def rank_shapes(shapes: list[GemmShape], config: GptConfig) -> list[GemmShape]:
    """One tensor-parallel rank's products, from the one-GPU model's ``shapes`` (``config`` at
    ``tensor_para_size`` 1, same widths otherwise).

    A rank runs its layers' products with its slice of each weight, so every product narrows as
    tensor parallelism splits its weight: the weight is found in the engine's weight table
    (:func:`warpformer.weights.weight_specs`) by its full ``[k, n]`` (``n`` all dimensions past
    the first) and replaced by its shard's, as the checkpoint's rank files hold it. (A one-GPU
    model of the rank's head count and MLP width could not stand in: the residual width, which
    stays whole on every rank, would shrink with them.) The transposed product, the lm_head
    ``[V, e]``, multiplies the rank's slice of the vocabulary
    (:func:`warpformer.config.local_vocab`). A product whose full ``[k, n]`` matches weights
    split differently (equal widths) is listed once per shard shape, and a decode-sized product
    the rank's GEMV takes (its weight slice small enough for the tensor-core GEMV) may be listed
    from the one-GPU model's cuBLASLt plan: a line too many only costs its tuning time."""
    tp = config.tensor_para_size
    shards: dict[tuple[int, int], set[tuple[int, int]]] = {}
    for spec in weight_specs(config).values():
        if len(spec.shape) < 2:
            continue
        part = spec.shard_shape(tp)
        shards.setdefault((spec.shape[0], math.prod(spec.shape[1:])), set()).add(
            (part[0], math.prod(part[1:])))
    out: dict[tuple, GemmShape] = {}
    for s in shapes:
        if s.transposed:
            narrowed = [dataclasses.replace(s, n=local_vocab(config.vocab_size, tp))]
        else:
            narrowed = [dataclasses.replace(s, k=k, n=n)
                        for k, n in sorted(shards.get((s.k, s.n), {(s.k, s.n)}))]
        for r in narrowed:
            out.setdefault(r.key(), r)
    return list(out.values())


# ---------------------------------------------------------------------- timing
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


def write_tuning_file(path: str, dtype_name: str, results: list[TuneResult], device: int = 0,
                      fingerprint: str | None = None) -> None:
    """Write the tuning file (format in the module docstring), for ``cuda:<device>``'s GPU and
    cuBLASLt version unless ``fingerprint`` names them."""
    if fingerprint is None:
        fingerprint = torch.ops.warpformer.gemm_fingerprint(device)
    lines = [f"# fingerprint {fingerprint}",
             "# dtype m n k transposed epilogue accumulate algo_index best_us heuristic_us"]
    for s, i, best, heur in results:
        lines.append(f"{dtype_name} {s.m} {s.n} {s.k} {int(s.transposed)} {s.epilogue} "
                     f"{int(s.accumulate)} {i} {best:.2f} {heur:.2f}")
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, path)


# ---------------------------------------------------------------------- command line
def _is_seq2seq_dir(model_dir: str) -> bool:
    """Whether ``model_dir`` holds an encoder-decoder conversion (FT's ``[encoder]`` section)."""
    import configparser

    from warpformer.weights import resolve_model_dir

    ini = configparser.ConfigParser()
    ini.read(os.path.join(resolve_model_dir(model_dir), "config.ini"))
    return ini.has_section("encoder")


def config_from_args(args: argparse.Namespace) -> GptConfig | T5Config:
    """The model to tune for: ``--model-dir``'s ``config.ini`` (at ``--tensor-para-size`` when
    given; an encoder-decoder folder gives a :class:`T5Config`), or the FT-style size arguments
    with ``--activation-type`` (a GPT-2-style model: learned positions, pre-norm layers; only the
    widths and the activation decide its products).
    ConfigError (a ValueError) for dimensions the engine refuses, e.g. heads not divisible by
    the tensor-parallel size."""
    tp = args.tensor_para_size
    if args.model_dir:
        from warpformer.t5_weights import read_t5_config
        from warpformer.weights import read_config

        seq2seq = _is_seq2seq_dir(args.model_dir)
        config = read_t5_config(args.model_dir) if seq2seq else read_config(args.model_dir)
        return config if tp is None else dataclasses.replace(config, tensor_para_size=tp)
    missing = [n for n in ("head_num", "size_per_head", "inter_size", "vocab_size")
               if getattr(args, n) is None]
    if missing:
        raise SystemExit("gemm-tune: give --model-dir, or all of "
                         + ", ".join("--" + m.replace("_", "-") for m in missing))
    return GptConfig(head_num=args.head_num, size_per_head=args.size_per_head,
                     inter_size=args.inter_size, num_layer=SHAPE_LAYERS,
                     vocab_size=args.vocab_size, max_pos_seq_len=args.max_input_len,
                     tensor_para_size=tp or 1, activation_type=args.activation_type)


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
    p.add_argument("--data-type", choices=sorted(DTYPES), default="fp16",
                   help="the products' data type (default fp16)")
    p.add_argument("--activation-type", choices=("gelu_tanh", "gelu_erf", "relu", "silu"),
                   default="gelu_tanh",
                   help="the MLP's activation (sets the MLP-in product's epilogue); taken from "
                        "the checkpoint with --model-dir")
    p.add_argument("--tensor-para-size", type=int, default=None,
                   help="tensor-parallel size (default: the checkpoint's with --model-dir, else "
                        "1); with more than 1, one rank's shapes are derived on one GPU from the "
                        "one-GPU model's (give --prefill-tokens for the ranks' own prefill group "
                        "size: their default can be larger than one GPU's)")
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
    """Collect the engine's shapes for the workload, tune them, write the file; print per-shape
    gains."""
    for name in ("batch_size", "beam_width", "max_input_len", "tensor_para_size",
                 "pipeline_para_size", "max_algos", "prefill_tokens"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise SystemExit(f"gemm-tune: --{name.replace('_', '-')} must be >= 1")
    prompt_rows = parse_prompt_rows(args.prompt_rows)
    config = config_from_args(args)
    if isinstance(config, T5Config) and (prompt_rows is not None or args.pipeline_para_size != 1
                                         or args.prefill_tokens is not None):
        raise SystemExit("gemm-tune: --prompt-rows, --pipeline-para-size and --prefill-tokens "
                         "are for decoder-only models; an encoder-decoder folder takes "
                         "--batch-size, --beam-width and --max-input-len (the encoder's input)")
    if not torch.cuda.is_available():
        raise SystemExit("gemm-tune: needs a CUDA device (it runs the engine and times kernels "
                         "on the GPU)")
    import warpformer  # noqa: F401  (registers the ops and classes)

    dtype = DTYPES[args.data_type]
    if isinstance(config, T5Config):
        shapes = collect_seq2seq_shapes(config, args.batch_size, args.beam_width,
                                        args.max_input_len, dtype=dtype,
                                        cuda_graphs=args.cuda_graphs)
    else:
        shapes = collect_shapes(config, args.batch_size, args.beam_width, args.max_input_len,
                                dtype=dtype, cuda_graphs=args.cuda_graphs,
                                prefill_tokens=args.prefill_tokens, prompt_rows=prompt_rows,
                                pipeline_para_size=args.pipeline_para_size)
    torch.cuda.empty_cache()  # the collecting instances' buffers
    results = tune(shapes, dtype, args.max_algos, args.reps,
                   cold_bytes=0 if args.warm_weights else None)
    write_tuning_file(args.output, args.data_type, results)
    print(f"{'shape':<26} {'m':>7} {'n':>7} {'k':>7} {'heuristic us':>13} {'tuned us':>9} "
          f"{'gain':>6}")
    for s, _, best, heur in results:
        print(f"{s.what:<26} {s.m:>7} {s.n:>7} {s.k:>7} {heur:>13.2f} {best:>9.2f} "
              f"{heur / best:>5.2f}x")
    print(f"wrote {len(results)} shapes to {args.output}")
    return 0
