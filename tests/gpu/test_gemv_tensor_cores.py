"""The [k, n] GEMV of 3-8 rows on tensor cores (kernels/gemv_kn_mma.cuh): against float64
references, bit for bit between its plain and normalising launches, deterministic, chosen by the
engine's policy exactly where kernels::gemv_kn_tensor_cores says, and in a decode step of a model
whose products it runs."""

from __future__ import annotations

import pytest
import torch
import transformers
from _gemm_cases import gemv_case, norm_case, rel_err
from _models import hf_greedy, make_hf

import warpformer  # noqa: F401
from warpformer.converters import convert
from warpformer.models.gpt import load_gpt_model
from warpformer.weights import read_config

pytestmark = pytest.mark.gpu
ops = torch.ops.warpformer

HALF = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
KERNEL = "gemv_kn_mma_kernel"
TC_NORM_ROWS = 6  # Gemm::kTensorCoreNormRows: the policy's most rows for the normalising launch

# (n, k) and the split they get: 1,024-row chunks without a split (3072 x 1024), 512-row chunks
# in pairs (1024 x 1024: 16 tiles), four 1,024-row chunks (1024 x 4096), 256-row chunks split 8
# ways (64 x 2048: one tile), three 256-row chunks (192 x 768: k not a multiple of 512).
SHAPES = [(3072, 1024), (1024, 1024), (1024, 4096), (64, 2048), (192, 768)]


def _kernels_run(fn) -> set[str]:
    """Names of the CUDA kernels `fn` launches."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}


def _ran_tensor_cores(fn) -> bool:
    return any(KERNEL in name for name in _kernels_run(fn))


@pytest.mark.parametrize("dtype", list(HALF))
@pytest.mark.parametrize("m", [3, 4, 5, 8])
@pytest.mark.parametrize("n,k", SHAPES)
def test_matches_matmul_and_is_deterministic(dtype, m, n, k):
    a, w, b, ref = gemv_case(dtype, m, n, k, False)
    out = ops.gemm(a, w, b, False, "bias", "gemv")
    err = rel_err(out, ref)
    assert err <= HALF[dtype], f"relative error {err:.2e}"
    assert torch.equal(out, ops.gemm(a, w, b, False, "bias", "gemv")), "must be deterministic"
    # The engine's call stages the weight before its wait for the kernel ahead: the same bits.
    assert torch.equal(out, ops.gemm(a, w, b, False, "bias", "gemv_static"))
    assert _ran_tensor_cores(lambda: ops.gemm(a, w, b, False, "bias", "gemv"))


@pytest.mark.parametrize("dtype", list(HALF))
@pytest.mark.parametrize("epilogue", ["bias_gelu_tanh", "bias_relu", "bias_silu", "bias_gelu_erf"])
def test_epilogues_and_accumulate(dtype, epilogue):
    m, n, k = 6, 4096, 1024
    a, w, b, ref = gemv_case(dtype, m, n, k, False, seed=1)
    act = {"bias_gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
           "bias_relu": lambda x: x.clamp_min(0), "bias_silu": torch.nn.functional.silu,
           "bias_gelu_erf": torch.nn.functional.gelu}[epilogue]
    want = act(ref)
    out = ops.gemm(a, w, b, False, epilogue, "gemv")
    assert rel_err(out, want) <= 2 * HALF[dtype]
    res = torch.randn(m, n, device="cuda").to(dtype)
    out = ops.gemm(a, w, b, False, epilogue, "gemv", res)
    assert rel_err(out, want + res.double()) <= 2 * HALF[dtype]


@pytest.mark.parametrize("dtype", list(HALF))
@pytest.mark.parametrize("m", [3, 7, 8])
@pytest.mark.parametrize("n,k", [(3072, 1024), (4096, 1024), (192, 768)])
@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm"])
def test_normalising_launch_matches_norm_then_product(dtype, m, n, k, norm):
    """launch_gemv_normed on the tensor-core kernel against the norms kernel followed by the
    plain tensor-core launch: out, x and norm(x) bit for bit; out against float64."""
    x, res, ib, gamma, beta, w, b = norm_case(dtype, m, n, k, True, True, True)
    if norm == "rms_norm":
        beta = None
    fused = ops.norm_gemm(x, res, ib, gamma, beta, norm, 1e-5, w, b, "gelu_tanh", "fused")
    unfused = ops.norm_gemm(x, res, ib, gamma, beta, norm, 1e-5, w, b, "gelu_tanh", "unfused")
    for name, f, u in zip(("out", "x", "norm(x)"), fused, unfused, strict=True):
        assert torch.equal(f, u), f"{name}: fused differs from unfused"
    s = x.double() + res.double() + ib.double()
    if norm == "layer_norm":
        y = (s - s.mean(-1, keepdim=True)) / torch.sqrt(s.var(-1, unbiased=False, keepdim=True)
                                                         + 1e-5)
    else:
        y = s / torch.sqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5)
    y = y * gamma.double() + (beta.double() if beta is not None else 0.0)
    ref = torch.nn.functional.gelu(y.to(dtype).double() @ w.double() + b.double(),
                                   approximate="tanh")
    assert rel_err(fused[0], ref) <= 2 * HALF[dtype]
    assert _ran_tensor_cores(
        lambda: ops.norm_gemm(x, res, ib, gamma, beta, norm, 1e-5, w, b, "gelu_tanh", "fused"))


@pytest.mark.parametrize("dtype", list(HALF))
@pytest.mark.parametrize("m", [5, 8])
@pytest.mark.parametrize("n,k", [(3072, 1024), (192, 768)])
def test_normalising_launch_outlier_rows(dtype, m, n, k):
    """Rows whose statistics need the second pass (a feature thousands of standard deviations
    out among the first columns) beside ordinary rows (row 3), in both row groups of the
    prologue (both shapes make two: even rows in the first, odd in the second): fused against
    unfused bit for bit, and norm(x) accurate. A second pass skipped or misapplied moves the
    statistics by only ~1e-6 relative, which flips a few output roundings per row: hence an
    outlier in every other row, so that several rows of each group must come out right."""
    x, res, ib, gamma, beta, w, b = norm_case(dtype, m, n, k, True, False, True)
    for r in range(m):
        if r != 3:
            x[r, r % 8] = (5000.0 - 500.0 * r) * (1 if r % 2 == 0 else -1)
    fused = ops.norm_gemm(x, res, ib, gamma, beta, "layer_norm", 1e-5, w, b, "identity", "fused")
    unfused = ops.norm_gemm(x, res, ib, gamma, beta, "layer_norm", 1e-5, w, b, "identity",
                            "unfused")
    for name, f, u in zip(("out", "x", "norm(x)"), fused, unfused, strict=True):
        assert torch.equal(f, u), f"{name}: fused differs from unfused"
    s = x.double() + res.double()
    y = (s - s.mean(-1, keepdim=True)) / torch.sqrt(s.var(-1, unbiased=False, keepdim=True)
                                                     + 1e-5)
    y = y * gamma.double() + beta.double()
    assert rel_err(fused[2], y) <= 2 * HALF[dtype]


def test_auto_policy_takes_tensor_cores_where_they_run():
    """backend 'auto' (the engine's policy): the tensor-core GEMV's bits at 3-8 rows of an
    eligible shape; cuBLASLt's past 8 rows, for fp32, and for a weight over 16 MiB."""
    for m in (3, 8):
        a, w, b, _ = gemv_case(torch.float16, m, 3072, 1024, False)
        auto = ops.gemm(a, w, b, False, "bias")
        assert torch.equal(auto, ops.gemm(a, w, b, False, "bias", "gemv"))
        assert _ran_tensor_cores(lambda: ops.gemm(a, w, b, False, "bias"))  # noqa: B023
    a, w, b, _ = gemv_case(torch.float16, 9, 3072, 1024, False)
    assert not _ran_tensor_cores(lambda: ops.gemm(a, w, b, False, "bias"))
    a, w, b, _ = gemv_case(torch.float32, 8, 3072, 1024, False)
    assert not _ran_tensor_cores(lambda: ops.gemm(a, w, b, False, "bias"))
    a, w, b, _ = gemv_case(torch.float16, 8, 4096, 4096, False)  # 32 MiB
    assert not _ran_tensor_cores(lambda: ops.gemm(a, w, b, False, "bias"))
    auto = ops.gemm(a, w, b, False, "bias")
    assert torch.equal(auto, ops.gemm(a, w, b, False, "bias", "cublaslt"))


def test_memcheck_tensor_core_launches():
    """Every split the kernel takes (one block of 1,024 rows, 2 x 512, 4 x 1,024, 8 x 256,
    3 x 256), plain, staged before the wait, and normalising, at 3, 5 and 8 rows: accurate and
    fused == unfused. Runs under compute-sanitizer in tools/gpu_check.sh (no profiler here:
    CUPTI and the sanitizer do not run together)."""
    for dtype in HALF:
        for m in (3, 5, 8):
            for n, k in SHAPES:
                a, w, b, ref = gemv_case(dtype, m, n, k, False, seed=m)
                for backend in ("gemv", "gemv_static"):
                    assert rel_err(ops.gemm(a, w, b, False, "bias", backend), ref) <= HALF[dtype]
                x, res, ib, gamma, beta, _, _ = norm_case(dtype, m, n, k, True, True, True, seed=m)
                args = (x, res, ib, gamma, beta, "layer_norm", 1e-5, w, b, "relu")
                fused = ops.norm_gemm(*args, "fused")
                unfused = ops.norm_gemm(*args, "unfused")
                assert all(torch.equal(f, u) for f, u in zip(fused, unfused, strict=True))


@pytest.fixture(scope="module")
def gpt2_256(tmp_path_factory):
    """A GPT-2 of width 256 (its four products eligible), converted to fp32 on disk."""
    cfg = transformers.GPT2Config(vocab_size=1000, n_embd=256, n_head=4, n_layer=2,
                                  n_positions=512, bos_token_id=1, eos_token_id=2)
    hf = make_hf(cfg, seed=7, peak=4.0)
    root = tmp_path_factory.mktemp("tc")
    hf.save_pretrained(root / "hf")
    convert(root / "hf", root / "wf", tensor_para_size=1, data_type="fp32")
    return hf, root / "wf" / "1-gpu"


@pytest.mark.parametrize("batch", [3, TC_NORM_ROWS, TC_NORM_ROWS + 1, 8])
def test_decode_steps_run_on_tensor_cores_and_follow_hf(gpt2_256, batch):
    """A batch of 3, 6, 7 or 8 in fp16: every decode step's layer products run on the tensor-core
    GEMV (none of them on cuBLASLt), normalising their own input up to TC_NORM_ROWS rows and
    after the norms kernel past them, and each row's greedy tokens follow HF's fp32 greedy loop
    for at least the first 8 (the fp16 agreement test's bar)."""
    hf, path = gpt2_256
    end_id = read_config(path).end_id
    model = load_gpt_model(path, dtype=torch.float16, max_batch=8, max_seq_len=128)
    gen = torch.Generator().manual_seed(5)
    lengths = [11 + 3 * b for b in range(batch)]
    ids = torch.randint(3, 1000, (batch, max(lengths)), generator=gen, dtype=torch.int32)
    lens = torch.tensor(lengths, dtype=torch.int32)
    out, _ = model.generate(ids.cuda(), lens.cuda(), 24, end_id=999 if end_id != 999 else 998)
    names = _kernels_run(lambda: model.generate(ids.cuda(), lens.cuda(), 4))
    assert any(KERNEL in n for n in names), sorted(names)
    normalising = any(f"{KERNEL}<__half, {batch}, true>" in n for n in names)
    assert normalising == (batch <= TC_NORM_ROWS), sorted(names)
    # Only the prompt's products (more than 8 rows) remain on cuBLASLt: its plans list no
    # decode-sized row count.
    decode_rows = {int(line.split()[1]) for line in model.gemm_plan_shapes()}
    assert batch not in decode_rows, sorted(decode_rows)
    for b, n in enumerate(lengths):
        ref = hf_greedy(hf, ids[b].cuda(), n, 24)
        got = out[b, 0, n:n + 24].tolist()
        first_diff = next((i for i, (x, y) in enumerate(zip(got, ref, strict=True)) if x != y),
                          len(ref))
        assert first_diff >= 8, f"row {b}: fp16 diverged from HF at token {first_diff}"
