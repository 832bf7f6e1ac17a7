"""``warpformer demo``: the main job end to end on a fresh machine.

Default (nothing to download): build a small GPT-2-shaped HF model locally with RANDOM weights and
a word-level tokenizer trained on the bundled LAMBADA-format sample, convert it with
``warpformer.converters``, generate from a prompt, and run LAMBADA with FT's method against HF
transformers (accuracy, agreement of the generated target tokens, speedup). ``--model-dir`` uses a
real HF checkpoint instead (converted once into a cache folder). Without a GPU the
plain-PyTorch reference backend runs on CPU, and the demo says so.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ._cache import cache_dir as _cache_dir
from ._cache import convert_cached

if TYPE_CHECKING:
    from .lambada import LambadaResult

__all__ = ["add_args", "run_demo", "main_from_args", "default_dataset", "build_random_gpt2"]

BANNER = "=" * 78
DEFAULT_PROMPT = "The old lighthouse keeper climbed the stairs and"


def default_dataset() -> Path:
    """``data/lambada_sample.jsonl`` of the source tree (the package is installed editable)."""
    return Path(__file__).resolve().parents[2] / "data" / "lambada_sample.jsonl"


def _say(msg: str = "") -> None:
    print(msg, flush=True)


def build_random_gpt2(dataset: Path, out: Path, *, layers: int = 4, hidden: int = 256,
                      heads: int = 4, positions: int = 256, seed: int = 0,
                      peak: float = 4.0) -> Path:
    """A GPT-2-shaped HF checkpoint with random weights plus a word-level tokenizer trained on
    ``dataset``, saved together in ``out`` (``AutoTokenizer``/``AutoModelForCausalLM`` load it).
    The output head is untied and scaled by ``peak`` so that greedy choices have clear margins
    (a tied, scaled head would mostly repeat the last token)."""
    import transformers

    from .lambada import build_word_tokenizer

    texts = [json.loads(line)["text"] for line in dataset.read_text().splitlines() if line]
    build_word_tokenizer(texts, out)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(vocab_size=len(tokenizer), n_embd=hidden, n_head=heads,
                                  n_layer=layers, n_positions=positions,
                                  bos_token_id=tokenizer.eos_token_id,
                                  eos_token_id=tokenizer.eos_token_id,
                                  tie_word_embeddings=False)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(peak)
    model.save_pretrained(out)
    return out


def _convert(hf_dir: Path, out: Path, data_type: str) -> Path:
    return convert_cached(hf_dir, out, data_type, say=_say)


def run_demo(model_dir: str | os.PathLike[str] | None = None, *,
             dataset: str | os.PathLike[str] | None = None, batch_size: int = 8,
             max_samples: int | None = None, backend: str = "auto",
             prompt: str = DEFAULT_PROMPT, max_new_tokens: int = 24,
             work_dir: str | os.PathLike[str] | None = None, layers: int = 4) -> LambadaResult:
    """Run the demo; returns the LAMBADA :class:`~warpformer.lambada.LambadaResult`.

    ``model_dir``: a HF checkpoint (``None``: the random GPT-2-shaped model with ``layers``
    layers); ``dataset``: LAMBADA-format JSONL (default :func:`default_dataset`); ``work_dir``:
    where the random model and its conversion go (default: a temporary folder removed at the
    end; a given ``model_dir`` is converted into the cache, ``$WARPFORMER_CACHE`` or
    ``$XDG_CACHE_HOME/warpformer``, by default ``~/.cache/warpformer``).
    """
    from . import lambada
    from .gpt import GPT
    from .tokenizer import load_tokenizer

    data = Path(dataset) if dataset else default_dataset()
    if not data.is_file():
        raise ValueError(f"LAMBADA sample {data} not found; pass --dataset-path")
    cuda = torch.cuda.is_available() and backend != "reference"
    _say(BANNER)
    if cuda:
        _say(f"GPU: {torch.cuda.get_device_name()} -> the CUDA engine runs the model")
    else:
        _say("No GPU visible (or --backend reference): running warpformer's plain-PyTorch "
             "reference backend on CPU. Same results as the CUDA engine, none of its speed.")
    data_type = "fp16" if cuda else "fp32"
    dtype = torch.float16 if cuda else torch.float32
    tmp = None
    if work_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="warpformer-demo-")
        work = Path(tmp.name)
    else:
        work = Path(work_dir)
        work.mkdir(parents=True, exist_ok=True)
    try:
        if model_dir is None:
            _say(BANNER)
            _say("MODEL: a small GPT-2-shaped model with RANDOM WEIGHTS, built here (nothing can "
                 "be downloaded).\nIts text is gibberish and its LAMBADA accuracy is meaningless; "
                 "what the demo shows\nis the pipeline, the agreement with HF transformers and "
                 "the speed.")
            hf_dir = build_random_gpt2(data, work / "hf", layers=layers)
            tokenizer = load_tokenizer(hf_dir, "--model-dir")
            converted = _convert(hf_dir, work / "converted", data_type)
        else:
            hf_dir = Path(model_dir)
            if not (hf_dir / "config.json").is_file():
                raise ValueError(f"--model-dir {hf_dir} is not a HF checkpoint (no config.json)")
            # Loaded before the conversion, which takes minutes for a real model.
            tokenizer = load_tokenizer(hf_dir, "--model-dir")
            _say(BANNER)
            _say(f"MODEL: your checkpoint {hf_dir}")
            converted = _convert(hf_dir, _cache_dir(hf_dir, data_type), data_type)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the CPU fallback was announced above
            gpt = GPT.from_pretrained(converted, dtype=dtype, max_batch=batch_size,
                                      backend="cuda" if cuda else "reference")
        _say(f"loaded {gpt!r}")

        _say(BANNER)
        ids = tokenizer.encode(prompt)
        if not ids:
            raise ValueError(f"--prompt {prompt!r} encodes to no tokens with the tokenizer of "
                             f"{hf_dir}")
        t0 = time.perf_counter()
        greedy = gpt.generate([ids], max_new_tokens)
        dt = time.perf_counter() - t0
        sampled = gpt.generate([ids], max_new_tokens, do_sample=True, top_p=0.9,
                               temperature=0.8, seed=0)
        _say(f"prompt:  {prompt!r}")
        _say(f"greedy:  {tokenizer.decode(greedy.tokens[0][0])!r}")
        _say(f"sampled (top_p=0.9, temperature=0.8, seed=0): "
             f"{tokenizer.decode(sampled.tokens[0][0])!r}")
        _say(f"greedy: {len(greedy.tokens[0][0])} tokens in {dt:.3f} s")

        _say(BANNER)
        samples = lambada.read_dataset(data, max_samples)
        lambada.tokenize_samples(samples, tokenizer)
        need = max(len(s.context_ids) + len(s.target_ids) for s in samples)
        if need > gpt.max_seq_len:
            raise ValueError(f"a LAMBADA sample needs {need} positions; the model has "
                             f"{gpt.max_seq_len}")
        hf = lambada.load_hf_model(hf_dir, dtype)
        _say(f"LAMBADA (FT's method, greedy) on {data.name}: {len(samples)} samples, batch "
             f"{batch_size}; HF transformers on the same batches for comparison")
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else gpt.end_id
        res = lambada.evaluate(gpt, samples, batch_size=batch_size, hf_model=hf, pad_id=pad,
                               show_progress=True)
        _say(lambada.format_report(res, "LAMBADA"))
        if model_dir is None:
            _say("(random weights: the accuracies mean nothing; the agreement with HF does)")
        if not cuda:
            _say("(reference backend on CPU: the speedup compares two plain-PyTorch CPU runs; "
                 "run on a GPU for the engine's)")
        _say(BANNER)
        return res
    finally:
        if tmp is not None:
            tmp.cleanup()


def add_args(p: argparse.ArgumentParser) -> None:
    """Add the ``warpformer demo`` arguments to ``p``."""
    p.add_argument("--model-dir", help="a HF checkpoint (config.json, weights, tokenizer) to use "
                                       "instead of the random demo model")
    p.add_argument("--dataset-path", help="LAMBADA-format JSONL (default: the bundled "
                                          "data/lambada_sample.jsonl)")
    p.add_argument("--batch-size", type=int, default=8,
                   help="prompts per engine call in the LAMBADA run (default 8)")
    p.add_argument("--max-samples", type=int, help="only the first N LAMBADA samples")
    p.add_argument("--backend", choices=("auto", "cuda", "reference"), default="auto",
                   help="cuda: the C++/CUDA engine; reference: plain PyTorch on CPU (same "
                        "results, slow); auto (default): cuda when a GPU is visible")
    p.add_argument("--prompt", default=DEFAULT_PROMPT,
                   help="text of the generation shown before LAMBADA (default: %(default)r)")
    p.add_argument("--max-new-tokens", type=int, default=24,
                   help="tokens generated from --prompt (default 24)")
    p.add_argument("--work-dir", help="keep the demo model and converted files here")


def main_from_args(args: argparse.Namespace) -> int:
    """``warpformer demo``: :func:`run_demo` on the parsed arguments; returns 0."""
    run_demo(args.model_dir, dataset=args.dataset_path, batch_size=args.batch_size,
             max_samples=args.max_samples, backend=args.backend, prompt=args.prompt,
             max_new_tokens=args.max_new_tokens, work_dir=args.work_dir)
    return 0
