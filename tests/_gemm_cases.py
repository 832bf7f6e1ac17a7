"""Inputs and error measure shared by the GPU product tests (test_gemm.py,
test_gemv_tensor_cores.py)."""

from __future__ import annotations

import torch


def gemv_case(dtype, m, n, k, transposed, seed=0):
    """a [m, k], w ([k, n], or [n, k] when transposed, scaled by k^-1/2), b [n] of dtype on the
    GPU, and the float64 reference a @ w + b."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g).cuda().to(dtype)
    w = (torch.randn(n, k, generator=g) if transposed else torch.randn(k, n, generator=g))
    w = (w / k ** 0.5).cuda().to(dtype)
    b = torch.randn(n, generator=g).cuda().to(dtype)
    ref = a.double() @ (w.double().t() if transposed else w.double()) + b.double()
    return a, w, b, ref


def rel_err(out, ref):
    """max |out - ref| over max |ref|."""
    return float((out.double() - ref).abs().max() / ref.abs().max())


def norm_case(dtype, m, n, k, residual, input_bias, norm_bias, seed=0):
    """x (offset 3, as a residual stream), residual, input bias, gamma, beta, w [k, n], b [n]
    of dtype on the GPU; the optional ones None when not asked for."""
    g = torch.Generator().manual_seed(seed)

    def t(*shape, scale=1.0, offset=0.0):
        return (torch.randn(*shape, generator=g) * scale + offset).cuda().to(dtype)

    x = t(m, k, offset=3.0)  # a common offset, as a residual stream has
    res = t(m, k, scale=2.0) if residual else None
    ib = t(k, scale=0.5) if input_bias else None
    gamma = t(k, scale=0.3, offset=1.0)
    beta = t(k, scale=0.2) if norm_bias else None
    w = t(k, n, scale=k ** -0.5)
    b = t(n, scale=0.5)
    return x, res, ib, gamma, beta, w, b
