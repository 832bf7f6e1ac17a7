"""Token ids in, token ids out through a ``torch.jit.script``-ed module holding the C++ engine
(``torch.classes.warpformer.GptModel``) and calling its ``decode`` with sampling options, so the
whole pipeline can be saved and served from C++ or Python without warpformer's Python layer.

    python examples/torchscript_pipeline.py --model-dir OUT/1-gpu --ids "464,2068,7586;15496"
    python examples/torchscript_pipeline.py --model-dir OUT/1-gpu --ids 464,2068 --save gen.pt
    python examples/torchscript_pipeline.py --self-test      # tiny random GPT-2, save + reload

Needs a GPU: the scripted module holds the CUDA engine (the reference backend is plain Python
and cannot be scripted).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
from torchscript_generate import tiny_checkpoint  # the same tiny GPT-2 checkpoint

import warpformer  # noqa: F401  (registers torch.classes.warpformer)


class Pipeline(torch.nn.Module):
    """``forward(input_ids int32 [B, S] cuda, input_lengths int32 [B], output_len, top_k, top_p,
    temperature, seed) -> (output_ids int32 [B, S + output_len], sequence_lengths int32 [B])``."""

    def __init__(self, model: torch.ScriptObject) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, input_lengths: torch.Tensor, output_len: int,
                top_k: int = 1, top_p: float = 1.0, temperature: float = 1.0,
                seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        options: dict[str, torch.Tensor] = {
            "top_k": torch.tensor(top_k, dtype=torch.int32),
            "top_p": torch.tensor(top_p, dtype=torch.float32),
            "temperature": torch.tensor(temperature, dtype=torch.float32),
            "seed": torch.tensor(seed, dtype=torch.int64),
        }
        out = self.model.decode(input_ids, input_lengths, output_len, options)
        return out["output_ids"][:, 0], out["sequence_lengths"][:, 0]


def parse_ids(text: str) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [[int(t) for t in row.split(",") if t.strip()] for row in text.split(";") if row]
    if not rows or not all(rows):
        raise SystemExit("--ids: give comma-separated ids, rows separated by ';'")
    ids = torch.zeros(len(rows), max(map(len, rows)), dtype=torch.int32)
    for b, row in enumerate(rows):
        ids[b, : len(row)] = torch.tensor(row, dtype=torch.int32)
    return ids.cuda(), torch.tensor([len(r) for r in rows], dtype=torch.int32, device="cuda")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", help="converted <tp>-gpu directory")
    ap.add_argument("--ids", default="5,17,42,9;7,3", help="rows of ids: '1,2,3;4,5'")
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=1)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=("fp32", "fp16", "bf16"), default="fp16")
    ap.add_argument("--save", help="also save the scripted module here and reload it")
    ap.add_argument("--self-test", action="store_true",
                    help="tiny random GPT-2: script, run, save, reload, compare")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("torchscript_pipeline: no CUDA device visible. The scripted module holds the CUDA "
              "engine (torch.classes.warpformer.GptModel); run this example on a GPU machine. "
              "On CPU use warpformer.GPT with backend='reference' instead.", file=sys.stderr)
        return 1
    if not (args.model_dir or args.self_test):
        ap.error("give --model-dir or --self-test")
    from warpformer.models.gpt import load_gpt_model

    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = tiny_checkpoint(Path(tmp)) if args.self_test else args.model_dir
        ids, lengths = parse_ids(args.ids)
        engine = load_gpt_model(model_dir, dtype=dtype, max_batch=ids.shape[0],
                                max_seq_len=ids.shape[1] + args.output_len)
        scripted = torch.jit.script(Pipeline(engine))
        run = (lambda m: m(ids, lengths, args.output_len, args.top_k, args.top_p,  # noqa: E731
                           args.temperature, args.seed))
        out, seq = run(scripted)
        for b in range(ids.shape[0]):
            print(f"row {b}: ids in {ids[b, : int(lengths[b])].tolist()} -> out "
                  f"{out[b, : int(seq[b])].tolist()}")
        save = args.save or (str(Path(tmp) / "pipeline.pt") if args.self_test else None)
        if save:
            scripted.save(save)
            again, _ = run(torch.jit.load(save))
            same = torch.equal(again, out)
            print(f"saved to {save}; reloaded module gives {'the same' if same else 'OTHER'} ids")
            if not same:
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
