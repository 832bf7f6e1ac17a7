"""Raise an error from a warpformer op and print it (used to debug error translation on a new
torch/toolchain combination: run under cuda-gdb or gdb to get a native backtrace if it crashes)."""

import torch

import warpformer  # noqa: F401

try:
    torch.ops.warpformer.alibi_slopes(0)
except RuntimeError as exc:
    print("raised as expected:", str(exc).splitlines()[0])
