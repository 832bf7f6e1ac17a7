"""cuBLASLt Gemm against torch.matmul in float64, and the tuning file round trip."""

from __future__ import annotations

import warnings

import pytest
import torch

import warpformer  # noqa: F401
from warpformer.gemm_tune import ModelDims, gemm_shapes, tune, write_tuning_file

pytestmark = pytest.mark.gpu
ops = torch.ops.warpformer

# fp32 uses true fp32 (no TF32); the rest round the output once.
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("m,n,k", [(1, 3072, 1024), (7, 769, 96), (513, 4096, 1024),
                                   (64, 50257, 1024)])
@pytest.mark.parametrize("transposed", [False, True])
def test_gemm_matches_matmul(dtype, m, n, k, transposed):
    a = torch.randn(m, k, device="cuda").to(dtype)
    w = (torch.randn(n, k) if transposed else torch.randn(k, n)).cuda().to(dtype) / k ** 0.5
    b = torch.randn(n, device="cuda").to(dtype)
    ref = a.double() @ (w.double().t() if transposed else w.double()) + b.double()
    out = ops.gemm(a, w, b, transposed, "bias")
    err = float((out.double() - ref).abs().max() / ref.abs().max())
    assert err <= TOL[dtype], f"relative error {err:.2e}"
    if not transposed:
        relu = ops.gemm(a, w, b, False, "bias_relu")
        err = float((relu.double() - ref.clamp_min(0)).abs().max() / ref.abs().max())
        assert err <= TOL[dtype]


def test_tuning_file_round_trip(tmp_path):
    dims = ModelDims(hidden=1024, inter=4096, vocab=50257)
    shapes = gemm_shapes(dims, batch=4, beam=1, max_input_len=32)
    results = tune(shapes, torch.float16, max_algos=4, reps=3)
    assert len(results) == len(shapes)
    assert all(best <= heur * 1.0001 for _, _, best, heur in results)
    path = tmp_path / "gemm.tsv"
    write_tuning_file(str(path), "fp16", results)
    lines = path.read_text().splitlines()
    assert lines[0].startswith("# fingerprint gpu=") and len(lines) == 2 + len(results)

    # A model picks the file up; a missing file warns in one line and uses heuristics.
    import transformers

    from warpformer.converters import convert
    from warpformer.models.gpt import load_gpt_model

    cfg = transformers.GPT2Config(vocab_size=50257, n_embd=1024, n_head=16, n_layer=1,
                                  n_positions=64)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "hf")
    convert(tmp_path / "hf", tmp_path / "wf", 1, "fp16")
    tuned = load_gpt_model(tmp_path / "wf" / "1-gpu", max_batch=4, max_seq_len=64,
                           gemm_config=str(path))
    assert tuned.gemm_tuned_shapes() == len(results)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plain = load_gpt_model(tmp_path / "wf" / "1-gpu", max_batch=4, max_seq_len=64,
                               gemm_config=str(tmp_path / "missing.tsv"))
    assert plain.gemm_tuned_shapes() == 0
    assert any("not found; using cuBLASLt heuristics" in str(w.message) for w in caught)
    ids = torch.randint(0, 50257, (4, 32), dtype=torch.int32, device="cuda")
    lens = torch.full((4,), 32, dtype=torch.int32, device="cuda")
    a, _ = tuned.generate(ids, lens, 8)
    b, _ = plain.generate(ids, lens, 8)
    agree = float((a == b).float().mean())
    assert agree > 0.9  # different algorithms may round differently in fp16
