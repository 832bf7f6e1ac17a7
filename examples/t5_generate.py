"""Encoder-decoder generation (T5, Flan-T5, mT5, UL2, BART, mBART) with warpformer.Seq2Seq, under
the flag names of FasterTransformer's T5 example (translate_example.py).

    warpformer convert --input-dir hf_t5_small/ --output-dir t5-wf/ --data-type fp16
    python examples/t5_generate.py --ckpt_path t5-wf/1-gpu --tokenizer_path hf_t5_small/ \
        --source sentences.txt -batch 8 -beam 4 -o 64 -d fp16 -time
    python examples/t5_generate.py --ckpt_path t5-wf/1-gpu --input_ids 37,1566,19,1 -beam 4

Inputs are the lines of ``--source`` (text, with ``--tokenizer_path`` or a tokenizer in the
checkpoint folder; ``--prefix`` is prepended, e.g. "translate English to German: ") or
``--input_ids`` (comma-separated ids per input, no tokenizer). Each output (decoded, or its ids)
goes to stdout, one a line, in input order; ``-time`` adds the mean latency per batch on stderr.
Sampling follows FT: ``-topk 1 -topp 0`` (the defaults) is greedy, a beam width > 1 beam search.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from warpformer.seq2seq import Seq2Seq
from warpformer.tokenizer import has_tokenizer_files, load_tokenizer

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt_path", "-ckpt_path", required=True,
                    help="converted checkpoint (OUT or OUT/<tp>-gpu)")
    ap.add_argument("--tokenizer_path", help="HF tokenizer folder (default: --ckpt_path, if it "
                                             "holds one)")
    ap.add_argument("--source", help="text file, one input a line")
    ap.add_argument("--input_ids", nargs="+", metavar="IDS",
                    help="inputs as comma-separated token ids (no tokenizer needed)")
    ap.add_argument("--prefix", default="", help="prepended to every text input")
    ap.add_argument("-batch", "--batch_size", dest="batch_size", type=int, default=1)
    ap.add_argument("-beam", "--beam_width", dest="beam_width", type=int, default=1)
    ap.add_argument("-s", "--max_seq_len", dest="max_seq_len", type=int, default=256,
                    help="input tokens kept per input (longer ones are truncated)")
    ap.add_argument("-o", "--output_seq_len", dest="output_seq_len", type=int, default=64,
                    help="new tokens per output at most")
    ap.add_argument("-d", "--data_type", dest="data_type", choices=tuple(DTYPES), default="fp32",
                    help="compute type (the reference backend on CPU computes in fp32)")
    ap.add_argument("-topk", "--sampling_topk", dest="top_k", type=int, default=1)
    ap.add_argument("-topp", "--sampling_topp", dest="top_p", type=float, default=0.0)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--len_penalty", type=float, default=1.0, help="beam search length penalty")
    ap.add_argument("--repetition_penalty", type=float, default=1.0)
    ap.add_argument("--beam_search_diversity_rate", type=float, default=0.0)
    ap.add_argument("--random_seed", type=int, default=0)
    ap.add_argument("-max_ite", "--max_ite", dest="max_ite", type=int, default=0,
                    help="batches to run at most (0: all)")
    ap.add_argument("-time", "--test_time", dest="test_time", action="store_true",
                    help="report the mean latency per batch on stderr")
    ap.add_argument("--backend", choices=("auto", "cuda", "reference"), default="auto")
    return ap.parse_args(argv)


def read_inputs(args: argparse.Namespace, tokenizer) -> list[list[int]]:
    """Every input as token ids, truncated to --max_seq_len."""
    if (args.source is None) == (args.input_ids is None):
        raise ValueError("give exactly one of --source and --input_ids")
    if args.input_ids is not None:
        try:
            rows = [[int(t) for t in text.split(",") if t.strip()] for text in args.input_ids]
        except ValueError:
            raise ValueError("--input_ids takes comma-separated integers, e.g. 37,1566,1") from None
    else:
        if tokenizer is None:
            raise ValueError("--source needs a tokenizer: pass --tokenizer_path (or use "
                             "--input_ids)")
        lines = [ln.rstrip("\n") for ln in Path(args.source).read_text().splitlines()]
        rows = [tokenizer.encode(args.prefix + ln) for ln in lines if ln.strip()]
    if not rows or any(not r for r in rows):
        raise ValueError("every input must have at least one token")
    return [r[: args.max_seq_len] for r in rows]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        for name in ("batch_size", "beam_width", "max_seq_len", "output_seq_len"):
            if getattr(args, name) < 1:
                raise ValueError(f"--{name} must be >= 1, got {getattr(args, name)}")
        tok_dir = args.tokenizer_path or (args.ckpt_path if has_tokenizer_files(args.ckpt_path)
                                          else None)
        tokenizer = load_tokenizer(tok_dir) if tok_dir else None
        inputs = read_inputs(args, tokenizer)
        model = Seq2Seq.from_pretrained(
            args.ckpt_path, backend=args.backend, dtype=DTYPES[args.data_type],
            max_batch=args.batch_size,
            max_seq_len=max(max(len(r) for r in inputs), 1 + args.output_seq_len))
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sample = args.top_k != 1 or args.top_p not in (0.0, 1.0)
    options = dict(num_beams=args.beam_width, repetition_penalty=args.repetition_penalty,
                   temperature=args.temperature)
    if args.beam_width > 1:
        options.update(length_penalty=args.len_penalty,
                       diversity_rate=args.beam_search_diversity_rate)
    elif sample:
        options.update(do_sample=True, top_k=args.top_k, top_p=args.top_p or 1.0)
    times = []
    for i, start in enumerate(range(0, len(inputs), args.batch_size)):
        if args.max_ite and i >= args.max_ite:
            break
        batch = inputs[start: start + args.batch_size]
        if sample:
            options["seed"] = args.random_seed + start
        began = time.perf_counter()
        try:
            out = model.generate(batch, args.output_seq_len, **options)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if model.device.type == "cuda":
            torch.cuda.synchronize(model.device)
        times.append(time.perf_counter() - began)
        for row in out.tokens:
            ids = [t for t in row[0] if t not in model.end_ids]
            print(tokenizer.decode(ids, skip_special_tokens=True) if tokenizer is not None
                  else ",".join(map(str, ids)))
    if args.test_time and times:
        print(f"[t5_generate] {len(times)} batches of <= {args.batch_size}, beam "
              f"{args.beam_width}: {1000 * sum(times) / len(times):.2f} ms per batch "
              f"({model.backend})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
