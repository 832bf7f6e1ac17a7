"""LAMBADA last-word accuracy with FasterTransformer's method, optionally against HF transformers.

FT's method (``examples/pytorch/gpt/lambada_task_example.py`` in FT): each JSONL line's ``text`` is
split at its last space; the words before it are the context, the last word *with its leading
space* is the target. Context and target are tokenised separately. Each batch is decoded greedily
for as many tokens as its longest target; a sample is correct iff every one of its target tokens
was generated in order. ``metric="logits"`` scores the same target by teacher forcing instead
(context + target in one pass; correct iff the arg-max at every target position is the target
token), and reports the targets' perplexity beside.

``warpformer lambada --checkpoint-path OUT/1-gpu --tokenizer-path HF_DIR --dataset-path
lambada_test.jsonl [--test-hf]`` prints ``accuracy: xx.xxxx% (n/total)`` and the elapsed time;
with ``--test-hf`` HF runs the same samples in the same batches (left padded, greedy) and the
difference, the agreement of the generated target tokens and the speedup are printed too. Under
``torchrun``/``mpirun`` every rank runs the model and rank 0 alone prints and writes files.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    import transformers

    from .gpt import GPT, GenerationOutput

__all__ = ["LambadaModel", "Sample", "LambadaResult", "split_text", "read_dataset",
           "tokenize_samples", "batches", "evaluate", "format_report", "build_word_tokenizer",
           "run", "add_args", "main_from_args", "world_rank"]

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@runtime_checkable
class LambadaModel(Protocol):
    """What the evaluation uses of a model: :class:`warpformer.GPT` has it; tests pass stand-ins
    with the same three members."""

    @property
    def end_id(self) -> int:
        """The end-of-sequence id a generated target stops at."""
        ...

    def generate(self, input_ids: list[list[int]], max_new_tokens: int, /) -> GenerationOutput:
        """Greedy continuations: ``tokens[b][0]`` holds row b's new ids."""
        ...

    def logits(self, input_ids: list[list[int]], /) -> torch.Tensor:
        """Logits of every position, ``[B, S, V]`` (rows zero past their length)."""
        ...


@dataclass
class Sample:
    """One LAMBADA line: ``text`` = ``context`` + ``target`` (``target`` starts with a space)."""

    index: int
    context: str
    target: str
    context_ids: list[int] = field(default_factory=list)
    target_ids: list[int] = field(default_factory=list)


def split_text(text: str) -> tuple[str, str]:
    """FT's split: ``("context", " last")`` at the last space of ``text`` (trailing whitespace
    removed first). Punctuation attached to the last word stays in the target."""
    text = text.rstrip()
    cut = text.rfind(" ")
    if cut <= 0 or cut == len(text) - 1:
        raise ValueError(f"text has no 'context last-word' split at a space: {text[:60]!r}")
    return text[:cut], text[cut:]


def read_dataset(path: str | os.PathLike[str], max_samples: int | None = None) -> list[Sample]:
    """Read a LAMBADA-format JSONL file (one ``{"text": ...}`` object per line); only the first
    ``max_samples`` (>= 1) when given."""
    _check_count("max_samples (--max-samples)", max_samples)
    samples: list[Sample] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                text = json.loads(line)["text"]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{lineno}: expected a JSON object with a 'text' field "
                                 f"({exc})") from None
            try:
                context, target = split_text(text)
            except ValueError as exc:
                raise ValueError(f"{path}:{lineno}: {exc}") from None
            samples.append(Sample(len(samples), context, target))
            if max_samples is not None and len(samples) >= max_samples:
                break
    if not samples:
        raise ValueError(f"{path}: no samples")
    return samples


def tokenize_samples(samples: list[Sample], tokenizer: transformers.PreTrainedTokenizerBase
                     ) -> list[Sample]:
    """Fill ``context_ids`` (with the tokenizer's usual special tokens, e.g. OPT's BOS) and
    ``target_ids`` (without) using a HF tokenizer; returns ``samples`` (filled in place)."""
    for s in samples:
        s.context_ids = list(tokenizer.encode(s.context))
        s.target_ids = list(tokenizer.encode(s.target, add_special_tokens=False))
        if not s.context_ids or not s.target_ids:
            raise ValueError(f"sample {s.index}: empty context or target after tokenisation")
    return samples


def batches(samples: Sequence[Sample], batch_size: int) -> list[list[Sample]]:
    """Consecutive batches in file order (FT: a DataLoader without shuffling)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return [list(samples[i: i + batch_size]) for i in range(0, len(samples), batch_size)]


@dataclass
class LambadaResult:
    """Counts and times of one evaluation (``None`` for what was not run)."""

    total: int
    correct: int | None = None
    seconds: float | None = None
    logits_correct: int | None = None
    logits_nll: float | None = None  # mean per target token
    logits_seconds: float | None = None
    hf_correct: int | None = None
    hf_seconds: float | None = None
    hf_logits_correct: int | None = None
    hf_logits_nll: float | None = None
    agree: int | None = None
    in_flight: int = 1  # batches on the GPU at once in the generate metric (as run)
    records: list[dict] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """The counts and times without ``records``, plus ``accuracy``, ``hf_accuracy`` and
        ``speedup`` (HF seconds / warpformer seconds) where they were measured."""
        out = {k: v for k, v in asdict(self).items() if k != "records"}
        if self.correct is not None:
            out["accuracy"] = self.correct / self.total
        if self.hf_correct is not None:
            out["hf_accuracy"] = self.hf_correct / self.total
        if self.hf_seconds is not None and self.seconds:
            out["speedup"] = self.hf_seconds / self.seconds
        return out


def _pct(n: int, total: int) -> str:
    return f"{100.0 * n / total:.4f}% ({n}/{total})"


def format_report(r: LambadaResult, title: str = "LAMBADA") -> str:
    """The printed summary: accuracies as ``xx.xxxx% (n/total)``, times, agreement, speedup."""
    lines = [f"{title}: {r.total} samples"]
    if r.correct is not None:
        flight = f" ({r.in_flight} batches in flight)" if r.in_flight > 1 else ""
        lines.append(f"warpformer accuracy: {_pct(r.correct, r.total)}  "
                     f"elapsed {r.seconds:.3f} s{flight}")
    if r.logits_correct is not None:
        lines.append(f"warpformer logits accuracy: {_pct(r.logits_correct, r.total)}  "
                     f"target ppl {math.exp(r.logits_nll):.3f}  elapsed {r.logits_seconds:.3f} s")
    if r.hf_correct is not None:
        lines.append(f"HF accuracy: {_pct(r.hf_correct, r.total)}  elapsed {r.hf_seconds:.3f} s")
        diff = 100.0 * (r.correct - r.hf_correct) / r.total
        lines.append(f"accuracy difference (warpformer - HF): {diff:+.4f} points")
        lines.append(f"generated target tokens agree with HF: {_pct(r.agree, r.total)}")
        lines.append(f"speedup over HF: {r.hf_seconds / max(r.seconds, 1e-9):.2f}x")
    if r.hf_logits_correct is not None:
        lines.append(f"HF logits accuracy: {_pct(r.hf_logits_correct, r.total)}  "
                     f"target ppl {math.exp(r.hf_logits_nll):.3f}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- model runners
def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _cut(tokens: list[int], end_id: int) -> list[int]:
    """Tokens up to and including the first ``end_id``."""
    return tokens[: tokens.index(end_id) + 1] if end_id in tokens else tokens


def warpformer_generate(gpt: LambadaModel, batch: list[Sample]) -> list[list[int]]:
    """Greedy continuation of each context for the batch's longest target (end_id included)."""
    n = max(len(s.target_ids) for s in batch)
    out = gpt.generate([s.context_ids for s in batch], n)
    return [row[0] for row in out.tokens]


def warpformer_generate_batches(gpt: GPT, groups: list[list[Sample]], in_flight: int
                                ) -> Iterator[list[list[int]]]:
    """:func:`warpformer_generate` of every batch through :meth:`GPT.generate_batches` with
    ``in_flight`` batches on the GPU at once; yields each batch's rows in order."""
    outs = gpt.generate_batches([[s.context_ids for s in b] for b in groups],
                                [max(len(s.target_ids) for s in b) for b in groups],
                                in_flight=in_flight)
    for out in outs:
        yield [row[0] for row in out.tokens]


def hf_generate(model: transformers.PreTrainedModel, batch: list[Sample], end_id: int,
                pad_id: int) -> list[list[int]]:
    """HF greedy ``generate`` on the batch's contexts left padded with ``pad_id`` (int64
    ``[B, S]`` ids and attention mask on the model's device), as many new tokens as the longest
    target, stopping at ``end_id``; per sample the generated ids up to and including
    ``end_id``."""
    n = max(len(s.target_ids) for s in batch)
    S = max(len(s.context_ids) for s in batch)
    dev = next(model.parameters()).device
    ids = torch.full((len(batch), S), pad_id, dtype=torch.long)
    mask = torch.zeros(len(batch), S, dtype=torch.long)
    for b, s in enumerate(batch):
        ids[b, S - len(s.context_ids):] = torch.tensor(s.context_ids)
        mask[b, S - len(s.context_ids):] = 1
    out = model.generate(input_ids=ids.to(dev), attention_mask=mask.to(dev), max_new_tokens=n,
                         min_new_tokens=0, do_sample=False, num_beams=1, eos_token_id=end_id,
                         pad_token_id=pad_id, repetition_penalty=1.0, no_repeat_ngram_size=0)
    return [_cut(row.tolist(), end_id) for row in out[:, S:].cpu()]


def _teacher_forced(batch: list[Sample]) -> tuple[list[list[int]], list[int]]:
    seqs = [s.context_ids + s.target_ids[:-1] for s in batch]
    return seqs, [len(s.context_ids) - 1 for s in batch]


def score_logits(logits_fn: Callable[[list[list[int]]], torch.Tensor], batch: list[Sample]
                 ) -> list[tuple[bool, float]]:
    """Teacher forcing: ``(all target tokens are the arg-max, summed target NLL)`` per sample.

    ``logits_fn`` maps ``B`` token lists (context + target without its last token) to logits
    ``[B, S, V]`` of any float dtype (scored in fp32), ``S`` at least the longest list.
    """
    seqs, starts = _teacher_forced(batch)
    logits = logits_fn(seqs).float()
    out = []
    for b, s in enumerate(batch):
        n = len(s.target_ids)
        rows = logits[b, starts[b]: starts[b] + n]
        target = torch.tensor(s.target_ids, device=rows.device)
        nll = -torch.log_softmax(rows, -1).gather(1, target[:, None]).sum()
        out.append((bool((rows.argmax(-1) == target).all()), float(nll)))
    return out


def hf_logits_fn(model: transformers.PreTrainedModel
                 ) -> Callable[[list[list[int]]], torch.Tensor]:
    """A ``logits_fn`` for :func:`score_logits` running ``model``: ``B`` token lists, right
    padded into int64 ``[B, S]`` ids with an attention mask, -> logits ``[B, S, V]`` in the
    model's dtype on its device (``S``: the longest list)."""
    dev = next(model.parameters()).device

    def run(seqs: list[list[int]]) -> torch.Tensor:
        S = max(len(x) for x in seqs)
        ids = torch.zeros(len(seqs), S, dtype=torch.long)
        mask = torch.zeros(len(seqs), S, dtype=torch.long)
        for b, x in enumerate(seqs):
            ids[b, : len(x)] = torch.tensor(x)
            mask[b, : len(x)] = 1
        with torch.no_grad():
            return model(input_ids=ids.to(dev), attention_mask=mask.to(dev)).logits
    return run


def _progress(items, show: bool, desc: str):
    if not show:
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, unit="batch")


def evaluate(gpt: LambadaModel, samples: list[Sample], *, batch_size: int = 8,
             metric: str = "generate", hf_model: transformers.PreTrainedModel | None = None,
             show_progress: bool = False, end_id: int | None = None,
             pad_id: int | None = None, decode: Callable[[list[int]], str] | None = None,
             in_flight: int = 1) -> LambadaResult:
    """Run LAMBADA on tokenised ``samples`` with ``gpt`` (a :class:`warpformer.GPT`) and, when
    ``hf_model`` is given, with HF on the same batches. ``metric``: generate, logits or both.
    ``end_id`` defaults to ``gpt.end_id``, HF's ``pad_id`` to ``end_id``; ``decode`` (ids ->
    text) adds the generated text to the per-sample records. ``in_flight > 1`` runs the
    generate metric through :meth:`warpformer.GPT.generate_batches` with that many batches on
    the GPU at once (same tokens; its time is then the loop's wall time, building the engine's
    replicas on first use included, rather than the sum of the batches')."""
    if metric not in ("generate", "logits", "both"):
        raise ValueError(f"metric must be generate, logits or both, got {metric!r}")
    if isinstance(in_flight, bool) or not isinstance(in_flight, int) or in_flight < 1:
        raise ValueError(f"in_flight must be an integer >= 1, got {in_flight!r}")
    if in_flight > 1 and not callable(getattr(gpt, "generate_batches", None)):
        raise ValueError(f"in_flight={in_flight} needs a model with generate_batches "
                         f"(warpformer.GPT); {type(gpt).__name__} has none")
    end_id = gpt.end_id if end_id is None else end_id
    pad_id = end_id if pad_id is None else pad_id
    groups = batches(samples, batch_size)
    res = LambadaResult(total=len(samples))
    recs = [{"index": s.index, "context": s.context, "target": s.target,
             "target_ids": s.target_ids} for s in samples]
    gen = metric in ("generate", "both")
    if gen:
        res.correct, res.seconds = 0, 0.0
        # What ran: the reference backend takes the batches one at a time whatever in_flight.
        res.in_flight = in_flight if getattr(gpt, "backend", None) == "cuda" else 1
        if in_flight > 1:
            _sync()
            t0 = time.perf_counter()
            all_outs = list(_progress(warpformer_generate_batches(gpt, groups, in_flight),
                                      show_progress, "warpformer"))
            _sync()
            res.seconds = time.perf_counter() - t0
        else:
            all_outs = []
            for batch in _progress(groups, show_progress, "warpformer"):
                _sync()
                t0 = time.perf_counter()
                all_outs.append(warpformer_generate(gpt, batch))
                _sync()
                res.seconds += time.perf_counter() - t0
        for batch, outs in zip(groups, all_outs, strict=True):
            for s, toks in zip(batch, outs, strict=True):
                got = toks[: len(s.target_ids)]
                ok = got == s.target_ids
                res.correct += ok
                recs[s.index].update(generated_ids=got, correct=ok)
                if decode is not None:
                    recs[s.index]["generated_text"] = decode(got)
    if metric in ("logits", "both"):
        res.logits_correct, nll, count, res.logits_seconds = 0, 0.0, 0, 0.0
        for batch in _progress(groups, show_progress, "warpformer logits"):
            _sync()
            t0 = time.perf_counter()
            scores = score_logits(gpt.logits, batch)
            _sync()
            res.logits_seconds += time.perf_counter() - t0
            for s, (ok, s_nll) in zip(batch, scores, strict=True):
                res.logits_correct += ok
                nll += s_nll
                count += len(s.target_ids)
                recs[s.index].update(logits_correct=ok, target_nll=s_nll)
        res.logits_nll = nll / count
    if hf_model is not None:
        if gen:
            res.hf_correct, res.hf_seconds, res.agree = 0, 0.0, 0
            for batch in _progress(groups, show_progress, "HF"):
                _sync()
                t0 = time.perf_counter()
                with torch.no_grad():
                    outs = hf_generate(hf_model, batch, end_id, pad_id)
                _sync()
                res.hf_seconds += time.perf_counter() - t0
                for s, toks in zip(batch, outs, strict=True):
                    got = toks[: len(s.target_ids)]
                    ok = got == s.target_ids
                    same = got == recs[s.index]["generated_ids"]
                    res.hf_correct += ok
                    res.agree += same
                    recs[s.index].update(hf_generated_ids=got, hf_correct=ok, agree=same)
        if metric in ("logits", "both"):
            res.hf_logits_correct, nll, count = 0, 0.0, 0
            fn = hf_logits_fn(hf_model)
            for batch in _progress(groups, show_progress, "HF logits"):
                for s, (ok, s_nll) in zip(batch, score_logits(fn, batch), strict=True):
                    res.hf_logits_correct += ok
                    nll += s_nll
                    count += len(s.target_ids)
                    recs[s.index].update(hf_logits_correct=ok, hf_target_nll=s_nll)
            res.hf_logits_nll = nll / count
    res.records = recs
    return res


# ---------------------------------------------------------------------------- tokenizer
def build_word_tokenizer(texts: Sequence[str], out_dir: str | os.PathLike[str],
                         eos: str = "<|endoftext|>") -> Path:
    """Train a word-level tokenizer (words and punctuation marks are tokens) on ``texts`` and
    save it as a HF tokenizer folder loadable by ``AutoTokenizer.from_pretrained(out_dir)``.
    Ids: 0 ``<unk>``, 1 ``eos`` (also the pad token), then the vocabulary by frequency."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(list(texts), trainers.WordLevelTrainer(
        special_tokens=["<unk>", eos], min_frequency=1, show_progress=False))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>",
                                                eos_token=eos, pad_token=eos)
    out = Path(out_dir)
    fast.save_pretrained(out)
    return out


# ---------------------------------------------------------------------------- CLI
def world_rank() -> int:
    """This process's rank (warpformer.distributed when present, else the launcher's env)."""
    try:
        from . import distributed  # noqa: F401
    except ImportError:
        distributed = None
    get_context = getattr(distributed, "get_context", None)
    ctx = get_context() if callable(get_context) else None
    if ctx is not None:
        return int(ctx.info.rank)
    for var in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def add_args(p: argparse.ArgumentParser) -> None:
    """Add the ``warpformer lambada`` arguments to ``p``."""
    p.add_argument("--checkpoint-path", required=True, help="converted <tp>-gpu directory")
    p.add_argument("--tokenizer-path", required=True, help="HF tokenizer folder")
    p.add_argument("--dataset-path", required=True, help="LAMBADA-format JSONL file")
    p.add_argument("--batch-size", type=int, default=8,
                   help="samples per engine call (default 8)")
    p.add_argument("--test-hf", action="store_true",
                   help="also run HF transformers on the same samples and compare")
    p.add_argument("--hf-model-path", help="HF checkpoint for --test-hf (default: tokenizer path)")
    p.add_argument("--output-path", help="write per-sample results and the summary as JSON")
    p.add_argument("--show-progress", action="store_true", help="tqdm progress bars")
    p.add_argument("--metric", choices=("generate", "logits", "both"), default="generate",
                   help="generate: greedy-generate the target tokens (FT's method, default); "
                        "logits: teacher-forced arg-max at each target position, plus "
                        "perplexity; both")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="fp16",
                   help="compute type of warpformer and HF on a GPU (default fp16; the CPU "
                        "computes in fp32)")
    p.add_argument("--max-samples", type=int, help="evaluate only the first N samples")
    p.add_argument("--backend", choices=("auto", "cuda", "reference"), default="auto",
                   help="cuda: the C++/CUDA engine; reference: plain PyTorch on CPU (same "
                        "results, slow); auto (default): cuda when a GPU is visible")
    p.add_argument("--tensor-para-size", type=int, default=1,
                   help="tensor-parallel GPUs (default 1); > 1: one process per GPU under "
                        "mpirun or torchrun")
    p.add_argument("--pipeline-para-size", type=int, default=1,
                   help="pipeline stages (default 1); > 1: one process per GPU under mpirun "
                        "or torchrun")
    p.add_argument("--in-flight", type=int, default=1,
                   help="batches on the GPU at once (one GPU only): a batch's prompt pass runs "
                        "beside another's decode steps; each extra batch costs its KV cache")


def load_hf_model(path: str | os.PathLike[str], dtype: torch.dtype
                  ) -> transformers.PreTrainedModel:
    """HF causal LM for the comparison: on the GPU in ``dtype`` when one is visible, else CPU
    fp32; eager attention, evaluation mode."""
    import transformers

    cuda = torch.cuda.is_available()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype if cuda else torch.float32, attn_implementation="eager")
    return model.to("cuda" if cuda else "cpu").eval()


def run(checkpoint_path: str | os.PathLike[str], tokenizer_path: str | os.PathLike[str],
        dataset_path: str | os.PathLike[str], *, batch_size: int = 8, test_hf: bool = False,
        hf_model_path: str | os.PathLike[str] | None = None,
        output_path: str | os.PathLike[str] | None = None, show_progress: bool = False,
        metric: str = "generate", dtype: str = "fp16", max_samples: int | None = None,
        backend: str = "auto", tensor_para_size: int = 1, pipeline_para_size: int = 1,
        gpt: GPT | None = None, print_fn: Callable[[str], None] = print,
        in_flight: int = 1) -> LambadaResult:
    """Load tokenizer, data and model (or use ``gpt``), evaluate, print on rank 0, write JSON.

    ``dtype`` is ``"fp32"``, ``"fp16"`` or ``"bf16"``: warpformer's and HF's compute dtype on a
    GPU (HF and the reference backend compute in fp32 on the CPU); the other arguments are the
    CLI's (:func:`add_args`).
    """
    from .gpt import GPT
    from .models.gpt import default_max_seq_len
    from .tokenizer import load_tokenizer
    from .weights import read_config

    main_rank = world_rank() == 0
    say = print_fn if main_rank else (lambda _msg: None)
    _check_count("max_samples (--max-samples)", max_samples)  # before the tokenizer loads
    tokenizer = load_tokenizer(tokenizer_path, "--tokenizer-path")
    samples = tokenize_samples(read_dataset(dataset_path, max_samples), tokenizer)
    need = max(max(len(s.context_ids) for s in b) + max(len(s.target_ids) for s in b)
               for b in batches(samples, batch_size))
    if gpt is None:
        limit = default_max_seq_len(read_config(checkpoint_path))
        if need > limit:
            raise ValueError(f"{dataset_path}: a batch needs {need} positions, more than the "
                             f"model's {limit}")
        gpt = GPT.from_pretrained(checkpoint_path, dtype=DTYPES[dtype], max_batch=batch_size,
                                  max_seq_len=need, backend=backend,
                                  tensor_para_size=tensor_para_size,
                                  pipeline_para_size=pipeline_para_size)
    hf = None
    if test_hf and main_rank:
        hf_path = hf_model_path or tokenizer_path
        if not (Path(hf_path) / "config.json").is_file():
            raise ValueError(f"--test-hf needs a HF checkpoint: {hf_path} has no config.json "
                             "(pass --hf-model-path)")
        hf = load_hf_model(hf_path, DTYPES[dtype])
    say(f"warpformer: {gpt!r}")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else gpt.end_id
    res = evaluate(gpt, samples, batch_size=batch_size, metric=metric, hf_model=hf,
                   show_progress=show_progress and main_rank, pad_id=pad,
                   decode=lambda ids: _safe_decode(tokenizer, ids), in_flight=in_flight)
    say(format_report(res, f"LAMBADA {Path(dataset_path).name}"))
    if output_path and main_rank:
        Path(output_path).write_text(json.dumps(
            {"summary": res.summary(), "samples": res.records}, indent=1))
        say(f"per-sample results written to {output_path}")
    return res


def _check_count(name: str, value: int | None) -> None:
    """``value`` must be None or an integer >= 1 (a negative count would silently mean one)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def _safe_decode(tokenizer, ids: list[int]) -> str:
    try:
        return tokenizer.decode(ids)
    except (IndexError, KeyError, OverflowError, TypeError, ValueError):  # ids past its vocab
        return ""


def main_from_args(args: argparse.Namespace) -> int:
    """``warpformer lambada``: :func:`run` with the parsed :func:`add_args` arguments; returns 0."""
    run(args.checkpoint_path, args.tokenizer_path, args.dataset_path,
        batch_size=args.batch_size, test_hf=args.test_hf, hf_model_path=args.hf_model_path,
        output_path=args.output_path, show_progress=args.show_progress, metric=args.metric,
        dtype=args.dtype, max_samples=args.max_samples, backend=args.backend,
        tensor_para_size=args.tensor_para_size, pipeline_para_size=args.pipeline_para_size,
        in_flight=args.in_flight)
    return 0
