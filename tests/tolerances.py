"""The one per-dtype tolerance table for comparing warpformer kernels with fp32 references.

`atol`/`rtol` apply to element-wise kernels (norms, activations, embedding): the kernel computes
in fp32 and rounds once, so the bound is a few units in the last place of the output dtype.
Attention and GEMM-based results use the relative rule in `assert_close_to_ref` of the attention
tests (error at most 2x that of PyTorch in the same dtype).
"""

from __future__ import annotations

import torch

TOLERANCES: dict[torch.dtype, dict[str, float]] = {
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
    torch.bfloat16: {"atol": 1.6e-2, "rtol": 1.6e-2},
}

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    """Compare a kernel's output (any dtype) with a reference computed in float64 (or fp32) using
    the tolerance of the kernel's dtype."""
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(actual.double(), expected.double(), **tol)
