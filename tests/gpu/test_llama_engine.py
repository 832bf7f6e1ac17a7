"""The CUDA engine on LLaMA-style decoders against HF (issue 54): random-init Llama (grouped-query
attention, 8 query heads over 2 K/V heads, and multi-query), Mistral (a sliding window of 16,
shorter than the prompts and the generations) and Qwen2 (q/k/v biases, tied embeddings), head
size 64, converted at tensor_para_size 1: RMSNorm blocks, the gated SiLU MLP, "half" rotary on
the whole head, rotary scaling llama3, yarn (its attention factor on cos/sin) and dynamic. fp32
prompt logits equal HF's to 1e-4 of their range and greedy tokens HF's generate; fp16 logits
within 2x HF fp16's own error against HF fp32."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers

import warpformer  # noqa: F401
from warpformer.converters import convert
from warpformer.gpt import GPT

pytestmark = pytest.mark.gpu

CASES = {
    "llama-gqa": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
                  dict(num_key_value_heads=2)),
    "llama-mqa": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
                  dict(num_key_value_heads=1)),
    "qwen2-tied": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
                   dict(num_key_value_heads=2, tie_word_embeddings=True)),
    # Llama 3's rotary scaling, its bands moved into the test's positions (wavelengths of 8-32).
    "llama3-scaled": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
                      dict(num_key_value_heads=2, rope_parameters={
                          "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 32})),
    # yarn's ramp inside the head (pretraining context 32), attention factor 1 + 0.1 ln 4.
    "llama-yarn": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
                   dict(num_key_value_heads=4, rope_parameters={
                       "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                       "original_max_position_embeddings": 32})),
    # dynamic: the unscaled rotary up to max_position_embeddings (256 here)
    "llama-dynamic": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
                      dict(num_key_value_heads=2, rope_parameters={
                          "rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})),
    "mistral-window": (transformers.MistralConfig, transformers.MistralForCausalLM,
                       dict(num_key_value_heads=2, sliding_window=16)),
}


def _hf(name: str) -> transformers.PreTrainedModel:
    cfg_cls, model_cls, extra = CASES[name]
    cfg = cfg_cls(vocab_size=1000, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                  num_attention_heads=8, max_position_embeddings=256, bos_token_id=1,
                  eos_token_id=2, **extra)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = model_cls(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif n.endswith("bias"):
                p.normal_(0, 0.1)
        model.lm_head.weight.mul_(8.0)  # peaked logits: greedy without near ties
    return model


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("llama_engine")
    out = {}
    for name in CASES:
        model = _hf(name)
        model.save_pretrained(root / f"{name}-hf")
        out[name] = (model, convert(root / f"{name}-hf", root / name, 1, "fp32").output_dir)
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_logits_and_greedy_equal_hf(folders, name):
    model, folder = folders[name]
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 1000, (3, 40), generator=g)
    lengths = [40, 23, 9]
    with torch.no_grad():
        want = [model(ids[b:b + 1, :n].cuda()).logits[0].float() for b, n in enumerate(lengths)]
    gpt = GPT.from_pretrained(folder, backend="cuda", dtype=torch.float32, max_batch=4,
                              max_seq_len=96)
    rows = [ids[b, :n].tolist() for b, n in enumerate(lengths)]
    got = gpt.logits(rows)
    for b, n in enumerate(lengths):
        err = float((got[b, :n].float() - want[b]).abs().max() / want[b].abs().max())
        assert err <= 1e-4, (name, b, err)
    tokens = gpt.generate(rows, 20, end_id=0).tokens
    single = gpt.generate(rows[:1], 20, end_id=0).tokens[0][0]  # one row: the fp32 GEMV path
    half = GPT.from_pretrained(folder, backend="cuda", dtype=torch.float16, max_batch=4,
                               max_seq_len=96)
    rows4 = rows + [rows[1][:5]]  # four rows: fp16's tensor-core GEMV with the kept norm
    tokens16 = half.generate(rows4, 20, end_id=0).tokens
    same = total = 0
    for b, n in enumerate(lengths):
        with torch.no_grad():
            hf = model.generate(ids[b:b + 1, :n].cuda(), max_new_tokens=20, do_sample=False,
                                eos_token_id=None, pad_token_id=0)[0, n:].tolist()
        hf = hf[:hf.index(0) + 1] if 0 in hf else hf  # the engine ends a row at end_id 0
        assert tokens[b][0] == hf, (name, b)
        if b == 0:
            assert single == hf, name
        same += sum(int(x == y) for x, y in zip(tokens16[b][0], hf, strict=False))
        total += len(hf)
    assert same >= 0.9 * total, (name, same, total)  # fp16 rounding may flip a rare near tie


@pytest.mark.parametrize("name", ["llama-gqa", "qwen2-tied", "mistral-window"])
def test_fp16_logits_within_twice_hf_error(folders, name):
    model, folder = folders[name]
    ids = torch.randint(3, 1000, (2, 33), generator=torch.Generator().manual_seed(4)).cuda()
    with torch.no_grad():
        ref = model(ids).logits.float()
        hf16 = copy.deepcopy(model).half()(ids).logits.float()
    gpt = GPT.from_pretrained(folder, backend="cuda", dtype=torch.float16, max_batch=2,
                              max_seq_len=64)
    got = gpt.logits(ids).float()
    hf_err = float((hf16 - ref).abs().max())
    err = float((got - ref).abs().max())
    assert err <= 2 * hf_err + 1e-3, (name, err, hf_err)


def test_dynamic_scaling_past_its_context_is_refused(folders):
    _, folder = folders["llama-dynamic"]
    with pytest.raises(RuntimeError, match=r"rope_scaling_type dynamic runs as the unscaled "
                                           r"rotary.*max_seq_len \(300\) exceeds it: use "
                                           r"max_seq_len <= 256 or backend='reference'"):
        GPT.from_pretrained(folder, backend="cuda", dtype=torch.float32, max_batch=1,
                            max_seq_len=300)


def test_memory_len_equals_hf_sliding_window(folders):
    """generate(memory_len=N) on the CUDA engine equals transformers' Mistral with a sliding
    window of N over the same weights (greedy, fp32, rows of 1 and 3 for the GEMV and the
    fused and unfused decode paths); alternating N and 0 on one instance re-captures its step
    graphs each time (a graph kept from the other window would give the other text)."""
    model, folder = folders["llama-gqa"]
    window = 8
    cfg = transformers.MistralConfig(
        **{k: getattr(model.config, k) for k in (
            "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
            "rms_norm_eps", "bos_token_id", "eos_token_id")},
        rope_theta=model.config.rope_parameters["rope_theta"], sliding_window=window)
    cfg._attn_implementation = "eager"
    with torch.device("cuda"):
        mistral = transformers.MistralForCausalLM(cfg).eval()
    mistral.load_state_dict(model.state_dict())
    ids = torch.randint(3, 1000, (3, 30), generator=torch.Generator().manual_seed(9))
    lengths = [30, 17, 12]
    rows = [ids[b, :n].tolist() for b, n in enumerate(lengths)]

    def hf(m, b):
        with torch.no_grad():
            n = lengths[b]
            out = m.generate(ids[b:b + 1, :n].cuda(), max_new_tokens=16, do_sample=False,
                             eos_token_id=None, pad_token_id=0)[0, n:].tolist()
        return out[:out.index(0) + 1] if 0 in out else out

    windowed = [hf(mistral, b) for b in range(3)]
    plain = [hf(model, b) for b in range(3)]
    assert windowed != plain
    gpt = GPT.from_pretrained(folder, backend="cuda", dtype=torch.float32, max_batch=4,
                              max_seq_len=64)
    for w, want in ((window, windowed), (0, plain), (window, windowed)):
        got = gpt.generate(rows, 16, end_id=0, memory_len=w).tokens
        assert [got[b][0] for b in range(3)] == want, w
        assert gpt.generate(rows[:1], 16, end_id=0, memory_len=w).tokens[0][0] == want[0], w


def test_several_end_ids_end_rows_as_hf(folders, tmp_path):
    """A generation_config.json eos list (Llama 3 Instruct's layout) converts to end_id +
    extra_end_ids; the CUDA engine ends each row at any of them, as transformers' generate does
    with the list (greedy, rows of 1 and 3)."""
    model, _ = folders["llama-gqa"]
    ids = torch.randint(3, 1000, (3, 20), generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        free = [model.generate(ids[b:b + 1].cuda(), max_new_tokens=16, do_sample=False,
                               eos_token_id=None, pad_token_id=0)[0, 20:].tolist()
                for b in range(3)]
    stop = free[0][5]  # row 0 emits it mid-generation
    first = next(t for t in range(3, 1000) if all(t not in f for f in free))
    eos = [first, stop]
    saved = model.config.eos_token_id, model.generation_config.eos_token_id
    model.config.eos_token_id, model.generation_config.eos_token_id = first, eos
    try:
        model.save_pretrained(tmp_path / "hf")
        with torch.no_grad():
            want = []
            for b in range(3):
                out = model.generate(ids[b:b + 1].cuda(), max_new_tokens=16, do_sample=False,
                                     eos_token_id=eos, pad_token_id=first)[0, 20:].tolist()
                want.append(out[:out.index(stop) + 1] if stop in out else out)
    finally:
        model.config.eos_token_id, model.generation_config.eos_token_id = saved
    folder = convert(tmp_path / "hf", tmp_path / "wf", 1, "fp32").output_dir
    gpt = GPT.from_pretrained(folder, backend="cuda", dtype=torch.float32, max_batch=4,
                              max_seq_len=64)
    assert gpt.end_ids == (first, stop)
    rows = [ids[b].tolist() for b in range(3)]
    got = gpt.generate(rows, 16).tokens
    assert [got[b][0] for b in range(3)] == want
    assert gpt.generate(rows[:1], 16).tokens[0][0] == want[0]
