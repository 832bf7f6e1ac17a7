"""Generate text with warpformer.GPT, with FasterTransformer's ``multi_gpu_gpt_example.py`` flags.

    python examples/generate.py --ckpt_path OUT/1-gpu --tokenizer_path HF_DIR \
        --sample_input_file prompts.txt --output_len 64 --top_p 0.9 --temperature 0.8
    python examples/generate.py --ckpt_path OUT/1-gpu --beam_width 4 --len_penalty 1.0
    python examples/generate.py --ckpt_path OUT/1-gpu --tokenizer_path HF_DIR --stream
    torchrun --nproc_per_node 2 examples/generate.py --ckpt_path OUT/2-gpu --tensor_para_size 2

Prompts: with ``--tokenizer_path``, ``--sample_input_file`` holds one text prompt per line (default:
one built-in prompt); without a tokenizer it holds comma-separated token ids per line (FT's
``start_ids.csv``), default ``[[818, 262, 3726]]``. As in FT, ``--top_k 1 --top_p 0`` (the
defaults) mean greedy decoding; any other top_k/top_p samples.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

import warpformer  # noqa: F401
from warpformer.gpt import GPT

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt_path", required=True, help="converted <tp>-gpu directory")
    ap.add_argument("--tokenizer_path", help="HF tokenizer folder (text in, text out)")
    ap.add_argument("--sample_input_file", help="prompts (text, or comma-separated ids)")
    ap.add_argument("--sample_output_file", help="write the output ids here (one row a line)")
    ap.add_argument("--max_batch_size", type=int, default=8)
    ap.add_argument("--output_len", type=int, default=32)
    ap.add_argument("--beam_width", type=int, default=1)
    ap.add_argument("--top_k", type=int, default=1, help="1 (with top_p 0): greedy; 0: no limit")
    ap.add_argument("--top_p", type=float, default=0.0, help="0: off (FT); else nucleus mass")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--len_penalty", type=float, default=1.0)
    ap.add_argument("--beam_search_diversity_rate", type=float, default=0.0)
    ap.add_argument("--repetition_penalty", type=float, default=1.0)
    ap.add_argument("--presence_penalty", type=float, default=0.0)
    ap.add_argument("--frequency_penalty", type=float, default=0.0)
    ap.add_argument("--min_length", type=int, default=0)
    ap.add_argument("--random_seed", type=int, default=0)
    ap.add_argument("--tensor_para_size", type=int, default=1)
    ap.add_argument("--pipeline_para_size", type=int, default=1)
    ap.add_argument("--data_type", choices=tuple(DTYPES), default="fp16")
    ap.add_argument("--max_seq_len", type=int, help="default: the model's position table")
    ap.add_argument("--return_cum_log_probs", type=int, choices=(0, 1, 2), default=0)
    ap.add_argument("--return_output_log_probs", action="store_true")
    ap.add_argument("--stream", action="store_true", help="print tokens as they are produced")
    ap.add_argument("--backend", choices=("auto", "cuda", "reference"), default="auto")
    return ap.parse_args(argv)


def read_prompts(args, tokenizer) -> list[list[int]]:
    if tokenizer is not None:
        lines = ["In the beginning"]
        if args.sample_input_file:
            with open(args.sample_input_file, encoding="utf-8") as f:
                lines = [line.rstrip("\n") for line in f if line.strip()]
        return [tokenizer.encode(line) for line in lines]
    if args.sample_input_file:
        with open(args.sample_input_file, encoding="utf-8") as f:
            return [[int(t) for t in line.split(",") if t.strip()] for line in f if line.strip()]
    return [[818, 262, 3726]]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tokenizer = None
    if args.tokenizer_path:
        import transformers

        tokenizer = transformers.AutoTokenizer.from_pretrained(args.tokenizer_path)
    gpt = GPT.from_pretrained(args.ckpt_path, dtype=DTYPES[args.data_type],
                              tensor_para_size=args.tensor_para_size,
                              pipeline_para_size=args.pipeline_para_size,
                              max_batch=args.max_batch_size, max_seq_len=args.max_seq_len,
                              backend=args.backend)
    prompts = read_prompts(args, tokenizer)
    rank0 = _rank() == 0
    sample = not (args.top_k == 1 and args.top_p == 0.0) and args.beam_width == 1
    kwargs = dict(
        do_sample=sample, top_k=args.top_k if sample else None,
        top_p=(args.top_p or 1.0) if sample else None, temperature=args.temperature,
        repetition_penalty=args.repetition_penalty, presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty, min_length=args.min_length,
        num_beams=args.beam_width, length_penalty=args.len_penalty,
        diversity_rate=args.beam_search_diversity_rate,
        seed=[args.random_seed + i for i in range(len(prompts))] if sample else None,
        return_log_probs=args.return_output_log_probs,
        return_cum_log_probs=args.return_cum_log_probs)
    show = (lambda ids: tokenizer.decode(ids)) if tokenizer else str
    if args.stream:
        if rank0:
            print("streaming (one line per step: the new token of each row)")
        stream = gpt.generate_stream(prompts, args.output_len, **kwargs)
        while True:
            try:
                step = next(stream)
            except StopIteration as stop:
                out = stop.value
                break
            if rank0:
                print(" | ".join(show([t]) for t in step[:, 0].tolist()), flush=True)
    else:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = gpt.generate(prompts, args.output_len, **kwargs)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        if rank0:
            print(f"generated in {time.perf_counter() - t0:.3f} s ({gpt.backend} backend)")
    if not rank0:
        return 0
    for b, prompt in enumerate(prompts):
        for k, toks in enumerate(out.tokens[b]):
            print(f"[{b}][beam {k}] input: {show(prompt)}")
            print(f"[{b}][beam {k}] output ids: {toks}")
            if tokenizer:
                print(f"[{b}][beam {k}] output: {show(toks)}")
            if out.cum_log_probs is not None:
                print(f"[{b}][beam {k}] cum_log_probs: {float(out.cum_log_probs[b, k]):.4f}")
            if out.log_probs is not None:
                print(f"[{b}][beam {k}] output_log_probs: "
                      f"{[round(v, 4) for v in out.log_probs[b, k, :len(toks)].tolist()]}")
    if args.sample_output_file:
        with open(args.sample_output_file, "w", encoding="utf-8") as f:
            for row in out.tokens:
                f.write(",".join(str(t) for t in row[0]) + "\n")
    return 0


def _rank() -> int:
    from warpformer.lambada import world_rank

    return world_rank()


if __name__ == "__main__":
    sys.exit(main())
