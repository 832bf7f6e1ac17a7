"""cuBLASLt Gemm against torch.matmul in float64, and the tuning file round trip."""

from __future__ import annotations

import warnings

import pytest
import torch
from _gemm_cases import gemv_case as _gemv_case
from _gemm_cases import norm_case as _norm_case
from _gemm_cases import rel_err as _rel_err

import warpformer  # noqa: F401
from warpformer.gemm_tune import collect_shapes, tune, write_tuning_file
from warpformer.options import EngineOptions

pytestmark = pytest.mark.gpu
EAGER = EngineOptions(cuda_graphs=False)  # prompts at their exact token counts
ops = torch.ops.warpformer

# fp32 uses true fp32 (no TF32); the rest round the output once.
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _tiny_gpt2(**kw) -> object:
    """A GPT-2 config of the tests' tiny models: vocabulary 1,000 unless given, ids 1 and 2."""
    import transformers

    return transformers.GPT2Config(**{"vocab_size": 1000, "bos_token_id": 1, "eos_token_id": 2,
                                      **kw})


def _checkpoint(tmp_path, cfg, dtype: str, hf=None) -> object:
    """Saves `hf` (or a random model of the HF config `cfg`) under tmp_path/hf and converts it for
    one GPU at `dtype` ("fp16" / "fp32"): the converted checkpoint's 1-gpu directory (its parent
    holds the config)."""
    import transformers

    from warpformer.converters import convert

    if hf is None:
        hf = transformers.AutoModelForCausalLM.from_config(cfg)
    hf.save_pretrained(tmp_path / "hf")
    convert(tmp_path / "hf", tmp_path / "wf", 1, dtype)
    return tmp_path / "wf" / "1-gpu"


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


ACTS = {
    "bias": lambda x: x,
    "bias_relu": lambda x: x.clamp_min(0),
    "bias_gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    "bias_gelu_erf": torch.nn.functional.gelu,
    "bias_silu": torch.nn.functional.silu,
}


def _tol(dtype, k):
    # fp32 results are not rounded, so the fp32 sum order shows: allow it to grow like sqrt(k).
    return TOL[dtype] * (max(1.0, (k / 1024) ** 0.5) if dtype == torch.float32 else 1.0)


# (n, k): a partial column tile (1000), the k-split over a thread-block cluster (1024 x 4096 and
# GPT-J's 4096 x 16384), few k per split (96), the QKV and MLP shapes of gpt2-medium.
@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("m", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("n,k", [(1000, 96), (1024, 4096), (3072, 1024), (4096, 16384),
                                 (8, 64)])
def test_gemv_matches_matmul(dtype, m, n, k):
    a, w, b, ref = _gemv_case(dtype, m, n, k, False)
    out = ops.gemm(a, w, b, False, "bias", "gemv")
    err = _rel_err(out, ref)
    assert err <= _tol(dtype, k), f"relative error {err:.2e}"
    again = ops.gemm(a, w, b, False, "bias", "gemv")
    assert torch.equal(out, again), "the GEMV must be deterministic"
    # The engine's path (first weight step loaded before the wait for the kernel ahead, the
    # second asked of L2): the same bits. The kernel just before it, the GEMV above, does not
    # write w.
    early = ops.gemm(a, w, b, False, "bias", "gemv_static")
    assert torch.equal(out, early), "loading the weight early must not change the result"


# From 3 rows the 16-bit types run on the tensor-core kernel: a partial last tile of weight rows
# (3, 1000, 250), k not a multiple of its 32-wide chunks (200) nor of its 4-chunk step (1032).
@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("m", [1, 2, 3, 4, 7, 8])
@pytest.mark.parametrize("n,k", [(50257, 1024), (3, 4096), (1000, 200), (250, 1032)])
def test_gemv_transposed_matches_matmul(dtype, m, n, k):
    a, w, b, ref = _gemv_case(dtype, m, n, k, True)
    out = ops.gemm(a, w, b, True, "bias", "gemv")
    err = _rel_err(out, ref)
    assert err <= _tol(dtype, k), f"relative error {err:.2e}"
    assert torch.equal(out, ops.gemm(a, w, b, True, "bias", "gemv")), "must be deterministic"
    # The engine's lm_head call (weight loads before the wait for the kernel ahead): same bits.
    assert torch.equal(out, ops.gemm(a, w, b, True, "bias", "gemv_static"))


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("epilogue", list(ACTS))
@pytest.mark.parametrize("backend", ["gemv", "cublaslt"])
def test_fused_epilogues_and_residual(dtype, epilogue, backend):
    m, n, k = 4, 2048, 1024
    a, w, b, ref = _gemv_case(dtype, m, n, k, False, seed=1)
    want = ACTS[epilogue](ref)
    out = ops.gemm(a, w, b, False, epilogue, backend)
    err = float((out.double() - want).abs().max() / want.abs().max())
    assert err <= 2 * TOL[dtype], f"{epilogue}: relative error {err:.2e}"
    if epilogue == "bias" or backend == "gemv":  # cuBLASLt accumulates without an activation
        res = torch.randn(m, n, device="cuda").to(dtype)
        out = ops.gemm(a, w, b, False, epilogue, backend, res)
        want2 = want + res.double()
        err = float((out.double() - want2).abs().max() / want2.abs().max())
        assert err <= 2 * TOL[dtype], f"{epilogue} + residual: relative error {err:.2e}"


def test_auto_backend_uses_gemv_where_it_measured_faster():
    # [k, n] weights: the GEMV's bits up to 2 rows, cuBLASLt's from 3 (for a 32 MiB weight; up to
    # 8 rows, smaller 16-bit ones take the tensor-core GEMV: test_gemv_tensor_cores.py); [n, k]:
    # GEMV up to 8 rows.
    a, w, b, _ = _gemv_case(torch.float16, 2, 4096, 4096, False)
    assert torch.equal(ops.gemm(a, w, b, False, "bias"), ops.gemm(a, w, b, False, "bias", "gemv"))
    a3, _, _, _ = _gemv_case(torch.float16, 3, 4096, 4096, False)
    assert torch.equal(ops.gemm(a3, w, b, False, "bias"),
                       ops.gemm(a3, w, b, False, "bias", "cublaslt"))
    a8, wt, bt, _ = _gemv_case(torch.float16, 8, 5000, 1024, True)
    assert torch.equal(ops.gemm(a8, wt, bt, True, "bias"),
                       ops.gemm(a8, wt, bt, True, "bias", "gemv"))
    a9, _, _, _ = _gemv_case(torch.float16, 9, 5000, 1024, True)
    assert torch.equal(ops.gemm(a9, wt, bt, True, "bias"),
                       ops.gemm(a9, wt, bt, True, "bias", "cublaslt"))


def test_gemv_backend_rejects_what_it_cannot_run():
    w = torch.randn(64, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(RuntimeError, match=r"backend 'gemv' needs input.shape\[0\] <= 8"):
        ops.gemm(torch.randn(9, 64, device="cuda", dtype=torch.float16), w, None, False, "none",
                 "gemv")
    with pytest.raises(RuntimeError, match="multiples of 8"):
        ops.gemm(torch.randn(2, 60, device="cuda", dtype=torch.float16),
                 torch.randn(60, 64, device="cuda", dtype=torch.float16), None, False, "none",
                 "gemv")
    with pytest.raises(RuntimeError,
                       match="backend must be one of auto, gemv, gemv_static, cublaslt"):
        ops.gemm(torch.randn(2, 64, device="cuda", dtype=torch.float16), w, None, False, "none",
                 "fast")
    with pytest.raises(RuntimeError, match="residual must have shape"):
        ops.gemm(torch.randn(2, 64, device="cuda", dtype=torch.float16), w, None, False, "none",
                 "auto", torch.zeros(3, 64, device="cuda", dtype=torch.float16))


def test_tuning_file_round_trip(tmp_path):
    import transformers

    from warpformer.models.gpt import load_gpt_model
    from warpformer.weights import read_config

    cfg = transformers.GPT2Config(vocab_size=50257, n_embd=1024, n_head=16, n_layer=1,
                                  n_positions=64)
    ckpt = _checkpoint(tmp_path, cfg, "fp16")
    shapes = collect_shapes(read_config(ckpt), batch=4, beam=1, max_input_len=32)
    assert shapes
    results = tune(shapes, torch.float16, max_algos=4, reps=3)
    assert len(results) == len(shapes)
    assert all(best <= heur * 1.0001 for _, _, best, heur in results)
    path = tmp_path / "gemm.tsv"
    write_tuning_file(str(path), "fp16", results)
    lines = path.read_text().splitlines()
    assert lines[0].startswith("# fingerprint gpu=") and len(lines) == 2 + len(results)

    # A model picks the file up; a missing file warns in one line and uses heuristics.
    tuned = load_gpt_model(ckpt, max_batch=4, max_seq_len=64,
                           options=EngineOptions(gemm_config=str(path)))
    assert tuned.gemm_tuned_shapes() == len(results)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plain = load_gpt_model(ckpt, max_batch=4, max_seq_len=64,
                               options=EngineOptions(gemm_config=str(tmp_path / "missing.tsv")))
    assert plain.gemm_tuned_shapes() == 0
    assert any("not found; using cuBLASLt heuristics" in str(w.message) for w in caught)
    # A line with an epilogue the engine does not know names its line and the rule.
    bad = tmp_path / "bad.tsv"
    bad.write_text(lines[0] + "\nfp16 4 3072 1024 0 bias_gelu 0 0\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        odd = load_gpt_model(ckpt, max_batch=4, max_seq_len=64,
                             options=EngineOptions(gemm_config=str(bad)))
    assert odd.gemm_tuned_shapes() == 0
    assert any("line 2 has unknown epilogue 'bias_gelu' (must be one of none, bias, "
               "bias_gelu_tanh, bias_relu); using cuBLASLt heuristics" in str(w.message)
               for w in caught), [str(w.message) for w in caught]
    ids = torch.randint(0, 50257, (4, 32), dtype=torch.int32, device="cuda")
    lens = torch.full((4,), 32, dtype=torch.int32, device="cuda")
    a, _ = tuned.generate(ids, lens, 8)
    b, _ = plain.generate(ids, lens, 8)
    agree = float((a == b).float().mean())
    assert agree > 0.9  # different algorithms may round differently in fp16


def test_benchmark_takes_stacked_weight_copies(monkeypatch):
    """gemm_benchmark times launches over copies stacked [copies, k, n] ([copies, n, k]
    transposed); tune() passes copies spanning cold_bytes and at least one launch per copy, and
    cold_bytes=0 times one copy."""
    a = torch.randn(8, 256, device="cuda", dtype=torch.float16)
    for transposed, shape in ((False, (3, 256, 512)), (True, (3, 512, 256))):
        w = torch.randn(*shape, device="cuda", dtype=torch.float16)
        t = ops.gemm_benchmark(a, w, None, transposed, "none", False, 4, 5)
        assert 1 <= t.numel() <= 4 and float(t[0]) > 0
    with pytest.raises(RuntimeError, match="weight must be 2-D, or 3-D"):
        ops.gemm_benchmark(a, torch.randn(1, 1, 256, 512, device="cuda", dtype=torch.float16),
                           None, False, "none", False, 4, 5)
    with pytest.raises(RuntimeError, match="weight must be 2-D, or 3-D"):
        ops.gemm_benchmark(a, torch.randn(0, 256, 512, device="cuda", dtype=torch.float16),
                           None, False, "none", False, 4, 5)
    with pytest.raises(RuntimeError, match="weight"):
        ops.gemm_benchmark(a, torch.randn(2, 128, 512, device="cuda", dtype=torch.float16),
                           None, False, "none", False, 4, 5)

    import warpformer.gemm_tune as gt

    seen = []
    real = ops.gemm_benchmark

    def recorder(inp, weight, *args):
        seen.append((tuple(weight.shape), args[-1]))
        return real(inp, weight, *args)

    monkeypatch.setattr(ops, "gemm_benchmark", recorder)
    shapes = [gt.GemmShape(8, 1024, 1024, what="decode"), gt.GemmShape(8, 1024, 1024, True)]
    cold = 8 * 2**20  # a 2 MiB weight: 4 copies
    gt.tune(shapes, torch.float16, max_algos=2, reps=3, cold_bytes=cold)
    gt.tune(shapes[:1], torch.float16, max_algos=2, reps=3, cold_bytes=0)
    gt.tune(shapes[:1], torch.float16, max_algos=2, reps=3)  # default: twice the L2 cache
    copies = gt.weight_copies(2 * 2**20, gt.default_cold_bytes())
    assert seen == [((4, 1024, 1024), 4), ((4, 1024, 1024), 4), ((1, 1024, 1024), 3),
                    ((copies, 1024, 1024), max(3, copies))]
    assert copies > 1  # every GPU this runs on has more than 1 MiB of L2


def test_plan_cache_keeps_the_most_recent_shapes(tmp_path):
    """A server meets a new GEMM m with every prompt length: the model's cuBLASLt plan cache stops
    at Gemm::kMaxPlans (1024) shapes, dropping the least recently used, and a dropped shape is
    planned again with the same result. (Exact prompt lengths: a prompt graph's padded count
    would give few m.)"""
    from warpformer.models.gpt import load_gpt_model

    cfg = _tiny_gpt2(n_embd=64, n_head=1, n_layer=1, n_positions=512)
    model = load_gpt_model(_checkpoint(tmp_path, cfg, "fp16"), max_batch=1, max_seq_len=512,
                           options=EAGER)
    ids = torch.randint(0, 1000, (1, 500), dtype=torch.int32, device="cuda")

    def logits(n: int) -> torch.Tensor:  # prefill of n tokens: GEMMs with m = n
        return model.forward(ids[:, :n].contiguous(),
                             torch.tensor([n], dtype=torch.int32, device="cuda"))

    first = logits(20).clone()
    counts = []
    for n in range(21, 501):
        logits(n)
        counts.append(model.gemm_cached_plans())
    assert counts[0] < 1024 and max(counts) == 1024 and counts[-1] == 1024, counts[::40]
    assert torch.equal(logits(20), first)  # dropped long ago, planned again


def test_new_row_counts_reuse_the_rounded_heuristic(tmp_path):
    """Each new prompt token count is a new GEMM m. Above 64 rows the engine asks cuBLASLt's
    heuristic once per m rounded up (to a multiple of 64 between 513 and 1024) and reuses that
    algorithm for every m it rounds to, after cuBLASLt has checked it for the exact shape: the
    prompts of 513 to 576 tokens make the heuristic queries of the first of them only, 577 makes
    new ones, and the logits of a reused algorithm match HF in fp32 and fp16."""
    import transformers

    from warpformer.models.gpt import load_gpt_model

    cfg = _tiny_gpt2(n_embd=128, n_head=2, n_layer=2, n_positions=1024)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    ckpt = _checkpoint(tmp_path, cfg, "fp32", hf=hf)
    hf = hf.cuda()
    ids = torch.randint(0, 1000, (1, 600), dtype=torch.int32, device="cuda")
    with torch.no_grad():
        ref = hf(ids[:, :540].long()).logits[0].float()
        ref_fp16 = hf.half()(ids[:, :540].long()).logits[0].float()
    span = float(ref.max() - ref.min())
    for dtype in (torch.float32, torch.float16):
        model = load_gpt_model(ckpt, dtype=dtype, max_batch=1, max_seq_len=600, options=EAGER)

        def logits(n: int, model=model) -> torch.Tensor:  # a prefill of n tokens: m = n
            return model.forward(ids[:, :n].contiguous(),
                                 torch.tensor([n], dtype=torch.int32, device="cuda"))[0]

        logits(513)
        first = model.gemm_heuristic_queries()
        assert first > 0
        for n in (514, 540, 575, 576):
            logits(n)
            assert model.gemm_heuristic_queries() == first, f"{n} tokens asked the heuristic"
        logits(577)
        assert model.gemm_heuristic_queries() > first
        err = float((logits(540).float() - ref).abs().max())
        if dtype == torch.float32:
            assert err <= 1e-4 * span, f"fp32: max err {err:.3e}, logit range {span:.3f}"
        else:
            err_hf = float((ref_fp16 - ref).abs().max())
            assert err <= 2 * err_hf + 2e-3 * float(ref.abs().max()), (
                f"fp16: ours {err:.3e} vs HF fp16 {err_hf:.3e}")


def test_tuned_rounded_row_counts_serve_every_prompt_length(tmp_path):
    """gemm-tune --prompt-rows tunes the rounded row counts of a range; a prompt of any length in
    it takes its products' algorithms from the file (through the count it rounds to), one plan
    per new length, and computes what the untuned model computes (fp16: within rounding)."""
    from warpformer.gemm_tune import row_buckets
    from warpformer.models.gpt import load_gpt_model
    from warpformer.weights import read_config

    ckpt = _checkpoint(tmp_path, _tiny_gpt2(n_embd=128, n_head=2, n_layer=2, n_positions=1024),
                       "fp16")
    assert row_buckets(513, 600) == [576, 640]
    shapes = collect_shapes(read_config(ckpt), batch=1, beam=1, max_input_len=16,
                            prompt_rows=(513, 600), cuda_graphs=False)
    assert {s.m for s in shapes if (s.n, s.k) == (384, 128)} == {16, 576, 640}
    path = tmp_path / "gemm.tsv"
    write_tuning_file(str(path), "fp16", tune(shapes, torch.float16, max_algos=4, reps=3))
    # Exact prompt lengths (no CUDA graphs): each new length is a new m.
    tuned = load_gpt_model(ckpt, max_batch=1, max_seq_len=700,
                           options=EngineOptions(cuda_graphs=False, gemm_config=str(path)))
    plain = load_gpt_model(ckpt, max_batch=1, max_seq_len=700, options=EAGER)
    ids = torch.randint(0, 1000, (1, 700), dtype=torch.int32, device="cuda")

    def logits(model, n: int) -> torch.Tensor:  # a prefill of n tokens: m = n
        return model.forward(ids[:, :n].contiguous(),
                             torch.tensor([n], dtype=torch.int32, device="cuda"))[0].float()

    assert tuned.gemm_tuned_plans() == 0
    for i, n in enumerate((530, 531, 600), start=1):
        a, b = logits(tuned, n), logits(plain, n)
        # the four layer products of a new prompt length, borrowed from 576's or 640's entries
        assert tuned.gemm_tuned_plans() == 4 * i, n
        torch.testing.assert_close(a, b, rtol=2e-3, atol=2e-3 * float(b.abs().max()))
    logits(tuned, 700)  # rounds to 704: not in the file, the heuristic's choice
    assert tuned.gemm_tuned_plans() == 12
    assert plain.gemm_tuned_plans() == 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_prefill_groups_follow_the_activation_budget(dtype, tmp_path):
    """A 1,024-wide model's prompt of 4 x 1,000 tokens runs as one group of 4,000 tokens in fp16
    (16 KiB of activations a token: 4,096-token groups fit GptModel::kPrefillActivationBytes),
    replayed as a prompt graph at 4,032 rows, and as two of 2,000 in fp32 (32 KiB a token:
    2,048); the prompt's products show it (their m is the group's row count)."""
    from warpformer.models.gpt import load_gpt_model

    ckpt = _checkpoint(tmp_path, _tiny_gpt2(n_embd=1024, n_head=16, n_layer=1, n_positions=1024),
                       "fp32")
    model = load_gpt_model(ckpt, dtype=dtype, max_batch=4, max_seq_len=1004)
    ids = torch.randint(3, 1000, (4, 1000), dtype=torch.int32, device="cuda")
    model.generate(ids, torch.full((4,), 1000, dtype=torch.int32, device="cuda"), 1)
    qkv_rows = {int(line.split()[1]) for line in model.gemm_plan_shapes()
                if line.split()[2] == "3072"}
    assert qkv_rows == ({4032} if dtype == torch.float16 else {2000}), (dtype, qkv_rows)
    # forward() computes a group's logits 2,048 rows at a time: the 4,000-token group's rows
    # (two chunks) equal each sequence scored alone (one chunk of 1,000), within rounding.
    lens = torch.full((4,), 1000, dtype=torch.int32, device="cuda")
    together = model.forward(ids, lens).float()
    for b in range(4):
        alone = model.forward(ids[b:b + 1].contiguous(), lens[b:b + 1])[0].float()
        scale = float(alone.abs().max())
        torch.testing.assert_close(together[b], alone, rtol=0, atol=2e-2 * scale + 1e-3,
                                   msg=f"{dtype} row {b}")


# ---- the GEMV that normalises its own input (norm_gemm) -----------------------------------------
def _norm_reference(x, res, ib, gamma, beta, norm, eps, w, b, act, dtype):
    """float64 reference; the normed rows are rounded to dtype before the product, as the
    engine stores them."""
    s = x.double()
    if ib is not None:
        s = s + ib.double()
    if res is not None:
        s = s + res.double()
    if norm == "layer_norm":
        var = s.var(-1, unbiased=False, keepdim=True)
        y = (s - s.mean(-1, keepdim=True)) / torch.sqrt(var + eps)
    else:
        y = s / torch.sqrt(s.pow(2).mean(-1, keepdim=True) + eps)
    y = y * gamma.double() + (beta.double() if beta is not None else 0.0)
    out = y.to(dtype).double() @ w.double() + b.double()
    return ACTS["bias_" + act if act != "identity" else "bias"](out), s, y


NORM_SHAPES = [(3072, 1024), (16384, 4096), (4096, 4096), (64, 96), (1000, 2048)]


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("m", [1, 2, 3, 8])
@pytest.mark.parametrize("n,k", NORM_SHAPES)
@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm"])
def test_norm_gemm_fused_is_bit_identical_and_accurate(dtype, m, n, k, norm):
    """The fused kernel (per-block statistics, normalised k-range in shared memory, the k-split
    cluster for the narrow shapes) against the norms kernel + GEMV: out, x and norm(x) bit for
    bit, and out against a float64 reference."""
    x, res, ib, gamma, beta, w, b = _norm_case(dtype, m, n, k, True, True, norm == "layer_norm")
    act = "gelu_tanh"
    try:
        fused = ops.norm_gemm(x, res, ib, gamma, beta, norm, 1e-5, w, b, act, "fused")
    except RuntimeError as e:
        # Wide products with little k-split hold many rows x k/ksplit values in shared memory;
        # beyond 48 KiB the fused backend must say so (the engine then runs the norms kernel).
        # The engine's decode rows (1-2) must always run fused.
        assert m > 2 and "backend 'fused' cannot run" in str(e), str(e)
        return
    unfused = ops.norm_gemm(x, res, ib, gamma, beta, norm, 1e-5, w, b, act, "unfused")
    for name, a, u in zip(("out", "x", "norm(x)"), fused, unfused, strict=True):
        assert torch.equal(a, u), f"{name}: fused differs from unfused"
    ref, s, y = _norm_reference(x, res, ib, gamma, beta, norm, 1e-5, w, b, act, dtype)
    assert _rel_err(fused[1], s) <= TOL[dtype]
    assert _rel_err(fused[2], y) <= 2 * TOL[dtype]
    err = _rel_err(fused[0], ref)
    assert err <= 2 * _tol(dtype, k), f"relative error {err:.2e}"


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("m", [1, 2, 3, 6])
@pytest.mark.parametrize("n,k", [(3072, 1024), (16384, 4096)])
def test_norm_gemm_outlier_rows_take_the_exact_pass(dtype, m, n, k):
    """Rows with a feature thousands of standard deviations out among their first columns (the
    shift of the one-reduction statistics then lies far from the mean, so the statistics need
    the second pass), next to ordinary rows: fused against unfused bit for bit, and accurate.
    (The second pass's accuracy is tested on the norms kernel in test_elementwise.py; here the
    two kernels must agree on it.)"""
    x, res, ib, gamma, beta, w, b = _norm_case(dtype, m, n, k, True, False, True)
    x[0, 2] = 5000.0
    if m > 1:  # from 2 rows the prologue's row groups: odd rows in the second
        x[1, 1] = 4000.0
    if m > 2:
        x[2, 0] = -5000.0
    if m > 5:  # several rows of each group (row 4 stays ordinary)
        x[3, 3] = -3000.0
        x[5, 1] = 3000.0
    try:
        fused = ops.norm_gemm(x, res, ib, gamma, beta, "layer_norm", 1e-5, w, b, "identity",
                              "fused")
    except RuntimeError as e:  # as in the test above: beyond 48 KiB of shared memory
        assert m > 2 and "backend 'fused' cannot run" in str(e), str(e)
        return
    unfused = ops.norm_gemm(x, res, ib, gamma, beta, "layer_norm", 1e-5, w, b, "identity",
                            "unfused")
    for name, a, u in zip(("out", "x", "norm(x)"), fused, unfused, strict=True):
        assert torch.equal(a, u), f"{name}: fused differs from unfused"
    ref, _, y = _norm_reference(x, res, ib, gamma, beta, "layer_norm", 1e-5, w, b, "identity",
                                dtype)
    assert _rel_err(fused[2], y) <= 2 * TOL[dtype]
    assert _rel_err(fused[0], ref) <= 2 * _tol(dtype, k)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("residual,input_bias,norm_bias", [(False, False, False),
                                                          (True, False, True),
                                                          (False, True, False)])
@pytest.mark.parametrize("act", ["identity", "relu", "silu"])
def test_norm_gemm_optional_inputs(dtype, residual, input_bias, norm_bias, act):
    x, res, ib, gamma, beta, w, b = _norm_case(dtype, 2, 3072, 1024, residual, input_bias,
                                               norm_bias)
    fused = ops.norm_gemm(x, res, ib, gamma, beta, "layer_norm", 1e-5, w, b, act, "fused")
    unfused = ops.norm_gemm(x, res, ib, gamma, beta, "layer_norm", 1e-5, w, b, act, "unfused")
    for a, u in zip(fused, unfused, strict=True):
        assert torch.equal(a, u)
    ref, _, _ = _norm_reference(x, res, ib, gamma, beta, "layer_norm", 1e-5, w, b, act, dtype)
    assert _rel_err(fused[0], ref) <= 2 * TOL[dtype]


def test_norm_gemm_fused_refuses_what_it_cannot_run():
    x, res, ib, gamma, beta, w, b = _norm_case(torch.float16, 9, 64, 1024, True, False, False)
    with pytest.raises(RuntimeError, match=r"norm_gemm: backend 'fused' cannot run m=9"):
        ops.norm_gemm(x, res, ib, gamma, beta, "layer_norm", 1e-5, w, b, "identity", "fused")
    # the unfused backend runs it (the product then on cuBLASLt)
    out, _, _ = ops.norm_gemm(x, res, ib, gamma, beta, "layer_norm", 1e-5, w, b, "identity",
                              "unfused")
    ref, _, _ = _norm_reference(x, res, ib, gamma, beta, "layer_norm", 1e-5, w, b, "identity",
                                torch.float16)
    assert _rel_err(out, ref) <= 2 * TOL[torch.float16]


def test_norm_gemm_opcheck():
    """torch.library.opcheck: schema, fake implementation and dispatch consistency."""
    x, res, ib, gamma, beta, w, b = _norm_case(torch.float16, 2, 256, 512, True, True, True)
    torch.library.opcheck(ops.norm_gemm.default,
                          (x, res, ib, gamma, beta, "layer_norm", 1e-5, w, b, "gelu", "fused"),
                          test_utils=("test_schema", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))


# ---- two products of one normalised input as one GEMV launch (norm_gemm_pair) ----------------
# (n, n2, k): GPT-J's QKV and MLP-in (12288 | 16384 of 4096), the same at TP=2, gpt2-medium-sized,
# NeoX-tiny-sized, partial column tiles (1000 | 40 of 96).
PAIR_SHAPES = [(12288, 16384, 4096), (6144, 8192, 4096), (3072, 4096, 1024), (768, 1024, 256),
               (1000, 40, 96)]


def _pair_case(dtype, m, n, n2, k, second_norm, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)

    def t(*shape, scale=1.0, offset=0.0):
        return (torch.randn(*shape, generator=g, device="cuda") * scale + offset).to(dtype)

    x, res, ib = t(m, k, offset=3.0), t(m, k, scale=2.0), t(k, scale=0.5)
    gamma, beta = t(k, scale=0.3, offset=1.0), t(k, scale=0.2)
    w, b = t(k, n, scale=k ** -0.5), t(n, scale=0.5)
    w2, b2 = t(k, n2, scale=k ** -0.5), t(n2, scale=0.5)
    gamma2, beta2 = (t(k, scale=0.3, offset=0.8), t(k, scale=0.2)) if second_norm else (None, None)
    return x, res, ib, gamma, beta, w, b, w2, b2, gamma2, beta2


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("m", [1, 2, 3, 8])
@pytest.mark.parametrize("n,n2,k", PAIR_SHAPES)
@pytest.mark.parametrize("second_norm", [False, True])
def test_norm_gemm_pair_joined_matches_reference(dtype, m, n, n2, k, second_norm):
    """QKV + MLP-in as one launch: each product against float64 (the second with its own norm
    weights, NeoX's ln2, or the first's, GPT-J's shared norm), x bit for bit against the separate
    products, and with one norm bit for bit against one product of the concatenated weight (the
    same column tiles and k-split)."""
    x, res, ib, gamma, beta, w, b, w2, b2, gamma2, beta2 = _pair_case(dtype, m, n, n2, k,
                                                                      second_norm, m + n + k)
    act2 = "gelu_tanh" if second_norm else "identity"
    args = (x, res, ib, gamma, beta, "layer_norm", 1e-5, w, b, "identity", w2, b2, act2, gamma2,
            beta2)
    try:
        joined = ops.norm_gemm_pair(*args, "joined")
    except RuntimeError as e:
        # Many rows of a wide k overflow the 48 KiB of shared memory (the engine then runs the
        # products one by one); the engine's decode rows (1-2) must always run joined.
        assert m > 2 and "backend 'joined' cannot run" in str(e), str(e)
        return
    separate = ops.norm_gemm_pair(*args, "separate")
    assert torch.equal(joined[2], separate[2]), "x differs"
    ref, s, _ = _norm_reference(x, res, ib, gamma, beta, "layer_norm", 1e-5, w, b, "identity",
                                dtype)
    ref2, _, _ = _norm_reference(x, res, ib, gamma2 if second_norm else gamma,
                                 beta2 if second_norm else beta, "layer_norm", 1e-5, w2, b2,
                                 act2, dtype)
    assert _rel_err(joined[2], s) <= TOL[dtype]
    for name, got, want in (("first", joined[0], ref), ("second", joined[1], ref2)):
        err = _rel_err(got, want)
        assert err <= 2 * _tol(dtype, k), f"{name} product: relative error {err:.2e}"
    tile = 8 * 16 // x.element_size()  # columns per GEMV tile
    # From 3 rows the concatenated product may run on the tensor-core GEMV
    # (test_gemv_tensor_cores.py), whose sums run in another order: bits compared at 1-2 rows.
    if not second_norm and n % tile == 0 and m <= 2:
        whole, _, _ = ops.norm_gemm(x, res, ib, gamma, beta, "layer_norm", 1e-5,
                                    torch.cat([w, w2], 1), torch.cat([b, b2]), "identity",
                                    "fused")
        assert torch.equal(joined[0], whole[:, :n]) and torch.equal(joined[1], whole[:, n:])


def test_norm_gemm_pair_refuses_what_it_cannot_run():
    x, res, ib, gamma, beta, w, b, w2, b2, _, _ = _pair_case(torch.float16, 9, 64, 64, 256,
                                                             False, 0)
    args = (x, res, ib, gamma, beta, "layer_norm", 1e-5, w, b, "identity", w2, b2, "relu")
    with pytest.raises(RuntimeError, match=r"norm_gemm_pair: backend 'joined' cannot run m=9, "
                                           r"n=64, n2=64, k=256 in float16"):
        ops.norm_gemm_pair(*args)
    out, out2, _ = ops.norm_gemm_pair(*args, None, None, "separate")  # runs (on cuBLASLt)
    ref2, _, _ = _norm_reference(x, res, ib, gamma, beta, "layer_norm", 1e-5, w2, b2, "relu",
                                 torch.float16)
    assert _rel_err(out2, ref2) <= 2 * TOL[torch.float16]
    w60 = torch.randn(256, 60, device="cuda", dtype=torch.float16)  # 60 columns: not 16 bytes
    with pytest.raises(RuntimeError, match=r"norm_gemm_pair: backend 'joined' cannot run m=2, "
                                           r"n=64, n2=60"):
        ops.norm_gemm_pair(x[:2], res[:2], ib, gamma, beta, "layer_norm", 1e-5, w, b,
                           "identity", w60, None, "identity")


def test_norm_gemm_pair_opcheck():
    x, res, ib, gamma, beta, w, b, w2, b2, gamma2, beta2 = _pair_case(torch.float16, 2, 128, 64,
                                                                      256, True, 1)
    torch.library.opcheck(ops.norm_gemm_pair.default,
                          (x, res, ib, gamma, beta, "layer_norm", 1e-5, w, b, "identity", w2, b2,
                           "gelu", gamma2, beta2, "joined"),
                          test_utils=("test_schema", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))


# ---- one GEMV launch for a sum of two products (gemm_sum) -------------------------------------
# (n, k, k2): GPT-J's attention-out + MLP-out (4096 | 16384 -> 4096) at TP=1 and TP=2,
# gpt2-medium-sized, partial column tiles (1000, 40), a short first depth (64).
SUM_SHAPES = [(4096, 4096, 16384), (4096, 2048, 8192), (1024, 1024, 4096), (1000, 96, 64),
              (40, 64, 4096)]


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("m", [1, 2, 3, 8])
@pytest.mark.parametrize("n,k,k2", SUM_SHAPES)
@pytest.mark.parametrize("backend", ["joined", "joined_ready"])
def test_gemm_sum_joined_matches_separate_and_reference(dtype, m, n, k, k2, backend):
    """x @ W + x2 @ W2 as one accumulation over both depths against float64 and the two products
    launched alone: the k-split clusters cross the boundary between the two matrices (joined), or
    each block takes whole steps of both, the second first (joined_ready, the engine's layout
    beside the attention)."""
    g = torch.Generator().manual_seed(m + n + k)
    x = torch.randn(m, k, generator=g).cuda().to(dtype)
    x2 = (torch.randn(m, k2, generator=g) + 0.5).cuda().to(dtype)
    w = (torch.randn(k, n, generator=g) * k ** -0.5).cuda().to(dtype)
    w2 = (torch.randn(k2, n, generator=g) * k2 ** -0.5).cuda().to(dtype)
    joined = ops.gemm_sum(x, w, x2, w2, backend)
    separate = ops.gemm_sum(x, w, x2, w2, "separate")
    ref = x.double() @ w.double() + x2.double() @ w2.double()
    assert _rel_err(joined, ref) <= 2 * _tol(dtype, k + k2)
    assert _rel_err(separate, ref) <= 3 * _tol(dtype, k + k2)
    # Each part counts: zeroing either input leaves the other product.
    first = ops.gemm_sum(x, w, torch.zeros_like(x2), w2, backend)
    assert _rel_err(first, x.double() @ w.double()) <= 2 * _tol(dtype, k)
    second = ops.gemm_sum(torch.zeros_like(x), w, x2, w2, backend)
    assert _rel_err(second, x2.double() @ w2.double()) <= 2 * _tol(dtype, k2)


def test_gemm_sum_ready_waits_for_the_kernel_ahead_before_the_first_input():
    """joined_ready streams input2 @ weight2 before waiting for the kernel ahead and reads input
    only after: here that kernel is a GEMV writing input (which lets its successor start early),
    into memory last filled with NaN, so a read before the wait would show."""
    g = torch.Generator(device="cuda").manual_seed(3)
    h, inter = 4096, 16384
    x0 = torch.randn(1, inter, generator=g, device="cuda").half()
    w0 = (torch.randn(inter, h, generator=g, device="cuda") * inter ** -0.5).half()
    w = (torch.randn(h, h, generator=g, device="cuda") * h ** -0.5).half()
    x2 = torch.randn(1, inter, generator=g, device="cuda").half()
    w2 = (torch.randn(inter, h, generator=g, device="cuda") * inter ** -0.5).half()
    x = ops.gemm(x0, w0, None, False, "none", "gemv")
    ref = x.double() @ w.double() + x2.double() @ w2.double()
    for _ in range(20):
        del x
        torch.full((1, h), float("nan"), device="cuda", dtype=torch.float16)  # freed: reused next
        x = ops.gemm(x0, w0, None, False, "none", "gemv")
        out = ops.gemm_sum(x, w, x2, w2, "joined_ready")
        assert _rel_err(out, ref) <= 2 * _tol(torch.float16, h + inter)


def test_gemm_sum_refuses_what_it_cannot_run():
    x = torch.randn(9, 64, device="cuda", dtype=torch.float16)
    w = torch.randn(64, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(RuntimeError, match=r"gemm_sum: backend 'joined' cannot run m=9, n=64, "
                                           r"k=64, k2=64 in float16: it needs at most 8 rows"):
        ops.gemm_sum(x, w, x, w)
    w60 = torch.randn(64, 60, device="cuda", dtype=torch.float16)
    with pytest.raises(RuntimeError, match=r"gemm_sum: backend 'joined' cannot run m=2, n=60"):
        ops.gemm_sum(x[:2], w60, x[:2], w60)
    out = ops.gemm_sum(x, w, x, w, "separate")  # the separate backend runs it (cuBLASLt)
    assert _rel_err(out, 2 * (x.double() @ w.double())) <= 2 * TOL[torch.float16]


def test_gemm_sum_opcheck():
    x = torch.randn(2, 256, device="cuda", dtype=torch.float16)
    w = torch.randn(256, 128, device="cuda", dtype=torch.float16)
    torch.library.opcheck(ops.gemm_sum.default, (x, w, x[:, :64].contiguous(), w[:64]),
                          test_utils=("test_schema", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))
