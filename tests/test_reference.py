"""warpformer.reference: ragged batches, greedy generation against HF, ALiBi slopes, checks."""

from __future__ import annotations

import pytest
import torch
import transformers
from _models import build, hf_logits, randomize, rel_err, save_safetensors

from warpformer.converters import convert
from warpformer.reference import GptReference, alibi_slopes

pytest_plugins = ["_convert_fixtures"]

GENERATE = ["gpt2", "opt-350m", "bloom", "gptj", "gptneox-parallel"]


@pytest.mark.parametrize("name", ["gpt2", "bloom", "gptj", "gptneox-sequential"])
def test_ragged_batch_equals_rows(name, converted, token_ids):
    ref = GptReference.from_dir(converted(name, 2))
    lengths = torch.tensor([11, 4, 7], dtype=torch.int32)
    ids = token_ids.clone()
    for b, n in enumerate(lengths.tolist()):
        ids[b, n:] = 0  # padding
    batch = ref(ids, lengths)
    for b, n in enumerate(lengths.tolist()):
        row = ref(ids[b:b + 1, :n])[0]
        assert torch.allclose(batch[b, :n], row, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", GENERATE)
def test_greedy_matches_hf(name, converted, hf_model):
    model = hf_model(name)
    ref = GptReference.from_dir(converted(name, 2))
    prompt = torch.randint(0, 96, (1, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model.generate(prompt, max_new_tokens=6, do_sample=False, min_new_tokens=6,
                                  pad_token_id=0, eos_token_id=None)
    out, lengths = ref.generate_greedy(prompt, None, max_new_tokens=6)
    assert lengths.tolist() == [11]
    assert out.tolist() == expected.tolist()


def test_ragged_greedy_equals_rows(converted):
    ref = GptReference.from_dir(converted("gptneox-parallel", 1))
    ids = torch.randint(0, 96, (3, 6), generator=torch.Generator().manual_seed(2))
    lengths = torch.tensor([6, 2, 4])
    out, out_len = ref.generate_greedy(ids, lengths, max_new_tokens=5)
    assert out_len.tolist() == [11, 7, 9]
    for b, n in enumerate(lengths.tolist()):
        row, row_len = ref.generate_greedy(ids[b:b + 1, :n], None, max_new_tokens=5)
        assert out[b, : out_len[b]].tolist() == row[0, : row_len[0]].tolist()


def test_end_id_stops_rows(converted):
    ref = GptReference.from_dir(converted("gpt2", 1))
    ids = torch.randint(0, 96, (2, 4), generator=torch.Generator().manual_seed(3))
    free, _ = ref.generate_greedy(ids, None, max_new_tokens=4)
    end = int(free[0, 5])  # row 0's second generated token
    out, lengths = ref.generate_greedy(ids, None, max_new_tokens=4, end_id=end)
    for b in range(2):
        hits = (free[b, 4:] == end).nonzero()
        want = 4 + (int(hits[0]) + 1 if len(hits) else 4)
        assert int(lengths[b]) == want
        assert out[b, :want].tolist() == free[b, :want].tolist()
        assert (out[b, want:] == end).all()
    assert int(lengths[0]) <= 6


def test_non_power_of_two_heads_alibi(tmp_path):
    """BLOOM with 6 heads exercises the interleaved extra ALiBi slopes; tp 2 splits them."""
    torch.manual_seed(0)
    model = transformers.BloomForCausalLM(transformers.BloomConfig(
        vocab_size=96, hidden_size=48, n_head=6, n_layer=2))
    model.config._attn_implementation = "eager"
    randomize(model, 1)
    out = convert(save_safetensors(model, tmp_path / "in"), tmp_path / "out", 2).output_dir
    ids = torch.randint(0, 96, (2, 9), generator=torch.Generator().manual_seed(4))
    assert rel_err(GptReference.from_dir(out)(ids), hf_logits(model, ids)) < 1e-5
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    for n in (1, 4, 6, 12, 16, 20):
        # alibi[h, 0, k] = slope[h] * k for an all-ones mask: k = 1 gives the slopes (this
        # function is present across transformers 4.x and 5.x, unlike the private helpers).
        hf = build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), n, torch.float32)[:, 0, 1]
        assert torch.allclose(alibi_slopes(n), hf)


def test_alibi_slopes_live_with_the_weights(converted):
    """The reference runs on GPUs too (GPT.from_pretrained(backend="reference", device="cuda")):
    its ALiBi slopes must sit on the weights' device, not stay on the CPU (seen on an H200: a
    device-mismatch error at the first BLOOM attention). The meta device stands in for a GPU."""
    from warpformer.weights import load_merged_weights

    config, weights = load_merged_weights(converted("bloom", 1))
    ref = GptReference(config, {k: v.to("meta") for k, v in weights.items()})
    assert ref.slopes.device.type == "meta"


def test_input_checks(converted):
    ref = GptReference.from_dir(converted("gpt2", 1))
    ids = torch.zeros(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match=r"input_ids must be in \[0, vocab_size=96\)"):
        ref(ids + 96)
    with pytest.raises(ValueError, match=r"input_lengths must be in \[1, 5\]"):
        ref(ids, torch.tensor([5, 0]))
    with pytest.raises(ValueError, match=r"input_lengths must have shape \[2\]"):
        ref(ids, torch.tensor([5]))
    with pytest.raises(ValueError, match=r"position 32 exceeds max_pos_seq_len \(32\)"):
        ref(torch.zeros(1, 33, dtype=torch.long))


def test_weight_checks(converted):
    from warpformer.weights import load_merged_weights

    cfg, w = load_merged_weights(converted("gpt2", 1))
    del w["layers.1.mlp.dense_4h_to_h.bias"]
    with pytest.raises(KeyError, match=r"layers\.1\.mlp\.dense_4h_to_h\.bias"):
        GptReference(cfg, w)
    cfg, w = load_merged_weights(converted("gpt2", 1))
    w["wpe"] = w["wpe"][:-1]
    with pytest.raises(ValueError, match=r"wpe has shape \[31, 32\], expected \[32, 32\]"):
        GptReference(cfg, w)


def test_fp16_compute(converted, hf_reference, token_ids):
    ref = GptReference.from_dir(converted("gptj", 2, "fp16"), dtype=torch.float16)
    logits = ref(token_ids)
    assert logits.dtype == torch.float32
    assert rel_err(logits, hf_reference("gptj")) < 10 * torch.finfo(torch.float16).eps


def test_build_is_deterministic():
    a, b = build("opt-350m"), build("opt-350m")
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.equal(p, q), n
