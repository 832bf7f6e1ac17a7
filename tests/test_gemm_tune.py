"""GEMM tuning: the shape list mirrors the engine's GEMM calls; CLI argument rules; file format."""

from __future__ import annotations

import pytest

from warpformer.cli import main
from warpformer.gemm_tune import GemmShape, ModelDims, gemm_shapes


def test_shapes_gpt2_like() -> None:
    dims = ModelDims(hidden=1024, inter=4096, vocab=50257)
    shapes = gemm_shapes(dims, batch=8, beam=1, max_input_len=128)
    keys = {(s.m, s.n, s.k, s.transposed, s.epilogue, s.accumulate) for s in shapes}
    assert (1024, 3072, 1024, False, "none", False) in keys      # context QKV, 8 * 128 tokens
    assert (8, 4096, 1024, False, "none", False) in keys         # decode FFN in
    assert (8, 50257, 1024, True, "none", False) in keys         # lm_head [V, h] transposed
    assert len(keys) == len(shapes)                                # deduplicated


def test_shapes_follow_switches_and_tp() -> None:
    gptj = ModelDims(hidden=4096, inter=16384, vocab=50400, tensor_para_size=2,
                     parallel_residual=True, lm_head_bias=True)
    s = {(x.what, x.m): x for x in gemm_shapes(gptj, batch=1, beam=4, max_input_len=16)}
    assert s[("decode ffn out", 4)] == GemmShape(4, 4096, 8192, accumulate=True,
                                                 what="decode ffn out")
    assert s[("decode qkv", 4)].n == 3 * 2048
    assert s[("decode lm_head", 4)].epilogue == "bias"
    opt350 = ModelDims(hidden=1024, inter=4096, vocab=50272, word_embed_proj_dim=512, relu=True)
    t = {x.what: x for x in gemm_shapes(opt350, batch=2, beam=3, max_input_len=8)}
    assert t["context ffn in"].epilogue == "bias_relu"
    assert (t["decode project_out"].m, t["decode project_out"].n) == (6, 512)
    assert (t["decode lm_head"].n, t["decode lm_head"].k) == (50272, 512)
    assert t["context project_in"].m == 16


def test_cli_requires_dimensions(capsys) -> None:
    with pytest.raises(SystemExit, match="give --model-dir, or all of --head-num"):
        main(["gemm-tune", "--batch-size", "2"])
    with pytest.raises(SystemExit, match="--batch-size must be >= 1"):
        main(["gemm-tune", "--batch-size", "0", "--head-num", "2"])
