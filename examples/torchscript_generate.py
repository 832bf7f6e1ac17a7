"""TorchScript: a scripted nn.Module holding torch.classes.warpformer.GptModel, saved to a file
and loaded in a new process (the class pickles its config and weights with the module).

    python examples/torchscript_generate.py --model-dir OUT/1-gpu --save gen.pt
    python examples/torchscript_generate.py --load gen.pt
    python examples/torchscript_generate.py --self-test      # tiny random GPT-2, both steps

Token ids in, token ids out: tokenisation stays outside the scripted module.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

import warpformer  # noqa: F401  (registers torch.classes.warpformer)
from warpformer.models.gpt import load_gpt_model


class Generator(torch.nn.Module):
    """Greedy generation through the engine, scriptable and savable."""

    def __init__(self, model: torch.ScriptObject) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, input_lengths: torch.Tensor,
                output_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids int32 [B, S] (CUDA), input_lengths int32 [B] -> (ids [B, 1, S + output_len],
        sequence_lengths [B, 1])."""
        return self.model.generate(input_ids, input_lengths, output_len, -1)


def prompt() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.tensor([[5, 17, 42, 9], [7, 3, 0, 0]], dtype=torch.int32, device="cuda")
    return ids, torch.tensor([4, 2], dtype=torch.int32, device="cuda")


def save(model_dir: str, path: str, dtype: torch.dtype) -> torch.Tensor:
    scripted = torch.jit.script(Generator(load_gpt_model(model_dir, dtype=dtype, max_batch=2,
                                                         max_seq_len=64)))
    ids, lengths = prompt()
    out, _ = scripted(ids, lengths, 8)
    scripted.save(path)
    print(f"saved scripted generator to {path}; tokens {out[:, 0].tolist()}")
    return out


def load(path: str) -> torch.Tensor:
    scripted = torch.jit.load(path)
    ids, lengths = prompt()
    out, seq = scripted(ids, lengths, 8)
    print(f"loaded {path}; tokens {out[:, 0].tolist()} lengths {seq[:, 0].tolist()}")
    return out


def tiny_checkpoint(root: Path) -> str:
    import transformers

    from warpformer.converters import convert

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=100, n_embd=128, n_head=2, n_layer=2, n_positions=64,
                                  bos_token_id=1, eos_token_id=2)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(root / "hf")
    convert(root / "hf", root / "wf", tensor_para_size=1, data_type="fp16")
    return str(root / "wf" / "1-gpu")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", help="converted <tp>-gpu directory")
    ap.add_argument("--save", help="write the scripted module here")
    ap.add_argument("--load", help="load a saved scripted module and run it")
    ap.add_argument("--dtype", default="fp16", choices=["fp32", "fp16", "bf16"])
    ap.add_argument("--self-test", action="store_true",
                    help="random tiny GPT-2: save here, load in a new process, compare")
    args = ap.parse_args(argv)
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    if args.self_test:
        with tempfile.TemporaryDirectory() as tmp:
            path = str(Path(tmp) / "gen.pt")
            first = save(tiny_checkpoint(Path(tmp)), path, dtype)
            res = subprocess.run([sys.executable, __file__, "--load", path], check=True,
                                 capture_output=True, text=True)
            print(res.stdout, end="")
            again = res.stdout.split("tokens ")[1].split(" lengths")[0]
            if again != str(first[:, 0].tolist()):
                print("self-test FAILED: the reloaded module produced other tokens")
                return 1
            print("self-test passed: same tokens after save and load in a new process")
        return 0
    if args.load:
        load(args.load)
        return 0
    if not (args.model_dir and args.save):
        ap.error("give --model-dir and --save, or --load, or --self-test")
    save(args.model_dir, args.save, dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
