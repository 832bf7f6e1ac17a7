"""End-to-end parity of the C++ GPT engine (torch.classes.warpformer.GptModel) with HuggingFace,
for every architecture: randomly initialised HF models are saved, converted with
warpformer.converters, loaded onto the GPU and compared.

- logits in fp32: max |ours - HF| <= 1e-4 of HF's logit range;
- logits in fp16/bf16: error against HF fp32 at most 2x HF's own error in that dtype (+ floor);
- greedy generation: token for token equal to HF's greedy loop in fp32 on peaked models;
- ragged batches equal per-row runs; memory flat across 1,000 calls; clear errors that leave the
  instance usable.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from _models import ENGINE_TINY, hf_greedy, make_hf

import warpformer  # noqa: F401
from warpformer.converters import convert
from warpformer.models.gpt import build_gpt_model, load_gpt_model
from warpformer.options import EngineOptions
from warpformer.weights import load_weights, read_config

pytestmark = pytest.mark.gpu

TINY = ENGINE_TINY

# Real widths (gpt2-medium, bloom-560m, opt-1.3b, gpt-j-6b, pythia-2.8b) with 2 layers, so the
# GEMM shapes, head counts and rotary widths of the real models are exercised in little time.
REAL = {
    "gpt2-medium": lambda: transformers.GPT2Config(n_embd=1024, n_head=16, n_layer=2),
    "bloom-560m": lambda: transformers.BloomConfig(vocab_size=250880, hidden_size=1024, n_head=16,
                                                   n_layer=2),
    "opt-1.3b": lambda: transformers.OPTConfig(hidden_size=2048, num_attention_heads=32,
                                               num_hidden_layers=2, ffn_dim=8192,
                                               word_embed_proj_dim=2048),
    "gpt-j-6b": lambda: transformers.GPTJConfig(n_embd=4096, n_head=16, n_layer=2, rotary_dim=64),
    "pythia-2.8b": lambda: transformers.GPTNeoXConfig(
        vocab_size=50304, hidden_size=2560, num_attention_heads=32, num_hidden_layers=2,
        intermediate_size=10240, rotary_pct=0.25, use_parallel_residual=True),
}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("engine")


_converted: dict[tuple, tuple] = {}


def converted(name: str, table: dict, workdir: Path, peak: float = 1.0):
    """(hf model, converted dir) for a config, converted once per module (fp32 on disk)."""
    key = (name, peak)
    if key not in _converted:
        hf = make_hf(table[name](), seed=len(_converted), peak=peak)
        src = workdir / f"{name}-{peak}-hf"
        hf.save_pretrained(src)
        out = workdir / f"{name}-{peak}-wf"
        convert(src, out, tensor_para_size=1, data_type="fp32")
        _converted[key] = (hf, out / "1-gpu")
    return _converted[key]


def random_batch(vocab: int, lengths: list[int], seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    S = max(lengths)
    ids = torch.randint(3, vocab, (len(lengths), S), generator=gen, dtype=torch.int32)
    for b, n in enumerate(lengths):
        ids[b, n:] = 0
    return ids.cuda(), torch.tensor(lengths, dtype=torch.int32, device="cuda")


def hf_logits_padded(hf, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """HF logits row by row (no padding inside HF), fp32, [B, S, V] with zeros past lengths."""
    B, S = ids.shape
    out = None
    with torch.no_grad():
        for b in range(B):
            n = int(lengths[b])
            lg = hf(input_ids=ids[b:b + 1, :n].long(), use_cache=False).logits.float()
            if out is None:
                out = torch.zeros(B, S, lg.shape[-1], device="cuda")
            out[b, :n] = lg[0]
    return out


def masked_err(a: torch.Tensor, b: torch.Tensor, lengths: torch.Tensor) -> float:
    mask = torch.arange(a.shape[1], device=a.device)[None] < lengths[:, None]
    return float((a.float() - b.float()).abs()[mask].max())


@pytest.mark.parametrize("name", list(TINY))
def test_logits_match_hf_fp32(name, workdir):
    hf, path = converted(name, TINY, workdir)
    model = load_gpt_model(path, dtype=torch.float32, max_batch=4, max_seq_len=256)
    ids, lengths = random_batch(hf.config.vocab_size, [5, 17, 1, 64])
    ref = hf_logits_padded(hf, ids, lengths)
    ours = model.forward(ids, lengths)
    assert ours.dtype == torch.float32 and ours.shape == ref.shape
    span = float(ref.max() - ref.min())
    err = masked_err(ours, ref, lengths)
    assert err <= 1e-4 * span, f"{name}: max err {err:.3e} > 1e-4 x logit range {span:.3f}"
    # Padded positions are zeroed.
    assert float(ours[2, 1:].abs().max()) == 0.0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", list(TINY))
def test_logits_half_precision_within_2x_hf(name, dtype, workdir):
    hf, path = converted(name, TINY, workdir)
    ids, lengths = random_batch(hf.config.vocab_size, [9, 33])
    ref = hf_logits_padded(hf, ids, lengths)
    hf_low = hf_logits_padded(hf.to(dtype), ids, lengths)
    hf.float()
    model = load_gpt_model(path, dtype=dtype, max_batch=2, max_seq_len=128)
    ours = model.forward(ids, lengths)
    assert ours.dtype == dtype
    err_ours, err_hf = masked_err(ours, ref, lengths), masked_err(hf_low, ref, lengths)
    floor = 2e-3 if dtype == torch.float16 else 2e-2
    assert err_ours <= 2 * err_hf + floor * float(ref.abs().max()), (
        f"{name} {dtype}: ours {err_ours:.3e} vs HF {err_hf:.3e}")


@pytest.mark.parametrize("name", list(REAL))
def test_real_shapes_logits(name, workdir):
    hf, path = converted(name, REAL, workdir)
    ids, lengths = random_batch(hf.config.vocab_size, [40, 7])
    ref = hf_logits_padded(hf, ids, lengths)
    model = load_gpt_model(path, dtype=torch.float32, max_batch=2, max_seq_len=128)
    err = masked_err(model.forward(ids, lengths), ref, lengths)
    span = float(ref.max() - ref.min())
    assert err <= 1e-4 * span, f"{name}: fp32 err {err:.3e} vs range {span:.3f}"
    hf_half = hf_logits_padded(hf.half(), ids, lengths)
    hf.float()
    model16 = load_gpt_model(path, dtype=torch.float16, max_batch=2, max_seq_len=128)
    err16 = masked_err(model16.forward(ids, lengths), ref, lengths)
    err_hf = masked_err(hf_half, ref, lengths)
    assert err16 <= 2 * err_hf + 2e-3 * float(ref.abs().max()), (
        f"{name}: fp16 err {err16:.3e} vs HF fp16 {err_hf:.3e}")
    del model, model16
    torch.cuda.empty_cache()


def first_end(tokens: list[int], end_id: int) -> list[int]:
    return tokens[: tokens.index(end_id) + 1] if end_id in tokens else tokens


@pytest.mark.parametrize("name", list(TINY))
def test_greedy_matches_hf(name, workdir):
    hf, path = converted(name, TINY, workdir, peak=4.0)
    end_id = read_config(path).end_id
    model = load_gpt_model(path, dtype=torch.float32, max_batch=2, max_seq_len=256)
    ids, lengths = random_batch(hf.config.vocab_size, [12, 5], seed=3)
    out, seq_len = model.generate(ids, lengths, 64)
    for b in range(2):
        n = int(lengths[b])
        ref = first_end(hf_greedy(hf, ids[b], n, 64), end_id)
        ours = out[b, 0, n:].tolist()
        assert ours[: len(ref)] == ref, f"{name} row {b}: tokens differ"
        assert int(seq_len[b, 0]) == n + len(ref)
        assert all(t == end_id for t in ours[len(ref):])
        assert out[b, 0, :n].tolist() == ids[b, :n].tolist()


# An odd vocabulary, as GPT-2's 50,257: logits rows of 2-byte alignment.
ODD = {
    "gpt2-odd-vocab": lambda: transformers.GPT2Config(
        vocab_size=1001, n_embd=128, n_head=2, n_layer=2, n_positions=512, bos_token_id=1,
        eos_token_id=2),
    "gptj-odd-vocab": lambda: transformers.GPTJConfig(  # an untied head with a bias
        vocab_size=1001, n_embd=256, n_head=4, n_layer=2, rotary_dim=32, n_positions=512,
        bos_token_id=1, eos_token_id=2),
}


@pytest.mark.parametrize("rows", [2, 12])
def test_odd_vocabulary_greedy_matches_hf(rows, workdir):
    """An odd vocabulary's lm_head, on the [n, k] GEMV up to 8 rows and on cuBLASLt past them
    (whose plan shows at 12 rows): greedy tokens equal HF's greedy loop token for token in fp32,
    and forward's logits match HF's."""
    hf, path = converted("gpt2-odd-vocab", ODD, workdir, peak=4.0)
    end_id = read_config(path).end_id
    model = load_gpt_model(path, dtype=torch.float32, max_batch=rows, max_seq_len=256)
    lengths = [12, 5, 9, 1, 7, 3, 12, 8, 2, 11, 6, 4][:rows]
    ids, lens = random_batch(1001, lengths, seed=5)
    out, seq_len = model.generate(ids, lens, 24)
    for b in range(rows):
        n = int(lens[b])
        ref = first_end(hf_greedy(hf, ids[b], n, 24), end_id)
        ours = out[b, 0, n:].tolist()
        assert ours[: len(ref)] == ref, f"{rows} rows, row {b}: tokens differ"
        assert int(seq_len[b, 0]) == n + len(ref)
    # The head multiplies 1,008 columns, the vocabulary padded to a multiple of 8.
    lm_head = [line for line in model.gemm_plan_shapes()
               if line.split()[2:5] == ["1008", "128", "1"]]
    assert (rows > 8) == any(line.split()[1] == str(rows) for line in lm_head), lm_head
    logits = model.forward(ids, lens)
    assert logits.shape[-1] == 1001
    ref = hf_logits_padded(hf, ids, lens)
    span = float(ref.max() - ref.min())
    assert masked_err(logits, ref, lens) <= 1e-4 * span
    # fp16 rows of 2,002 bytes scatter from the 1,008-wide logits in 2-byte words.
    half = load_gpt_model(path, dtype=torch.float16, max_batch=rows, max_seq_len=256)
    low = half.forward(ids, lens)
    assert low.dtype == torch.float16 and low.shape[-1] == 1001
    assert masked_err(low.float(), ref, lens) <= 1e-2 * span


def built_with_growth(config, weight_sets, dtype, max_batch, max_seq_len):
    """(models, bytes of GPU memory each one's construction allocated) for models built from each
    of ``weight_sets``, after a first instance built from the first set and dropped, which makes
    any one-time allocation, so that the measured ones grow alike."""
    def build(weights):
        return build_gpt_model(config, weights, dtype=dtype, max_batch=max_batch,
                               max_seq_len=max_seq_len)

    build(weight_sets[0])  # dropped at once
    models, grew = [], []
    for weights in weight_sets:
        before = torch.cuda.memory_allocated()
        models.append(build(weights))
        grew.append(torch.cuda.memory_allocated() - before)
    return models, grew


def test_odd_vocabulary_head_in_place_or_copied(workdir):
    """load_weights' wte carries the padding rows to 1,008 in its storage and the engine's head
    uses it in place: with NaN in those rows (no padding logit may be read) greedy and sampled
    tokens and forward's logits equal those of a model given an exact [1001, e] copy, which the
    engine pads by copying (one head's size more memory)."""
    hf, path = converted("gpt2-odd-vocab", ODD, workdir, peak=4.0)
    config = read_config(path)
    weights = load_weights(path, dtype=torch.float32, device="cuda")
    wte = weights["wte"]
    torch.as_strided(wte, (1008, 128), wte.stride(), wte.storage_offset())[1001:].fill_(
        float("nan"))
    exact = dict(weights, wte=wte.clone())
    assert exact["wte"].untyped_storage().nbytes() == 1001 * 128 * 4
    models, grew = built_with_growth(config, (weights, exact), torch.float32, 12, 256)
    assert 1008 * 128 * 4 <= grew[1] - grew[0] < 1008 * 128 * 4 + 65536, grew
    lengths = [12, 5, 9, 1, 7, 3, 12, 8, 2, 11, 6, 4]
    ids, lens = random_batch(1001, lengths, seed=6)
    greedy = [m.generate(ids, lens, 16)[0] for m in models]
    assert torch.equal(greedy[0], greedy[1])
    ref = first_end(hf_greedy(hf, ids[0], 12, 16), config.end_id)
    assert greedy[0][0, 0, 12:12 + len(ref)].tolist() == ref
    opts = {"top_k": torch.tensor(0), "top_p": torch.tensor(0.95),
            "temperature": torch.tensor(1.5), "repetition_penalty": torch.tensor(1.2),
            "seed": torch.tensor(11)}
    sampled = [m.decode(ids, lens, 16, opts)["output_ids"] for m in models]
    assert torch.equal(sampled[0], sampled[1])
    assert int(sampled[0].max()) < 1001
    logits = [m.forward(ids, lens) for m in models]
    assert logits[0].shape[-1] == 1001 and not logits[0].isnan().any()
    assert torch.equal(logits[0], logits[1])


def test_untied_odd_head_keeps_no_converted_copy(workdir):
    """GPT-J's untied head and its bias, of an odd vocabulary, given as exact [1001, e] tensors:
    the engine pads them by copying into 1,008-row buffers and keeps no full-size copy besides.
    Given fp32 tensors for an fp16 model it converts every weight, so it holds more than a model
    given fp16 tensors (which it uses as they are) by exactly the converted weights other than
    the head and its bias; greedy tokens are the same."""
    hf, path = converted("gptj-odd-vocab", ODD, workdir, peak=4.0)
    config = read_config(path)
    # exact copies: load_weights' head and wte are views of padded storage
    w32 = {k: v.clone() for k, v in load_weights(path, dtype=torch.float32, device="cuda").items()}
    assert w32["lm_head.weight"].shape == (1001, 256) and w32["lm_head.bias"].shape == (1001,)
    w16 = {k: v.half() for k, v in w32.items()}
    models, grew = built_with_growth(config, (w16, w32), torch.float16, 2, 64)
    # the caching allocator's blocks are multiples of 512 bytes
    converted_bytes = sum(-(-v.numel() * 2 // 512) * 512 for k, v in w32.items()
                          if k not in ("lm_head.weight", "lm_head.bias"))
    assert abs(grew[1] - grew[0] - converted_bytes) < 65536, (grew, converted_bytes)
    ids, lens = random_batch(1001, [7, 3], seed=4)
    outs = [m.generate(ids, lens, 8)[0] for m in models]
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("name", ["gpt2", "bloom", "gptj", "gptneox-parallel"])
def test_greedy_fp16_agreement(name, workdir):
    """fp16 greedy against HF fp32: reported, and required to agree on most tokens."""
    hf, path = converted(name, TINY, workdir, peak=4.0)
    end_id = read_config(path).end_id
    model = load_gpt_model(path, dtype=torch.float16, max_batch=1, max_seq_len=256)
    ids, lengths = random_batch(hf.config.vocab_size, [16], seed=5)
    out, _ = model.generate(ids, lengths, 64, end_id=999 if end_id != 999 else 998)
    ours = out[0, 0, 16:].tolist()
    ref = hf_greedy(hf, ids[0], 16, 64)
    agree = sum(a == b for a, b in zip(ours, ref, strict=True)) / len(ref)
    print(f"\n{name}: fp16 greedy agreement with HF fp32 over 64 tokens: {agree:.1%}")
    pairs = enumerate(zip(ours, ref, strict=True))
    first_diff = next((i for i, (a, b) in pairs if a != b), len(ref))
    assert first_diff >= 8, f"{name}: fp16 diverged at token {first_diff}"


@pytest.mark.parametrize("name", ["gpt2", "bloom", "gptj", "gptneox-sequential", "opt"])
def test_ragged_batch_equals_single_rows(name, workdir):
    hf, path = converted(name, TINY, workdir, peak=4.0)
    model = load_gpt_model(path, dtype=torch.float32, max_batch=4, max_seq_len=512)
    lengths = [1, 7, 97, 300]
    ids, lens = random_batch(hf.config.vocab_size, lengths, seed=11)
    out, seq = model.generate(ids, lens, 24)
    for b, n in enumerate(lengths):
        one, one_len = model.generate(ids[b:b + 1, :n].contiguous(), lens[b:b + 1], 24)
        assert out[b, 0, : n + 24].tolist() == one[0, 0].tolist(), f"{name} row {b}"
        assert int(seq[b, 0]) == int(one_len[0, 0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("name", list(TINY))
def test_prompt_graph_replay_equals_eager(name, dtype, workdir):
    """A one-group prompt pass runs over its token count padded up with its attention grid for
    the longest sequence rounded up to 64, so batches of other lengths and contents share one
    captured pass: a and b (100 and 111 tokens, padded to 112 in steps of 16, longest 61 and 50)
    share a key, c (203 tokens, padded to 256 in steps of 64, longest 150: three rows) has its
    own. A key's first pass is eager, a later one captured, then replayed. Tokens equal, and
    logits match, the exact-length eager passes of an engine without CUDA graphs for every
    architecture (learned, rotary and ALiBi positions; pre- and post-norm; OPT-350m's
    projections), in fp32 and in fp16 (the tensor-core context attention)."""
    hf, path = converted(name, TINY, workdir, peak=4.0)
    model = load_gpt_model(path, dtype=dtype, max_batch=4, max_seq_len=512)
    eager = load_gpt_model(path, dtype=dtype, max_batch=4, max_seq_len=512,
                           options=EngineOptions(cuda_graphs=False))
    vocab = hf.config.vocab_size
    x = {"a": random_batch(vocab, [30, 7, 61, 2], seed=21),
         "b": random_batch(vocab, [12, 50, 40, 9], seed=22),
         "c": random_batch(vocab, [150, 20, 33], seed=23)}
    want = {k: (eager.generate(*v, 16), eager.forward(*v)) for k, v in x.items()}
    assert eager.prompt_graph_stats() == [0, 0]
    assert model.prompt_graph_stats() == [0, 0]
    model.generate(*x["a"], 16)
    assert model.prompt_graph_stats() == [1, 0]  # the key's first pass: eager
    # Until both keys are captured under the final buffers (a first pass of the padded shapes
    # may grow the products' workspace or the activations, which drops the graphs made before).
    for _ in range(3):
        for k in ("a", "c"):
            model.generate(*x[k], 16)
    held, replays = model.prompt_graph_stats()
    assert held == 2 and replays >= 2, (held, replays)
    tol = (1e-5 if dtype == torch.float32 else 5e-3) * float(
        want["c"][1].max() - want["c"][1].min())
    for k, call in [("b", "generate"), ("a", "forward"), ("c", "forward"), ("b", "forward"),
                    ("c", "generate"), ("a", "generate")]:
        if call == "generate":
            out, seq = model.generate(*x[k], 16)
            assert torch.equal(out, want[k][0][0]) and torch.equal(seq, want[k][0][1]), k
        else:
            err = masked_err(model.forward(*x[k]), want[k][1], x[k][1])
            assert err <= tol, f"{name} {k}: logits off by {err:.3e} (tolerance {tol:.3e})"
        replays += 1
        assert model.prompt_graph_stats() == [2, replays], (name, k, call)

    def peak(fn) -> int:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base

    # forward's logits buffer holds real rows only: no more memory than the exact-length pass.
    replayed = peak(lambda: model.forward(*x["c"]))
    exact = peak(lambda: eager.forward(*x["c"]))
    assert replayed == exact, (replayed, exact)


# Prompts run through the layers in groups of whole sequences (GptModel's prefill groups; the
# tests set the group size to 1,024 tokens with the prefill_tokens option, the default being
# 2,048). Lengths chosen so that groups end before and after sequences of every size;
# bloom (no position table) also gets sequences longer than a group.
GROUP_LENGTHS = {
    "short": [500, 3, 480, 500, 1, 500, 497, 250, 500],  # groups of 983, 1001, 747, 500 tokens
    "long": [1023, 2, 2500, 1, 900, 1200],               # [1023] [2] [2500] [1, 900] [1200]
}


@pytest.mark.parametrize("name", ["gpt2", "bloom", "gptj", "opt-350m-style"])
def test_prefill_in_groups_matches_hf_and_single_rows(name, workdir):
    hf, path = converted(name, TINY, workdir, peak=4.0)
    lengths = GROUP_LENGTHS["long" if name == "bloom" else "short"]
    model = load_gpt_model(path, dtype=torch.float32, max_batch=len(lengths),
                           max_seq_len=max(lengths) + 8,
                           options=EngineOptions(prefill_tokens=1024))
    ids, lens = random_batch(hf.config.vocab_size, lengths, seed=21)
    ref = hf_logits_padded(hf, ids, lens)
    ours = model.forward(ids, lens)
    span = float(ref.max() - ref.min())
    err = masked_err(ours, ref, lens)
    assert err <= 1e-4 * span, f"{name}: grouped prefill logits err {err:.3e} vs range {span:.3f}"
    mask = torch.arange(ids.shape[1], device="cuda")[None] >= lens[:, None]
    assert float(ours[mask].abs().max()) == 0.0, "padded positions must stay zero"
    out, seq = model.generate(ids, lens, 8)
    for b, n in enumerate(lengths):
        one, one_len = model.generate(ids[b:b + 1, :n].contiguous(), lens[b:b + 1], 8)
        assert out[b, 0, : n + 8].tolist() == one[0, 0].tolist(), f"{name} row {b}"
        assert int(seq[b, 0]) == int(one_len[0, 0])


def test_prefill_activations_sized_for_one_group(workdir):
    """64 x 128 prompt tokens: the workspace holds one group's activations (4,096 tokens for
    this model in fp16: GptModel::prefill_group_size), not all 8,192, and a group's are the
    engine's activation bytes per token times 4,096 (x, n, p and the qkv / q / attention region;
    y only for 8 rows)."""
    hf, path = converted("gpt2", TINY, workdir)
    cfg = hf.config
    model = load_gpt_model(path, dtype=torch.float16, max_batch=64, max_seq_len=136)
    ids, lens = random_batch(cfg.vocab_size, [128] * 64, seed=2)
    model.generate(ids, lens, 8)
    kv = cfg.n_layer * 2 * 64 * 136 * cfg.n_embd * 2
    # GptModel's activation bytes per token: x, n, p and the qkv / q / attention region, fp16
    per_token = (3 * cfg.n_embd + 5 * cfg.n_embd) * 2
    group = 4096 * per_token  # GptModel::prefill_group_size: 4,096 tokens fit 64 MiB
    gemm_ws = model.gemm_workspace_bytes()
    assert 0 <= gemm_ws <= 32 << 20
    assert model.memory_bytes() >= kv + gemm_ws  # memory_bytes() counts the cuBLASLt workspace
    workspace = model.memory_bytes() - kv - gemm_ws
    print(f"\nworkspace {workspace} bytes (+ cuBLASLt's {gemm_ws}); one group's activations "
          f"{group} bytes, all prompt tokens' {64 * 128 * per_token}")
    # the group's activations plus the per-row scratch, session state and index arrays (< 2 MiB)
    assert group <= workspace < group + (2 << 20)


def test_engine_options_checked_by_the_class(workdir):
    """The class checks its options JSON itself (TorchScript callers skip EngineOptions)."""
    hf, path = converted("gpt2", TINY, workdir)
    cfg = read_config(path)
    weights = load_weights(path, dtype=torch.float16, device="cuda")
    for text, rule in (('{"prefill_tokens": -5}', "prefill_tokens must be a positive"),
                       ('{"prefill_token": 5}', "unknown key 'prefill_token'; known keys:"),
                       ('{"cuda_graphs": "yes"}', "'cuda_graphs' must be a boolean"),
                       ('{"max_batch": 0}', "max_batch must be positive")):
        with pytest.raises(RuntimeError, match=f"GptModel options: .*{rule}"):
            torch.classes.warpformer.GptModel(cfg.to_json(), weights, text)
    model = torch.classes.warpformer.GptModel(
        cfg.to_json(), weights, '{"max_batch": 2, "max_seq_len": 64, "prefill_tokens": 512}')
    # options() writes every key out: what a replica or a pickled copy is built from.
    opts = json.loads(model.options())
    assert opts["max_batch"] == 2 and opts["prefill_tokens"] == 512 and opts["cuda_graphs"]
    assert model.pipeline_para_size() == 1 and model.tensor_para_size() == 1
    twin = torch.classes.warpformer.GptModel(model.config(), weights, model.options())
    ids, lens = random_batch(1000, [5, 9])
    assert torch.equal(model.generate(ids, lens, 4)[0], twin.generate(ids, lens, 4)[0])


def test_memory_flat_over_1000_calls(workdir):
    hf, path = converted("gpt2", TINY, workdir)
    model = load_gpt_model(path, dtype=torch.float16, max_batch=8, max_seq_len=128)
    ids, lens = random_batch(1000, [20] * 8)
    model.generate(ids, lens, 12)  # grow to the largest shape used below

    def call(i: int) -> None:
        # 1-12 new tokens: sessions of 8 or more capture (and destroy) a decode graph.
        b = 1 + i % 8
        model.generate(ids[:b, : 5 + i % 16].contiguous(), torch.full((b,), 5 + i % 16,
                       dtype=torch.int32, device="cuda"), 1 + i % 12)

    # Every (batch, length, new tokens) combination once: the cuBLASLt workspace grows to what
    # the algorithms of all these shapes need (a smaller product may want more than the largest).
    for i in range(48):
        call(i)
    torch.cuda.synchronize()
    before, held = torch.cuda.memory_allocated(), model.memory_bytes()
    for i in range(1000):
        call(i)
    torch.cuda.synchronize()
    after = torch.cuda.memory_allocated()
    print(f"\nGPU memory allocated before/after 1000 generate calls: {before} / {after} bytes; "
          f"model holds {held} / {model.memory_bytes()} bytes")
    assert after == before and model.memory_bytes() == held


def test_bad_inputs_raise_and_leave_instance_usable(workdir):
    hf, path = converted("gpt2", TINY, workdir)
    model = load_gpt_model(path, dtype=torch.float16, max_batch=2, max_seq_len=64)
    ids, lens = random_batch(1000, [4, 6])
    good, _ = model.generate(ids, lens, 4)
    bad_ids = ids.clone()
    bad_ids[1, 5] = 1000
    bad_cases = [
        (lambda: model.generate(bad_ids, lens, 4),
         r"input_ids\[1, 5\] = 1000 is outside the vocabulary \[0, 1000\)"),
        (lambda: model.generate(ids, lens, 64), r"exceeds max_seq_len \(64\)"),
        (lambda: model.generate(ids.long(), lens, 4), r"input_ids must have dtype Int"),
        (lambda: model.generate(ids.to("meta"), lens, 4),
         r"input_ids must be on the CPU or on the model's GPU \(cuda:0\), got meta"),
        (lambda: model.generate(bad_ids.cpu(), lens.cpu(), 4),
         r"input_ids\[1, 5\] = 1000 is outside the vocabulary \[0, 1000\)"),
        (lambda: model.decode(bad_ids.cpu(), lens, 4, {}),
         r"GptModel.decode: input_ids\[1, 5\] = 1000 is outside the vocabulary"),
        (lambda: model.forward(ids.cpu(), (lens + 5).cpu()),
         r"input_lengths\[0\] = 9 must be in \[1, 6\]"),
        (lambda: model.generate(torch.cat([ids, ids]), torch.cat([lens, lens]), 4),
         r"batch size 4 exceeds max_batch \(2\)"),
        (lambda: model.generate(ids, lens + 5, 4), r"input_lengths\[0\] = 9 must be in \[1, 6\]"),
        (lambda: model.generate(ids, lens, 0), r"output_len must be >= 1"),
        (lambda: model.forward(ids, lens[:1]), r"input_lengths must have 2 entries"),
    ]
    for call, pattern in bad_cases:
        with pytest.raises(RuntimeError, match=pattern):
            call()
    again, _ = model.generate(ids, lens, 4)
    assert torch.equal(good, again)


def test_cpu_inputs_equal_gpu_inputs(workdir):
    """input_ids/input_lengths on the CPU (checked on the host and sent with the call's other
    arrays in one copy) give the same outputs as on the GPU, for forward, generate and decode
    with per-row options, beams and both log-prob outputs; the outputs are on the GPU."""
    hf, path = converted("gpt2", TINY, workdir)
    model = load_gpt_model(path, dtype=torch.float32, max_batch=4, max_seq_len=64)
    ids, lens = random_batch(1000, [4, 9, 1, 6], seed=3)
    ids[2, 1:] = -7  # padding is never looked at, on either path
    cpu_ids, cpu_lens = ids.cpu(), lens.cpu()
    a, b = model.forward(ids, lens), model.forward(cpu_ids, cpu_lens)
    assert b.is_cuda and torch.equal(a, b)
    for got, want in zip(model.generate(cpu_ids, cpu_lens, 7, -1), model.generate(ids, lens, 7, -1),
                         strict=True):
        assert got.is_cuda and torch.equal(got, want)
    # Row 2 (1 prompt token, 7 new ones) holds the end id (2) from position 8 on, over what was
    # its padding too.
    assert model.generate(cpu_ids, cpu_lens, 7, -1)[0][2, 0, 8:].eq(2).all()
    options = [
        {"top_k": torch.tensor([0, 5, 1, 3], dtype=torch.int32),
         "temperature": torch.tensor([0.7, 1.0, 1.3, 0.9]), "seed": torch.arange(4) + 11,
         "repetition_penalty": torch.tensor(1.2), "min_length": torch.tensor(3, dtype=torch.int32),
         "return_log_probs": torch.tensor(1, dtype=torch.int32),
         "return_cum_log_probs": torch.tensor(2, dtype=torch.int32)},
        {"beam_width": torch.tensor(3, dtype=torch.int32),
         "end_id": torch.tensor([2, 5, 7, 9], dtype=torch.int32),
         "bad_words": torch.tensor([[11, 12, 13], [1, 3, -1]], dtype=torch.int32)},
    ]
    for opts in options:
        want = model.decode(ids, lens, 6, opts)
        got = model.decode(cpu_ids, lens, 6, opts)
        assert sorted(got) == sorted(want)
        for key in want:
            assert got[key].is_cuda and torch.equal(got[key], want[key]), key


def test_bad_weights_and_limits(workdir):
    hf, path = converted("gpt2", TINY, workdir)
    cfg = read_config(path)
    w = load_weights(path, dtype=torch.float16, device="cuda")
    make = torch.classes.warpformer.GptModel
    fp16 = json.dumps(dict(max_batch=2, max_seq_len=64, dtype="fp16"))
    missing = dict(w)
    del missing["layers.1.mlp.dense_4h_to_h.weight"]
    with pytest.raises(RuntimeError, match=r"missing weight 'layers.1.mlp.dense_4h_to_h.weight'"):
        make(cfg.to_json(), missing, fp16)
    wrong = dict(w)
    wrong["layers.0.attention.query_key_value.weight"] = torch.zeros(128, 3, 64, device="cuda",
                                                                     dtype=torch.float16)
    with pytest.raises(RuntimeError, match=r"'layers.0.attention.query_key_value.weight' must "
                                           r"have shape \[128, 3, 128\]"):
        make(cfg.to_json(), wrong, fp16)
    cpu = dict(w)
    cpu["wpe"] = cpu["wpe"].cpu()
    with pytest.raises(RuntimeError, match=r"weight 'wpe' is on cpu"):
        make(cfg.to_json(), cpu, fp16)
    with pytest.raises(RuntimeError, match=r"max_seq_len \(513\) exceeds the position table"):
        make(cfg.to_json(), w, json.dumps(dict(max_batch=2, max_seq_len=513, dtype="fp16")))
    # fp32 files converted to bf16 at load.
    m = make(cfg.to_json(), load_weights(path, device="cuda"),
             json.dumps(dict(max_batch=2, max_seq_len=64, dtype="bf16")))
    assert m.dtype() == "bfloat16"


@pytest.mark.parametrize("name", ["bloom", "gptj"])
def test_memcheck_small_generate(workdir, name):
    """Run under compute-sanitizer by tools/gpu_check.sh (also a plain smoke test): a sequential
    and a parallel-residual model (its MLP-in product beside the attention and its two output
    products as one launch at 1 and 2 rows), 3 rows then 2 then 1, 10 new tokens (the decode
    step replayed from a CUDA graph from the third on)."""
    hf, path = converted(name, TINY, workdir)
    model = load_gpt_model(path, dtype=torch.float16, max_batch=3, max_seq_len=64)
    for lengths in ([3, 9, 1], [5, 2], [4]):
        ids, lens = random_batch(1000, lengths)
        out, seq = model.generate(ids, lens, 10)
        torch.cuda.synchronize()
        assert out.shape == (len(lengths), 1, max(lengths) + 10) and int(seq.min()) >= 2
