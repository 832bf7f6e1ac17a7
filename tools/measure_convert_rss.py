#!/usr/bin/env python
"""Measure the converter's peak resident memory on a GPT-J-6B-shaped checkpoint.

Builds a random ``GPTJForCausalLM``-shaped ``model.safetensors`` (28 layers, hidden 4096, vocab
50400: 6.05 B parameters, 12.1 GB in fp16) by streaming one tensor at a time (the model is never
materialised), converts it with ``python -m warpformer.converters`` in a child process, samples the
child's ``/proc/<pid>/status`` and prints its peak RSS next to the size of the largest tensor and
the RSS of a process that only imports the converter (the torch baseline).

    python tools/measure_convert_rss.py --workdir /work/rss-tmp [--processes 1] [--layers 28]

Needs about 2x the checkpoint size of free disk (checkpoint + output); both are deleted at the end
unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import torch

GIB = 2**30


def gptj_tensors(layers: int, h: int, vocab: int, inner: int) -> list[tuple[str, list[int]]]:
    """(name, shape) of every GPT-J tensor, in the order HF lists them."""
    out = [("transformer.wte.weight", [vocab, h])]
    for i in range(layers):
        p = f"transformer.h.{i}."
        out += [(p + "ln_1.weight", [h]), (p + "ln_1.bias", [h])]
        out += [(p + f"attn.{x}_proj.weight", [h, h]) for x in ("q", "k", "v", "out")]
        out += [(p + "mlp.fc_in.weight", [inner, h]), (p + "mlp.fc_in.bias", [inner]),
                (p + "mlp.fc_out.weight", [h, inner]), (p + "mlp.fc_out.bias", [h])]
    out += [("transformer.ln_f.weight", [h]), ("transformer.ln_f.bias", [h]),
            ("lm_head.weight", [vocab, h]), ("lm_head.bias", [vocab])]
    return out


def write_checkpoint(root: Path, layers: int) -> tuple[int, int, int]:
    """Write config.json + model.safetensors (fp16); returns (params, bytes, largest tensor)."""
    h, vocab, heads, inner = 4096, 50400, 16, 16384
    root.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["GPTJForCausalLM"], "model_type": "gptj", "n_embd": h,
              "n_head": heads, "n_layer": layers, "n_positions": 2048, "rotary_dim": 64,
              "vocab_size": vocab, "n_inner": None, "activation_function": "gelu_new",
              "layer_norm_epsilon": 1e-5, "bos_token_id": 50256, "eos_token_id": 50256,
              "tie_word_embeddings": False}
    (root / "config.json").write_text(json.dumps(config, indent=1))
    tensors = gptj_tensors(layers, h, vocab, inner)
    header, offset = {}, 0
    for name, shape in tensors:
        nbytes = 2 * int(torch.tensor(shape).prod())
        header[name] = {"dtype": "F16", "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    gen = torch.Generator().manual_seed(0)
    with open(root / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for _name, shape in tensors:
            rows = shape[0]
            step = max(1, (64 * 2**20) // max(1, 2 * int(torch.tensor(shape[1:]).prod())))
            for r in range(0, rows, step):  # 64 MiB at a time
                chunk = torch.randn([min(step, rows - r), *shape[1:]], generator=gen) * 0.02
                f.write(chunk.half().numpy().tobytes())
    params = sum(int(torch.tensor(s).prod()) for _, s in tensors)
    largest = max(2 * int(torch.tensor(s).prod()) for _, s in tensors)
    return params, offset, largest


def peak_rss(cmd: list[str]) -> tuple[int, int, float, int]:
    """Run ``cmd``; return (VmHWM bytes, max sampled RssAnon bytes, seconds, exit code)."""
    start = time.time()
    proc = subprocess.Popen(cmd)
    hwm = anon = 0
    status = Path(f"/proc/{proc.pid}/status")
    while proc.poll() is None:
        try:
            for line in status.read_text().splitlines():
                if line.startswith("VmHWM:"):
                    hwm = max(hwm, int(line.split()[1]) * 1024)
                elif line.startswith("RssAnon:"):
                    anon = max(anon, int(line.split()[1]) * 1024)
        except (FileNotFoundError, ProcessLookupError):
            break
        time.sleep(0.05)
    return hwm, anon, time.time() - start, proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/warpformer-rss"))
    ap.add_argument("--layers", type=int, default=28, help="28 = GPT-J-6B")
    ap.add_argument("--processes", type=int, default=1)
    ap.add_argument("--data-type", default="fp16", choices=("fp32", "fp16", "bf16"))
    ap.add_argument("--keep", action="store_true", help="keep checkpoint and output")
    args = ap.parse_args()

    ckpt, out = args.workdir / "gptj-ckpt", args.workdir / "gptj-out"
    shutil.rmtree(args.workdir, ignore_errors=True)
    t0 = time.time()
    params, nbytes, largest = write_checkpoint(ckpt, args.layers)
    print(f"checkpoint: {params / 1e9:.2f} B params, {nbytes / GIB:.2f} GiB fp16, largest tensor "
          f"{largest / 2**20:.0f} MiB, written in {time.time() - t0:.0f} s")
    base_hwm, base_anon, _, _ = peak_rss([sys.executable, "-c", "import warpformer.converters"])
    cmd = [sys.executable, "-m", "warpformer.converters", "--input-dir", str(ckpt),
           "--output-dir", str(out), "--tensor-para-size", "1", "--data-type", args.data_type,
           "--processes", str(args.processes), "--no-progress"]
    hwm, anon, secs, rc = peak_rss(cmd)
    print(f"import-only baseline: peak RSS {base_hwm / 2**20:.0f} MiB "
          f"(anon {base_anon / 2**20:.0f} MiB)")
    print(f"convert (tp 1, {args.data_type}, {args.processes} process(es)): exit {rc}, "
          f"{secs:.0f} s, peak RSS {hwm / 2**20:.0f} MiB (sampled anon peak "
          f"{anon / 2**20:.0f} MiB); pool workers, if any, are separate processes")
    if not args.keep:
        shutil.rmtree(args.workdir, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
