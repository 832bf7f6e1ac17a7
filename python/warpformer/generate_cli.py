"""``warpformer generate``: prompts in, generated text (or token ids) out.

    warpformer generate --model HF_DIR --prompt "The old lighthouse keeper" --max-new-tokens 32
    warpformer generate --model HF_DIR --prompt "..." --do-sample --top-p 0.9 --seed 0
    warpformer generate --model OUT/1-gpu --input-ids 818,262,3726 --num-beams 4
    cat prompts.txt | warpformer generate --model HF_DIR --stream
    torchrun --nproc-per-node 2 -m warpformer generate --model HF_DIR --tensor-para-size 2 ...

``--model`` is a converted folder (``warpformer convert``'s output) or a HF checkpoint folder,
converted once into the cache of :mod:`warpformer._cache` (``$WARPFORMER_CACHE``, default
``~/.cache/warpformer``) and reused. With a tokenizer (the HF folder's own or ``--tokenizer``)
prompts and outputs are text; without one they are token ids. Outputs go to stdout (or
``--output-file``), status lines (conversion, loading, timing) to stderr; only rank 0 prints.

Decoding follows HF: greedy unless ``--do-sample``. FT's convention holds too: ``--top-k`` > 1 or
``--top-p`` in (0, 1) samples, and ``--top-k 1`` / ``--top-p 0`` mean greedy.

Several GPUs (``--tensor-para-size``/``--pipeline-para-size`` > 1) run one process per GPU under
``mpirun`` or ``torchrun``. Given a HF checkpoint, rank 0 alone converts it while the other ranks
wait (up to :data:`CONVERT_WAIT_S`; a failure reaches every rank as one error), then every rank
checks that it sees the result: the cache must be on a filesystem all ranks share (set
``WARPFORMER_CACHE``), else convert beforehand with ``warpformer convert`` and pass that folder.
Prompts cannot come from stdin then (the launchers give it to one rank only).

``examples/generate.py`` runs this module under FasterTransformer's flag names (``--ckpt_path``,
``--output_len``, ``--beam_width``, ...): :func:`add_args` declares every option once with both
spellings, and :func:`run` serves both.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ._cache import cache_dir, convert_cached

if TYPE_CHECKING:
    from .gpt import GPT, GenerationOutput

__all__ = ["CONVERT_WAIT_S", "add_args", "run", "main", "converted_checkpoint"]

CONVERT_WAIT_S = 4 * 3600.0
"""How long ranks > 0 wait for rank 0 to convert a HF checkpoint (large models take a while)."""

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
OUTPUT_FORMATS = ("text", "ids", "jsonl", "verbose")

# (subcommand flag, FT spelling of examples/generate.py or None for the flag with underscores,
#  argparse keywords, keywords that differ under the FT spelling). Help strings name other options
# as {dest}, filled with the spelling in use.
_OPTIONS: tuple[tuple[str, str | None, dict[str, Any], dict[str, Any]], ...] = (
    ("--model", "--ckpt_path", dict(required=True, metavar="PATH", help=(
        "a converted checkpoint (config.ini in the folder or in its one <N>-gpu folder) or a HF "
        "checkpoint folder (config.json), which is converted once with {data_type} into the "
        "cache ($WARPFORMER_CACHE, else $XDG_CACHE_HOME/warpformer, default "
        "~/.cache/warpformer) and reused")), {}),
    ("--tokenizer", "--tokenizer_path", dict(metavar="PATH", help=(
        "HF tokenizer folder (default: the HF checkpoint's own, if it has one): text prompts "
        "in, text out")), {}),
    ("--no-tokenizer", None, dict(action="store_true", help=(
        "ignore the checkpoint's tokenizer: token ids in, token ids out")), {}),
    ("--prompt", None, dict(action="append", metavar="TEXT", help=(
        "a text prompt (repeatable; needs a tokenizer)")), {}),
    ("--input-ids", None, dict(action="append", metavar="IDS", help=(
        "a prompt as comma-separated token ids, e.g. 818,262,3726 (repeatable)")), {}),
    ("--input-file", "--sample_input_file", dict(metavar="PATH", help=(
        "prompts, one a line: text with a tokenizer, else comma-separated token ids (FT's "
        "start_ids.csv); '-' reads stdin. Without {prompt}, {input_ids} or {input_file} the "
        "prompts are read from stdin")), {}),
    ("--output-file", "--sample_output_file", dict(metavar="PATH", help=(
        "write the outputs to PATH instead of stdout (with {stream}, tokens still stream to "
        "stdout)")), {}),
    ("--output-format", None, dict(choices=OUTPUT_FORMATS, help=(
        "text: each prompt's generated text (beams best first; '[i]' headers when there are "
        "several outputs), the default with a tokenizer; ids: comma-separated generated ids, "
        "one line per prompt and beam, the default without; jsonl: one JSON object per prompt "
        "(prompt, ids, text, log probs); verbose: labelled lines per prompt and beam "
        "(examples/generate.py's default)")), dict(default="verbose", help=(
            "verbose (default): labelled lines per prompt and beam (input, output ids, output "
            "text, log probs); text: each prompt's generated text; ids: comma-separated "
            "generated ids, one line per prompt and beam; jsonl: one JSON object per prompt"))),
    ("--max-new-tokens", "--output_len", dict(type=int, default=32, metavar="N", help=(
        "tokens to generate per prompt (fewer when the end token comes; default %(default)s)")),
     {}),
    ("--do-sample", None, dict(action="store_true", help=(
        "sample instead of greedy decoding (HF's do_sample); {top_k} > 1 or {top_p} in (0, 1) "
        "also sample (FT's convention: top_k 1 and top_p 0 mean greedy)")), {}),
    ("--top-k", None, dict(type=int, metavar="K", help=(
        "sample from the K most likely tokens (0: no limit, the default when sampling; at most "
        "1024)")), dict(default=1, help=(
            "FT's top_k: 1 (default) with {top_p} 0 is greedy; K > 1 samples from the K most "
            "likely tokens; 0: no limit"))),
    ("--top-p", None, dict(type=float, metavar="P", help=(
        "nucleus sampling: from the most likely tokens holding probability mass P, in (0, 1] "
        "(0 or 1: off)")), dict(default=0.0, help=(
            "FT's top_p: 0 (default) or 1 is off; P in (0, 1) samples from the most likely "
            "tokens holding probability mass P"))),
    ("--temperature", None, dict(type=float, default=1.0, metavar="T", help=(
        "divides the logits before sampling, > 0 (default %(default)s; greedy ignores it)")), {}),
    ("--repetition-penalty", None, dict(type=float, default=1.0, metavar="P", help=(
        "> 0, 1 = off (default): the logit of every token seen in the prompt or output is "
        "divided by it (multiplied when negative)")), {}),
    ("--presence-penalty", None, dict(type=float, default=0.0, metavar="P", help=(
        "subtracted once from the logit of every token seen (default %(default)s)")), {}),
    ("--frequency-penalty", None, dict(type=float, default=0.0, metavar="P", help=(
        "subtracted from a seen token's logit once per occurrence (default %(default)s)")), {}),
    ("--min-length", None, dict(type=int, default=0, metavar="N", help=(
        "no end token before N new tokens (default %(default)s)")), {}),
    ("--memory-len", "--memory_len", dict(type=int, default=0, metavar="N", help=(
        "every token attends to its last N positions only (a sliding window; default 0: "
        "all)")), {}),
    ("--num-beams", "--beam_width", dict(type=int, default=1, metavar="N", help=(
        "beam search with N beams, 1-16 (default 1: no beam search); every beam is printed, "
        "best first")), {}),
    ("--length-penalty", "--len_penalty", dict(type=float, default=1.0, metavar="P", help=(
        "beam search: a beam's score is its cum log prob / length ** P (default "
        "%(default)s)")), {}),
    ("--diversity-rate", "--beam_search_diversity_rate", dict(
        type=float, default=0.0, metavar="R", help=(
        "beam search: FT's diversity rate, a candidate's score drops by rate x its rank within "
        "its parent beam (default %(default)s)")), {}),
    ("--seed", "--random_seed", dict(type=int, metavar="SEED", help=(
        "sampling seed: prompt i uses SEED + i, so the outputs do not depend on {batch_size} "
        "(default: a random seed, printed on stderr)")), dict(default=0, help=(
            "sampling seed: prompt i uses SEED + i, so the outputs do not depend on "
            "{batch_size} (default %(default)s)"))),
    ("--return-cum-log-probs", None, dict(type=int, choices=(0, 1, 2), default=0, help=(
        "jsonl/verbose output: the summed log probs of 1: the generated tokens, 2: the prompt "
        "and the generated tokens (beam search always has them; default %(default)s)")), {}),
    ("--return-log-probs", "--return_output_log_probs", dict(action="store_true", help=(
        "jsonl/verbose output: the log prob of each generated token")), {}),
    ("--stream", None, dict(action="store_true", help=(
        "print each prompt's tokens as they are produced (text with a tokenizer, else ids); "
        "the prompts then run one at a time; not with beam search")), {}),
    ("--batch-size", "--max_batch_size", dict(type=int, default=8, metavar="N", help=(
        "prompts per engine call (default %(default)s; the engine reserves its KV cache for "
        "this many)")), {}),
    ("--max-seq-len", None, dict(type=int, metavar="N", help=(
        "positions reserved per row (default: the longest prompt + {max_new_tokens})")), {}),
    ("--weight-quant", None, dict(choices=("none", "int8", "int4"), default="none", help=(
        "quantize an fp16/bf16 model's weights at load: int8 per channel, int4 in groups of "
        "128 (default none; a folder converted with --weight-quant loads as it is)")), {}),
    ("--data-type", None, dict(choices=("auto", *DTYPES), default="auto", help=(
        "compute type, and the on-disk type a HF checkpoint is converted to (default auto: "
        "fp16 on the cuda backend, fp32 on the reference backend)")), {}),
    ("--backend", None, dict(choices=("auto", "cuda", "reference"), default="auto", help=(
        "cuda: the C++/CUDA engine; reference: plain PyTorch on CPU (same results, slow); auto "
        "(default): cuda when a GPU is visible")), {}),
    ("--tensor-para-size", None, dict(type=int, default=1, metavar="N", help=(
        "tensor-parallel GPUs (default 1); > 1: start N x {pipeline_para_size} processes, one "
        "per GPU, with mpirun -n or torchrun --nproc-per-node; rank 0 converts a HF checkpoint "
        "while the others wait, into a cache every rank must see")), {}),
    ("--pipeline-para-size", None, dict(type=int, default=1, metavar="N", help=(
        "pipeline stages (default 1); > 1 runs under mpirun/torchrun as {tensor_para_size}")),
     {}),
    ("--quiet", None, dict(action="store_true", help=(
        "no status lines on stderr (conversion, loading, seed, timing)")), {}),
)

# `warpformer generate -h` ends with the module docstring's examples.
_EPILOG = ("examples:\n" + "\n".join("  " + line.strip() for line in __doc__.split("\n\n")[1]
                                     .splitlines()) + "\n\nOutputs go to stdout, status lines "
           "to stderr. examples/generate.py takes the same options under\nFasterTransformer's "
           "names (--ckpt_path, --output_len, --beam_width, --top_k, ...).\n")


def _dest(flag: str) -> str:
    return flag[2:].replace("-", "_")


def _spellings(ft_names: bool) -> dict[str, str]:
    """dest -> the flag as the parser spells it."""
    return {_dest(flag): (ft or "--" + _dest(flag)) if ft_names else flag
            for flag, ft, _, _ in _OPTIONS}


def add_args(p: argparse.ArgumentParser, *, ft_names: bool = False) -> None:
    """Add the ``warpformer generate`` options to ``p`` (``ft_names``: FasterTransformer's
    spellings, as ``examples/generate.py`` takes them)."""
    names = _spellings(ft_names)
    for flag, _ft, kwargs, ft_kwargs in _OPTIONS:
        kw = {**kwargs, **(ft_kwargs if ft_names else {})}
        kw["help"] = kw["help"].format(**names)
        short = () if ft_names or flag != "--quiet" else ("-q",)
        p.add_argument(names[_dest(flag)], *short, dest=_dest(flag), **kw)
    p.set_defaults(_generate_flags=names)
    if not ft_names:
        p.epilog = _EPILOG
        p.formatter_class = argparse.RawDescriptionHelpFormatter


def main(argv: list[str] | None = None, *, ft_names: bool = False, prog: str | None = None,
         description: str | None = None) -> int:
    """Parse ``argv`` with :func:`add_args` and :func:`run` it. Bad input prints ``error: ...``
    on stderr and returns 2, as ``warpformer generate`` does."""
    from warpformer.converters import ConversionError
    from warpformer.weights import WeightFileError

    p = argparse.ArgumentParser(prog=prog, description=description)
    add_args(p, ft_names=ft_names)
    args = p.parse_args(argv)
    try:
        return run(args)
    except (ValueError, FileNotFoundError, ConversionError, WeightFileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


# ------------------------------------------------------------------------------ inputs
@dataclass
class _Prompt:
    label: str  # how errors name it: "--prompt #2", "--input-file p.txt line 3", ...
    ids: list[int]
    text: str | None = None


def _parse_ids(text: str, where: str) -> list[int]:
    parts = [t for t in re.split(r"[,\s]+", text.strip()) if t]
    if not parts:
        raise ValueError(f"{where} holds no token ids")
    ids = []
    for tok in parts:
        try:
            value = int(tok)
        except ValueError:
            raise ValueError(f"{where}: {tok!r} is not a token id (expected comma-separated "
                             "integers, e.g. 818,262,3726)") from None
        if value < 0:
            raise ValueError(f"{where}: token id {value} is negative")
        ids.append(value)
    return ids


def _read_prompts(args: argparse.Namespace, flag: Callable[[str], str], tokenizer: Any,
                  parallel: bool) -> list[_Prompt]:
    given = [d for d in ("prompt", "input_ids", "input_file") if getattr(args, d)]
    if len(given) > 1:
        raise ValueError(f"give the prompts one way, not {' and '.join(map(flag, given))}")
    if args.prompt:
        if tokenizer is None:
            raise ValueError(f"{flag('prompt')} needs a tokenizer and there is none (pass "
                             f"{flag('tokenizer')} PATH, or token ids with {flag('input_ids')})")
        many = len(args.prompt) > 1
        lines = [(f"{flag('prompt')}" + (f" #{i + 1}" if many else ""), text)
                 for i, text in enumerate(args.prompt)]
        return [_encode(tokenizer, label, text) for label, text in lines]
    if args.input_ids:
        many = len(args.input_ids) > 1
        return [_Prompt(label, _parse_ids(text, label)) for label, text in (
            (f"{flag('input_ids')}" + (f" #{i + 1}" if many else ""), text)
            for i, text in enumerate(args.input_ids))]
    if args.input_file and args.input_file != "-":
        path = Path(args.input_file)
        if not path.is_file():
            raise ValueError(f"{flag('input_file')} {path}: no such file")
        where, content = f"{flag('input_file')} {path}", path.read_text(encoding="utf-8")
    else:
        if parallel:  # mpirun and torchrun hand stdin to one rank at most
            raise ValueError(f"prompts on stdin need a single process: under mpirun/torchrun "
                             f"pass {flag('prompt')}, {flag('input_ids')} or "
                             f"{flag('input_file')} PATH")
        if args.input_file is None and sys.stdin.isatty():
            raise ValueError(f"no prompts: pass {flag('prompt')} TEXT, {flag('input_ids')} IDS "
                             f"or {flag('input_file')} PATH, or pipe prompts into stdin")
        where, content = "stdin", sys.stdin.read()
    lines = [(f"{where} line {n}", line) for n, line in enumerate(content.splitlines(), 1)
             if line.strip()]
    if not lines:
        raise ValueError(f"{where} holds no prompts (no non-empty lines)")
    if tokenizer is not None:
        return [_encode(tokenizer, label, text) for label, text in lines]
    return [_Prompt(label, _parse_ids(text, f"{label} (without a tokenizer, prompts are "
                                             "token ids)")) for label, text in lines]


def _encode(tokenizer: Any, label: str, text: str) -> _Prompt:
    ids = tokenizer.encode(text)
    if not ids:
        raise ValueError(f"{label} {text!r} encodes to no tokens")
    return _Prompt(label, list(ids), text)


def _tokenizer(args: argparse.Namespace, flag: Callable[[str], str],
               hf_dir: Path | None) -> Any:
    from .tokenizer import has_tokenizer_files, load_tokenizer

    if args.no_tokenizer:
        if args.tokenizer:
            raise ValueError(f"{flag('tokenizer')} and {flag('no_tokenizer')} contradict each "
                             "other")
        return None
    if args.tokenizer:
        return load_tokenizer(args.tokenizer, flag("tokenizer"))
    if hf_dir is not None and has_tokenizer_files(hf_dir):
        return load_tokenizer(hf_dir, flag("model"))
    return None


def _resolve_model(value: str, tp: int, flag: str) -> tuple[str, Path]:
    """("converted", folder holding config.ini) or ("hf", the HF folder)."""
    from .weights import resolve_model_dir

    path = Path(value).expanduser()
    if not path.exists():
        raise ValueError(f"{flag} {path}: no such folder")
    if not path.is_dir():
        raise ValueError(f"{flag} {path} is a file; pass the checkpoint's folder")
    if (path / f"{tp}-gpu" / "config.ini").is_file():  # OUT holding several sizes: take ours
        return "converted", path / f"{tp}-gpu"
    if (path / "config.ini").is_file() or any(
            (c / "config.ini").is_file() for c in path.glob("*-gpu")):
        return "converted", resolve_model_dir(path)
    if (path / "config.json").is_file():
        return "hf", path
    raise ValueError(f"{flag} {path} is neither a converted checkpoint (config.ini, in the folder "
                     "or in one <N>-gpu folder) nor a HF checkpoint (config.json)")


# ------------------------------------------------------------------------------ conversion
def converted_checkpoint(hf_dir: Path, data_type: str, tensor_para_size: int = 1,
                         pipeline_para_size: int = 1, *,
                         say: Callable[[str], None] = print) -> Path:
    """The cached conversion of HF checkpoint ``hf_dir`` for ``tensor_para_size``
    (:func:`warpformer._cache.convert_cached`), made now when missing.

    With ``tensor_para_size * pipeline_para_size > 1`` this runs on every rank of a launch
    (:func:`warpformer.distributed.setup`, which :meth:`GPT.from_pretrained` then reuses): rank 0
    converts while the others wait for it (:data:`CONVERT_WAIT_S` at most), then every rank
    checks that it sees the result. A failure of either step raises the same ``ValueError``
    naming the rank(s) on every rank.
    """
    out = cache_dir(hf_dir, data_type)
    if tensor_para_size * pipeline_para_size == 1:
        return convert_cached(hf_dir, out, data_type, tensor_para_size, say=say)
    from . import distributed

    ctx = distributed.get_context()
    if ctx is None or (ctx.info.tensor_para_size, ctx.info.pipeline_para_size) != (
            tensor_para_size, pipeline_para_size):
        ctx = distributed.setup(tensor_para_size, pipeline_para_size)
    final = out / f"{tensor_para_size}-gpu"
    ok, message = True, ""
    if ctx.info.rank == 0:
        try:
            convert_cached(hf_dir, out, data_type, tensor_para_size, say=say)
        except Exception as exc:  # noqa: BLE001 - reported to every rank by the barrier
            ok, message = False, f"{type(exc).__name__}: {exc}"
    try:
        distributed.checkpoint_barrier(ctx.info, ok, message, CONVERT_WAIT_S,
                                       rendezvous=ctx.rendezvous,
                                       what="converting the HF checkpoint")
        seen = (final / "config.ini").is_file()
        ctx.check(seen, "" if seen else (
            f"{final} not found, where rank 0 converted {hf_dir}: every rank must see the "
            "cache (set WARPFORMER_CACHE to a shared folder), or convert beforehand with "
            "`warpformer convert` and pass the converted folder"),
            what="finding the converted checkpoint")
    except RuntimeError as exc:  # the same message on every rank: a user error, not a crash
        raise ValueError(str(exc)) from exc
    return final


# ------------------------------------------------------------------------------ running
def _rank_and_check(args: argparse.Namespace, flag: Callable[[str], str]) -> int:
    """This process's rank; the launcher's world size must be tp x pp (one process per GPU)."""
    from ._launch import _locate

    try:
        return _locate(args.tensor_para_size, args.pipeline_para_size, None, None, None).rank
    except ValueError as exc:
        raise ValueError(f"{flag('tensor_para_size')}/{flag('pipeline_para_size')}: "
                         f"{exc}") from None


def _check_args(args: argparse.Namespace, flag: Callable[[str], str]) -> bool:
    """Checks that need no model; returns whether to sample."""
    for dest, low in (("max_new_tokens", 1), ("batch_size", 1), ("max_seq_len", 2),
                      ("memory_len", 0)):
        value = getattr(args, dest)
        if value is not None and value < low:
            raise ValueError(f"{flag(dest)} must be >= {low}, got {value}")
    if args.top_k is not None and args.top_k < 0:
        raise ValueError(f"{flag('top_k')} must be >= 0 (0: no limit), got {args.top_k}")
    if args.top_p is not None and not 0.0 <= args.top_p <= 1.0:
        raise ValueError(f"{flag('top_p')} must be in [0, 1] (0 or 1: off), got {args.top_p}")
    sample = (args.do_sample or (args.top_k is not None and args.top_k > 1)
              or (args.top_p is not None and 0.0 < args.top_p < 1.0))
    if sample and args.num_beams > 1:
        raise ValueError(f"{flag('num_beams')} {args.num_beams} runs beam search, which does not "
                         f"sample: drop {flag('do_sample')}/{flag('top_k')}/{flag('top_p')}")
    if args.stream and args.num_beams > 1:
        raise ValueError(f"{flag('stream')} needs {flag('num_beams')} 1: beams are reordered "
                         "until the end, so they cannot be streamed")
    if args.output_file:  # checked on every rank before loading, though only rank 0 writes
        path = Path(args.output_file)
        if path.is_dir() or not path.resolve().parent.is_dir():
            raise ValueError(f"{flag('output_file')} {path}: not a file in an existing folder")
    return sample


def _backend(args: argparse.Namespace, flag: Callable[[str], str], parallel: bool) -> str:
    cuda = torch.cuda.is_available()
    backend = args.backend if args.backend != "auto" else ("cuda" if cuda or parallel
                                                           else "reference")
    if backend == "reference" and parallel:
        raise ValueError(f"{flag('tensor_para_size')}/{flag('pipeline_para_size')} > 1 need "
                         f"the cuda backend, not {flag('backend')} reference")
    if backend == "cuda" and not cuda:
        raise ValueError(f"{flag('backend')} cuda needs a CUDA device and none is visible; use "
                         f"{flag('backend')} reference (or auto) to run on CPU")
    return backend


def _load(args: argparse.Namespace, flag: Callable[[str], str], model_dir: Path,
          prompts: list[_Prompt], backend: str, data_type: str) -> GPT:
    from .gpt import GPT
    from .weights import read_config

    config = read_config(model_dir)
    for p in prompts:
        bad = [t for t in p.ids if t >= config.vocab_size]
        if bad:
            raise ValueError(f"{p.label}: token id {bad[0]} is outside the model's vocabulary "
                             f"[0, {config.vocab_size})")
    longest = max(prompts, key=lambda p: len(p.ids))
    need = len(longest.ids) + args.max_new_tokens
    if config.has_positional_encoding and need > config.max_pos_seq_len:
        raise ValueError(f"{longest.label} ({len(longest.ids)} tokens) + "
                         f"{flag('max_new_tokens')} {args.max_new_tokens} = {need} positions, "
                         f"more than the model's {config.max_pos_seq_len}")
    batch = 1 if args.stream else min(args.batch_size, len(prompts))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the CPU fallback is announced by the caller
        return GPT.from_pretrained(model_dir, dtype=DTYPES[data_type],
                                   tensor_para_size=args.tensor_para_size,
                                   pipeline_para_size=args.pipeline_para_size, max_batch=batch,
                                   max_seq_len=args.max_seq_len or need, backend=backend,
                                   weight_quant=None if args.weight_quant == "none"
                                   else args.weight_quant)


def _base_seed(args: argparse.Namespace, parallel: bool) -> int:
    """``--seed``, else a fresh one; under a launch every rank must sample with rank 0's."""
    if args.seed is not None:
        return args.seed
    seed = random.SystemRandom().randrange(2**31)
    if parallel:
        from . import distributed

        ctx = distributed.get_context()
        got = distributed.exchange_id(ctx.info, list(range(ctx.info.world_size)),
                                      "generate/seed", lambda: str(seed).encode(),
                                      rendezvous=ctx.rendezvous, timeout_s=ctx.timeout_s)
        seed = int(got.decode())
    return seed


# GPT.generate's options that are set by the option of the same name.
_GPT_OPTIONS = frozenset(("top_k", "top_p", "temperature", "repetition_penalty",
                          "presence_penalty", "frequency_penalty", "min_length", "num_beams",
                          "length_penalty", "diversity_rate", "seed", "memory_len"))


# The argument an option error names: the engine's "GptModel.decode: option 'beam_width'
# (num_beams) must be ..." (GPT.generate's name in brackets where it differs), or a conversion
# error of GPT's ("top_p must be a number ...").
_OPTION_ERROR = re.compile(r"^GptModel\.decode: option '(\w+)'(?: \((\w+)\))?|^(\w+) ")


def _call(fn: Callable[[], Any], flag: Callable[[str], str]) -> Any:
    """Run ``fn``; GPT's option errors get the flag that set them (the rules live in the engine,
    checked once)."""
    try:
        return fn()
    except ValueError as exc:
        m = _OPTION_ERROR.match(str(exc))
        name = m and (m[2] or m[1] or m[3])
        if name in _GPT_OPTIONS:
            raise ValueError(f"{flag(name)}: {str(exc).removeprefix('GptModel.decode: ')}"
                             ) from None
        raise


def _decode(tokenizer: Any, ids: list[int], end_ids: tuple[int, ...]) -> str:
    return tokenizer.decode(ids[:-1] if ids and ids[-1] in end_ids else ids)


def _label(i: int, k: int, beams: int) -> str:
    return f"[{i}]" if beams == 1 else f"[{i}][beam {k}]"


def _format(fmt: str, i: int, multi: bool, prompt: _Prompt, out: GenerationOutput, b: int,
            tokenizer: Any, end_ids: tuple[int, ...]) -> str:
    """Row ``b`` of ``out`` (prompt number ``i``) as ``fmt`` prints it."""
    beams = out.tokens[b]
    cum = None if out.cum_log_probs is None else out.cum_log_probs[b].tolist()
    logp = None if out.log_probs is None else [
        [round(v, 4) for v in out.log_probs[b, k, :len(t)].tolist()] for k, t in enumerate(beams)]
    if fmt == "ids":
        return "".join(",".join(map(str, t)) + "\n" for t in beams)
    if fmt == "text":
        return "".join((_label(i, k, len(beams)) + "\n" if multi else "")
                       + _decode(tokenizer, t, end_ids) + "\n" for k, t in enumerate(beams))
    if fmt == "jsonl":
        rec: dict[str, Any] = {"index": i}
        if prompt.text is not None:
            rec["prompt"] = prompt.text
        rec["input_ids"] = prompt.ids
        if tokenizer is not None:
            rec["output"] = [_decode(tokenizer, t, end_ids) for t in beams]
        rec["output_ids"] = beams
        if cum is not None:
            rec["cum_log_probs"] = cum
        if logp is not None:
            rec["log_probs"] = logp
        return json.dumps(rec, ensure_ascii=False) + "\n"
    shown = prompt.text if prompt.text is not None else (
        tokenizer.decode(prompt.ids) if tokenizer is not None else str(prompt.ids))
    lines = []
    for k, t in enumerate(beams):
        tag = f"[{i}][beam {k}]"
        lines += [f"{tag} input: {shown}", f"{tag} output ids: {t}"]
        if tokenizer is not None:
            lines.append(f"{tag} output: {_decode(tokenizer, t, end_ids)}")
        if cum is not None:
            lines.append(f"{tag} cum_log_probs: {cum[k]:.4f}")
        if logp is not None:
            lines.append(f"{tag} output_log_probs: {logp[k]}")
    return "\n".join(lines) + "\n"


def _stream_one(gpt: GPT, prompt: _Prompt, max_new_tokens: int, kwargs: dict[str, Any],
                live: str, header: str, tokenizer: Any, write: Callable[[str], None]
                ) -> GenerationOutput:
    """Generate for one prompt, writing ``header`` then its text (or ids) as the tokens come;
    the bytes written equal the ``text`` (``ids``) format of the result."""
    end = gpt.end_ids if kwargs.get("end_id") is None else (kwargs["end_id"],)
    toks: list[int] = []
    shown, printed = "", 0

    def emit(final: bool) -> None:
        nonlocal shown, printed
        if live == "ids":
            if len(toks) > printed:
                write(("," if printed else "") + ",".join(map(str, toks[printed:])))
                printed = len(toks)
            return
        # Decoding the whole prefix each time keeps multi-token characters and the tokenizer's
        # spacing right; a trailing U+FFFD is an incomplete character, held back until it is.
        text = _decode(tokenizer, toks, end)
        if text.startswith(shown) and (final or not text.endswith("\ufffd")):
            write(text[len(shown):])
            shown = text

    stream = gpt.generate_stream([prompt.ids], max_new_tokens, **kwargs)  # checks the options
    write(header)
    while True:
        try:
            step = next(stream)
        except StopIteration as stop:
            out = stop.value
            break
        for t in step[0].tolist():
            if not toks or toks[-1] not in end:  # an ended row keeps reporting end_id
                toks.append(t)
        emit(False)
    toks = list(out.tokens[0][0])
    emit(True)
    write("\n")
    return out


def run(args: argparse.Namespace) -> int:
    """``warpformer generate`` (and ``examples/generate.py``) on parsed :func:`add_args`
    options; returns 0. Bad input raises ``ValueError`` naming the option."""
    names: dict[str, str] = args._generate_flags
    flag = names.__getitem__
    rank0 = _rank_and_check(args, flag) == 0
    parallel = args.tensor_para_size * args.pipeline_para_size > 1
    status = rank0 and not args.quiet

    def say(msg: str) -> None:
        if status:
            print(msg, file=sys.stderr, flush=True)

    sample = _check_args(args, flag)
    kind, model_dir = _resolve_model(args.model, args.tensor_para_size, flag("model"))
    backend = _backend(args, flag, parallel)
    # auto: fp16 on the GPU, fp32 on the CPU reference; bf16 there when quantizing, whose scales
    # are in a 16-bit compute type.
    data_type = args.data_type if args.data_type != "auto" else (
        "fp16" if backend == "cuda" else "bf16" if args.weight_quant != "none" else "fp32")
    tokenizer = _tokenizer(args, flag, model_dir if kind == "hf" else None)
    fmt = args.output_format or ("text" if tokenizer is not None else "ids")
    if fmt == "text" and tokenizer is None:
        raise ValueError(f"{flag('output_format')} text needs a tokenizer and there is none "
                         f"(pass {flag('tokenizer')} PATH)")
    prompts = _read_prompts(args, flag, tokenizer, parallel)  # before a long conversion
    if kind == "hf":
        model_dir = converted_checkpoint(model_dir, data_type, args.tensor_para_size,
                                         args.pipeline_para_size, say=say)
    if backend == "reference" and args.backend == "auto":
        say("no GPU visible: running the plain-PyTorch reference backend on CPU (same results, "
            "slow)")
    gpt = _load(args, flag, model_dir, prompts, backend, data_type)
    say(f"loaded {gpt!r}")
    kwargs: dict[str, Any] = dict(
        do_sample=sample, temperature=args.temperature,
        repetition_penalty=args.repetition_penalty, presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty, min_length=args.min_length,
        num_beams=args.num_beams, length_penalty=args.length_penalty,
        diversity_rate=args.diversity_rate, return_log_probs=args.return_log_probs,
        return_cum_log_probs=args.return_cum_log_probs, memory_len=args.memory_len)
    seed = 0
    if sample:
        kwargs["top_k"] = args.top_k  # None or 0: no limit
        kwargs["top_p"] = args.top_p if args.top_p not in (None, 0.0) else None
        seed = _base_seed(args, parallel)
        say(f"sampling with {flag('seed')} {seed}")
    elif args.temperature != 1.0:
        say(f"note: {flag('temperature')} has no effect on greedy decoding (add "
            f"{flag('do_sample')} to sample)")
    if len(gpt.end_ids) > 1 and (args.num_beams > 1 or args.min_length > 0):
        # Beam search and min_length end rows at one end id only (GPT.generate refuses the
        # checkpoint's list with them): the first.
        kwargs["end_id"] = gpt.end_id
        say(f"note: with {flag('num_beams' if args.num_beams > 1 else 'min_length')} only the "
            f"first of the model's end ids {list(gpt.end_ids)} ends a row")

    sink = None
    if rank0 and args.output_file:
        try:
            sink = open(args.output_file, "w", encoding="utf-8")  # noqa: SIM115 - closed below
        except OSError as exc:
            raise ValueError(f"{flag('output_file')} {args.output_file}: {exc.strerror}") from None

    def write_out(text: str) -> None:  # the formatted records
        if rank0:
            (sink or sys.stdout).write(text)
            (sink or sys.stdout).flush()

    def write_live(text: str) -> None:  # --stream's tokens
        if rank0:
            sys.stdout.write(text)
            sys.stdout.flush()

    multi = len(prompts) * args.num_beams > 1
    end = gpt.end_ids if kwargs.get("end_id") is None else (kwargs["end_id"],)
    new_tokens = 0
    t0 = time.perf_counter()
    try:
        if args.stream:
            live = fmt if fmt in ("text", "ids") else ("text" if tokenizer is not None else "ids")
            for i, p in enumerate(prompts):
                head = _label(i, 0, 1) + "\n" if live == "text" and multi else ""
                kw = dict(kwargs, seed=seed + i) if sample else kwargs
                out = _call(lambda p=p, kw=kw, head=head: _stream_one(
                    gpt, p, args.max_new_tokens, kw, live, head, tokenizer, write_live), flag)
                new_tokens += sum(map(len, out.tokens[0]))
                if sink is not None:  # the file gets the records; stdout had the stream
                    write_out(_format(fmt, i, multi, p, out, 0, tokenizer, end))
        else:
            for start in range(0, len(prompts), args.batch_size):
                chunk = prompts[start:start + args.batch_size]
                kw = dict(kwargs, seed=[seed + start + b for b in range(len(chunk))]) \
                    if sample else kwargs
                out = _call(lambda chunk=chunk, kw=kw: gpt.generate(
                    [p.ids for p in chunk], args.max_new_tokens, **kw), flag)
                for b, p in enumerate(chunk):
                    new_tokens += sum(map(len, out.tokens[b]))
                    write_out(_format(fmt, start + b, multi, p, out, b, tokenizer, end))
    finally:
        if sink is not None:
            sink.close()
    dt = time.perf_counter() - t0
    say(f"generated {new_tokens} tokens for {len(prompts)} prompt(s) in {dt:.2f} s "
        f"({new_tokens / max(dt, 1e-9):.1f} tokens/s, {gpt.backend} backend)")
    if args.output_file:
        say(f"wrote {args.output_file}")
    return 0
