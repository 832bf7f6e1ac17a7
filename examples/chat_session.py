"""A multi-turn chat on one warpformer.GPT session: each turn runs the prompt pass over its new
tokens only, the earlier turns staying in the session's KV cache.

    python examples/chat_session.py --ckpt_path OUT/1-gpu --tokenizer_path HF_DIR \
        --template 'User: {text}\\nAssistant:' --output_len 64 --top_p 0.9 --temperature 0.8
    python examples/chat_session.py --ckpt_path OUT/1-gpu --tokenizer_path HF_DIR \
        --turns "Hello." "Tell me more."      # non-interactive

Without ``--turns`` the turns are read from stdin, one a line (an empty line or EOF ends the
chat). Each reply (the newly generated tokens, decoded) goes to stdout; a status line per turn
(prompt tokens, history, new tokens, wall time) to stderr. Sampling flags follow
``examples/generate.py`` (FasterTransformer's): ``--top_k 1 --top_p 0`` (the defaults) mean
greedy decoding; any other top_k/top_p samples, seeded by ``--random_seed``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator

import torch

from warpformer.gpt import GPT
from warpformer.tokenizer import has_tokenizer_files, load_tokenizer

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt_path", required=True, help="converted checkpoint (OUT or OUT/1-gpu)")
    ap.add_argument("--tokenizer_path", "--tokenizer", dest="tokenizer_path",
                    help="HF tokenizer folder (default: --ckpt_path, if it holds one)")
    ap.add_argument("--dtype", "--data_type", dest="dtype", choices=tuple(DTYPES),
                    default="fp16", help="compute type (the reference backend on CPU runs fp16 "
                                         "in fp32)")
    ap.add_argument("--backend", choices=("auto", "cuda", "reference"), default="auto")
    ap.add_argument("--max_len", type=int, default=None,
                    help="tokens the conversation may hold (default: the model's max_seq_len)")
    ap.add_argument("--max_new_tokens", "--output_len", dest="max_new_tokens", type=int,
                    default=64, help="reply tokens per turn at most")
    ap.add_argument("--top_k", type=int, default=1, help="1 (with --top_p 0): greedy")
    ap.add_argument("--top_p", type=float, default=0.0, help="0 or 1: off")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--repetition_penalty", type=float, default=1.0)
    ap.add_argument("--random_seed", type=int, default=0, help="turn i samples with seed + i")
    ap.add_argument("--template", default="{text}",
                    help="wraps each user turn, e.g. 'User: {text}\\nAssistant:' ('\\n': a "
                         "newline)")
    ap.add_argument("--turns", nargs="+", metavar="TEXT", help="the user turns (else stdin)")
    return ap.parse_args(argv)


def user_turns(args: argparse.Namespace) -> Iterator[str]:
    if args.turns:
        yield from args.turns
        return
    while True:
        if sys.stdin.isatty():
            print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line.strip():
            return
        yield line.rstrip("\n")


def main(argv: list[str] | None = None) -> int:
    """Run the chat on ``argv`` (default ``sys.argv[1:]``); returns the exit code (2: bad
    input, with ``error: ...`` on stderr)."""
    args = parse_args(argv)
    try:
        return chat(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def chat(args: argparse.Namespace) -> int:
    tok_dir = args.tokenizer_path or args.ckpt_path
    if args.tokenizer_path is None and not has_tokenizer_files(tok_dir):
        raise ValueError(f"--ckpt_path {tok_dir} holds no tokenizer: pass --tokenizer_path")
    if "{text}" not in args.template:
        raise ValueError("--template must contain {text}")
    template = args.template.replace("\\n", "\n")
    tokenizer = load_tokenizer(tok_dir, "--tokenizer_path")
    gpt = GPT.from_pretrained(args.ckpt_path, dtype=DTYPES[args.dtype], max_batch=1,
                              max_seq_len=args.max_len, backend=args.backend)
    sample = args.top_k > 1 or 0.0 < args.top_p < 1.0
    options = dict(temperature=args.temperature, repetition_penalty=args.repetition_penalty)
    if sample:
        options.update(do_sample=True, top_k=args.top_k,
                       top_p=args.top_p if 0.0 < args.top_p < 1.0 else None)
    with gpt.start_session(1, gpt.max_seq_len) as session:
        for i, text in enumerate(user_turns(args)):
            # Special tokens (a BOS) start the conversation only, not every turn.
            ids = tokenizer.encode(template.replace("{text}", text), add_special_tokens=i == 0)
            history = len(session.history[0])
            if sample:
                options["seed"] = args.random_seed + i
            t0 = time.perf_counter()
            try:
                out = session.generate([ids], args.max_new_tokens, **options)
            except ValueError as exc:  # e.g. the conversation outgrew --max_len
                raise ValueError(f"turn {i + 1}: {exc}") from None
            ms = (time.perf_counter() - t0) * 1e3
            reply = out.tokens[0][0]
            shown = reply[:-1] if reply and reply[-1] in gpt.end_ids else reply
            print(tokenizer.decode(shown), flush=True)
            print(f"[turn {i + 1}] prompt tokens {len(ids)}, history {history}, new tokens "
                  f"{len(reply)}, {ms:.1f} ms", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
