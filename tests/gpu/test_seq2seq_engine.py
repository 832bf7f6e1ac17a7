"""The CUDA engine on encoder-decoder models against HF (issue 51): random-init T5 (ReLU with the
tied head's d_model ** -0.5 rescale), T5 v1.1 (gated GELU, untied), mT5 (odd vocabulary), a
UL2-shaped model (gated SiLU, more decoder than encoder layers), BART (post-LN, learned positions,
final_logits_bias) and mBART (pre-LN, scaled embeddings), converted at tensor_para_size 1 and run
through torch.classes.warpformer.Seq2SeqModel. Inputs are longer than T5's max_distance, so the
clamped relative bias is exercised, and ragged. fp32: the encoder output equals HF's, the logits
along the generated tokens (the final hidden states times the head) HF's teacher-forced logits,
greedy tokens HF's generate, beam tokens HF's beam search; fp16/bf16: the encoder output and the
logits within 2x HF's own error in that dtype (against HF fp32)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import transformers
from _models import randomize
from _seq2seq import clear_prefix, save_models

import warpformer  # noqa: F401
from warpformer.converters import convert
from warpformer.options import EngineOptions, model_options_json
from warpformer.t5_weights import load_t5_weights, read_t5_config

pytestmark = pytest.mark.gpu

LENGTHS = [20, 9, 14]  # longer than max_distance (12), ragged
WIDTH = max(LENGTHS)
NEW = 8
MAX_SEQ = 40  # BART's position table has 40 rows

T5_VARIANTS = {
    "t5-relu-tied": ("T5", dict(feed_forward_proj="relu"), False),
    "t5v11-gated-gelu": ("T5", dict(feed_forward_proj="gated-gelu"), True),
    "mt5-odd-vocab": ("MT5", dict(feed_forward_proj="gated-gelu", vocab_size=101), True),
    "ul2-gated-silu": ("T5", dict(feed_forward_proj="gated-silu", num_decoder_layers=3), True),
}
BART_VARIANTS = {
    "bart": ("Bart", dict(decoder_layers=3)),
    "mbart-odd-vocab": ("MBart", dict(vocab_size=101, scale_embedding=True,
                                      activation_function="relu")),
}


def _build(name: str) -> transformers.PreTrainedModel:
    torch.manual_seed(0)
    if name in T5_VARIANTS:
        kind, kw, untied = T5_VARIANTS[name]
        cfg = dict(vocab_size=120, d_model=64, d_kv=32, d_ff=96, num_layers=2, num_heads=4,
                   relative_attention_num_buckets=8, relative_attention_max_distance=12,
                   decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
        cfg.update(kw)
        if untied:
            cfg["tie_word_embeddings"] = False
        model = getattr(transformers, f"{kind}ForConditionalGeneration")(
            getattr(transformers, f"{kind}Config")(**cfg))
        if untied:  # transformers 5 ties every T5 head; give it its own, as v1.1 has
            model.lm_head.weight = torch.nn.Parameter(torch.empty(cfg["vocab_size"], 64))
    else:
        kind, kw = BART_VARIANTS[name]
        cfg = dict(vocab_size=120, d_model=64, encoder_layers=2, decoder_layers=2,
                   encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=96,
                   decoder_ffn_dim=80, max_position_embeddings=MAX_SEQ, pad_token_id=1,
                   bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
                   forced_eos_token_id=None)
        cfg.update(kw)
        model = getattr(transformers, f"{kind}ForConditionalGeneration")(
            getattr(transformers, f"{kind}Config")(**cfg))
    model.config._attn_implementation = "eager"
    model = randomize(model, seed=1)
    if name in BART_VARIANTS:
        with torch.no_grad():  # a buffer, which randomize leaves at zero
            model.final_logits_bias.normal_(generator=torch.Generator().manual_seed(2))
    return model.eval()


NAMES = list(T5_VARIANTS) + list(BART_VARIANTS)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    untied = {n for n, v in T5_VARIANTS.items() if v[2]}
    return save_models(_build, NAMES, tmp_path_factory.mktemp("s2s-checkpoints"),
                       lambda name: {"tie_word_embeddings": False} if name in untied else {})


@pytest.fixture(scope="module")
def converted(models, tmp_path_factory):
    root = tmp_path_factory.mktemp("s2s-converted")
    return {name: convert(models[name][1], root / name, 1, "fp32").output_dir for name in NAMES}


def _engine(path, dtype="fp32", max_batch=4, options=None):
    cfg = read_t5_config(path)
    weights = {k: v.cuda() for k, v in load_t5_weights(path, 0).items()}
    opts = model_options_json(options or EngineOptions(), max_batch=max_batch, max_seq_len=MAX_SEQ,
                              dtype=dtype)
    return torch.classes.warpformer.Seq2SeqModel(cfg.to_json(), weights, opts)


def _inputs(model):
    vocab = model.config.vocab_size
    ids = torch.randint(3, vocab, (len(LENGTHS), WIDTH), generator=torch.Generator().manual_seed(3))
    lengths = torch.tensor(LENGTHS, dtype=torch.int32)
    mask = (torch.arange(WIDTH)[None, :] < lengths[:, None].long()).long()
    return ids.int(), lengths, mask


def _head_logits(model, hidden):
    """Logits of final hidden states (HF's decoder_hidden_states[-1]) as HF's head computes them
    (fp32): T5 with a tied head rescales by d_model ** -0.5 first."""
    w = model.get_output_embeddings().weight.float()
    # transformers 5 ties every T5 head and keeps the rescale as scale_decoder_outputs.
    if getattr(model.config, "scale_decoder_outputs", False):
        w = w * model.config.d_model ** -0.5
    out = hidden.float() @ w.t().to(hidden.device)
    bias = getattr(model, "final_logits_bias", None)
    return out + bias.float().to(hidden.device) if bias is not None else out


@pytest.mark.parametrize("name", NAMES)
def test_fp32_encoder_logits_greedy_equal_hf(name, models, converted):
    model = models[name][0]
    ids, lengths, mask = _inputs(model)
    engine = _engine(converted[name])
    with torch.no_grad():
        hf_enc = model.get_encoder()(input_ids=ids.long(), attention_mask=mask).last_hidden_state
    enc = engine.encode(ids, lengths).cpu()
    top = float(hf_enc.abs().max())
    torch.testing.assert_close(enc, hf_enc * mask[..., None], rtol=1e-4, atol=1e-4 * top)

    out = engine.decode(ids, lengths, NEW, {"return_hidden_states": torch.tensor(1)})
    tokens = out["output_ids"][:, 0].cpu()
    assert tokens.shape == (len(LENGTHS), 1 + NEW)
    assert (tokens[:, 0] == model.config.decoder_start_token_id).all()
    with torch.no_grad():
        hf = model.generate(input_ids=ids.long(), attention_mask=mask, max_new_tokens=NEW,
                            do_sample=False, num_beams=1, min_length=0, output_scores=True,
                            return_dict_in_generate=True, use_cache=False)
        # HF's logits teacher-forced along the engine's tokens.
        forced = model(input_ids=ids.long(), attention_mask=mask,
                       decoder_input_ids=tokens[:, :NEW].long()).logits
    seq_lengths = out["sequence_lengths"][:, 0].cpu()
    logits = _head_logits(model, out["hidden_states"][:, 0]).cpu()
    for row in range(len(LENGTHS)):
        n = min(clear_prefix(hf.scores, row), int(seq_lengths[row]) - 1)
        assert n >= 1
        assert tokens[row, 1:1 + n].tolist() == hf.sequences[row, 1:1 + n].tolist(), row
        steps = int(seq_lengths[row]) - 1
        # fp32 up to summation order through two stacks (HF on the CPU, the engine's GEMMs and
        # attention on the GPU; run 0542: at most 3.1e-4 of the range, UL2's three gated
        # decoder layers): 5e-4 of the logits' range.
        scale = float(forced[row, :steps].abs().max())
        torch.testing.assert_close(logits[row, :steps], forced[row, :steps], rtol=0,
                                   atol=5e-4 * scale)


@pytest.mark.parametrize("name", ["t5v11-gated-gelu", "bart"])
def test_fp32_beam_equals_hf(name, models, converted):
    model = models[name][0]
    ids, lengths, mask = _inputs(model)
    engine = _engine(converted[name])
    with torch.no_grad():
        hf = model.generate(input_ids=ids.long(), attention_mask=mask, max_new_tokens=NEW,
                            do_sample=False, num_beams=4, length_penalty=0.7, min_length=0)
    out = engine.decode(ids, lengths, NEW, {"beam_width": torch.tensor(4),
                                            "length_penalty": torch.tensor(0.7)})
    best = out["output_ids"][:, 0].cpu()
    n = out["sequence_lengths"][:, 0].cpu()
    pad = model.config.pad_token_id
    for row in range(len(LENGTHS)):
        k = int(n[row])
        assert best[row, :k].tolist() == hf[row, :k].tolist(), row
        assert all(t == pad for t in hf[row, k:].tolist()), row


# BART in fp16: the decoder's logits err by 4x HF fp16's at every step (0.20 vs 0.048 of a range
# of 8, device run 0542) while fp32, bf16 and pre-norm mBART fp16 are within bounds: open.
BART_FP16 = pytest.mark.xfail(strict=True, reason="BART fp16 logits 4x HF's error (open)")


@pytest.mark.parametrize("name", ["t5-relu-tied", "t5v11-gated-gelu", "bart", "mbart-odd-vocab"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_half_within_twice_hf_error(name, dtype, models, converted, request):
    if (name, dtype) == ("bart", "fp16"):
        request.applymarker(BART_FP16)
    model = models[name][0]
    ids, lengths, mask = _inputs(model)
    torch_dtype = torch.float16 if dtype == "fp16" else torch.bfloat16
    engine = _engine(converted[name], dtype)
    half = transformers.AutoModelForSeq2SeqLM.from_pretrained(models[name][1],
                                                              dtype=torch_dtype).cuda().eval()
    half.config._attn_implementation = "eager"
    ref = copy.deepcopy(model).cuda()
    ids_d, mask_d = ids.long().cuda(), mask.cuda()
    with torch.no_grad():
        want = ref.get_encoder()(input_ids=ids_d, attention_mask=mask_d).last_hidden_state
        hf_half = half.get_encoder()(input_ids=ids_d, attention_mask=mask_d).last_hidden_state
    got = engine.encode(ids, lengths).float()
    m = mask_d[..., None]
    hf_err = float(((hf_half.float() - want) * m).abs().max())
    err = float(((got - want) * m).abs().max())
    assert err <= 2 * hf_err + 1e-3 * float(want.abs().max()), (err, hf_err)

    out = engine.decode(ids, lengths, NEW, {"return_hidden_states": torch.tensor(1)})
    tokens = out["output_ids"][:, 0].long()
    steps = int(out["sequence_lengths"][:, 0].min()) - 1
    with torch.no_grad():
        want = ref(input_ids=ids_d, attention_mask=mask_d,
                   decoder_input_ids=tokens[:, :NEW]).logits[:, :steps]
        hf_half_logits = half(input_ids=ids_d, attention_mask=mask_d,
                              decoder_input_ids=tokens[:, :NEW]).logits[:, :steps].float()
    got = _head_logits(ref, out["hidden_states"][:, 0, :steps])
    hf_err = float((hf_half_logits - want).abs().max())
    err = float((got - want).abs().max())
    print(name, dtype, "per-step logits error, engine vs HF fp32 / HF half vs HF fp32:",
          [round(float(e), 4) for e in (got - want).abs().amax(dim=(0, 2))],
          [round(float(e), 4) for e in (hf_half_logits - want).abs().amax(dim=(0, 2))])
    assert err <= 2 * hf_err + 1e-3 * float(want.abs().max()), (err, hf_err)


def test_sampling_stop_words_and_steps(models, converted):
    """The generation session's other options run on the encoder-decoder unchanged: sampling is
    reproducible by seed, decode_step streams the same tokens as one call, bad words never
    appear, min_length holds off the end id, log probs are finite."""
    model = models["t5v11-gated-gelu"][0]
    ids, lengths, _ = _inputs(model)
    engine = _engine(converted["t5v11-gated-gelu"])
    sample = {"top_k": torch.tensor(5), "seed": torch.tensor(7), "temperature": torch.tensor(0.8)}
    a = engine.decode(ids, lengths, NEW, sample)["output_ids"]
    b = engine.decode(ids, lengths, NEW, sample)["output_ids"]
    assert torch.equal(a, b)
    one = engine.decode(ids, lengths, NEW, {})["output_ids"][:, 0, 1:].cpu()
    engine.decode_start(ids, lengths, NEW, {})
    streamed = torch.cat([engine.decode_step(3), engine.decode_step(NEW)], dim=2)
    engine.decode_finish()
    assert torch.equal(streamed[:, 0].cpu(), one)
    banned = int(one[0, 0])
    out = engine.decode(ids, lengths, NEW, {"bad_words": torch.tensor([[banned], [1]]),
                                            "min_length": torch.tensor(NEW),
                                            "return_log_probs": torch.tensor(1)})
    assert banned not in out["output_ids"][:, 0, 1:].flatten().tolist()
    assert (out["sequence_lengths"] == 1 + NEW).all()
    assert torch.isfinite(out["output_log_probs"]).all()


def test_bad_requests_leave_the_instance_usable(models, converted):
    model = models["t5-relu-tied"][0]
    ids, lengths, _ = _inputs(model)
    engine = _engine(converted["t5-relu-tied"], max_batch=3)
    with pytest.raises(RuntimeError, match=r"option 'memory_len' must be 0"):
        engine.decode(ids, lengths, NEW, {"memory_len": torch.tensor(4)})
    with pytest.raises(RuntimeError, match=r"option 'session'"):
        engine.decode(ids, lengths, NEW, {"session": torch.tensor(1)})
    with pytest.raises(RuntimeError, match=r"option 'return_cum_log_probs' must be 0 or 1"):
        engine.decode(ids, lengths, NEW, {"return_cum_log_probs": torch.tensor(2)})
    with pytest.raises(RuntimeError, match=r"1 \+ output_len = 41 exceeds max_seq_len \(40\)"):
        engine.decode(ids, lengths, MAX_SEQ, {})
    bad = ids.clone()
    bad[1, 2] = model.config.vocab_size
    with pytest.raises(RuntimeError, match=r"input_ids\[1, 2\] = 120 is outside the vocabulary"):
        engine.decode(bad, lengths, NEW, {})
    with pytest.raises(RuntimeError, match=r"batch size 4 exceeds max_batch \(3\)"):
        engine.encode(torch.cat([ids, ids[:1]]), torch.cat([lengths, lengths[:1]]))
    engine.decode_start(ids, lengths, NEW, {})
    with pytest.raises(RuntimeError, match=r"a generation session is running"):
        engine.encode(ids, lengths)
    engine.decode_finish()
    out = engine.decode(ids, lengths, NEW, {})
    assert out["output_ids"].shape == (3, 1, 1 + NEW)


def test_fp16_overflow_is_refused_not_garbage(models, converted, tmp_path):
    """FT issue #554: T5 FFN activations past the fp16 range. A model whose FFN input weights
    are scaled up overflows in fp16; the engine refuses it with a clear error (bf16 and fp32
    run it), and the instance stays usable."""
    from warpformer.t5_weights import layer_names

    path = converted["t5v11-gated-gelu"]
    big = tmp_path / "overflow"
    big.mkdir()
    for f in path.iterdir():
        (big / f.name).write_bytes(f.read_bytes())
    cfg = read_t5_config(big)
    name = layer_names(cfg, "encoder", 0)["ffn_in"]
    for f in big.glob(name + "*.bin"):
        w = torch.from_numpy(np.fromfile(f, dtype=np.float32)) * 30000.0
        w.numpy().tofile(f)
    model = models["t5v11-gated-gelu"][0]
    ids, lengths, _ = _inputs(model)
    engine = _engine(big, "fp16")
    with pytest.raises(RuntimeError, match=r"encoder's activations overflow float16"):
        engine.decode(ids, lengths, NEW, {})
    with pytest.raises(RuntimeError, match=r"encoder's activations overflow float16"):
        engine.encode(ids, lengths)
    out = _engine(big, "bf16").decode(ids, lengths, NEW, {})
    assert out["output_ids"].shape == (3, 1, 1 + NEW)
    # The same files unscaled run in fp16.
    assert _engine(path, "fp16").decode(ids, lengths, NEW, {})["output_ids"].shape == (3, 1, 9)


def test_reused_instance_equals_fresh_one(models, converted):
    """An instance that ran one batch gives a later batch of other lengths and width (reused
    cross memory, replayed step graphs, per-row memory lengths) what a fresh instance gives."""
    model = models["t5v11-gated-gelu"][0]
    ids, lengths, _ = _inputs(model)
    other_ids, other_lengths = ids[:2, :11].contiguous(), torch.tensor([5, 11], dtype=torch.int32)
    used = _engine(converted["t5v11-gated-gelu"])
    for options in ({}, {"beam_width": torch.tensor(3)}):
        used.decode(ids, lengths, NEW, options)
        again = used.decode(other_ids, other_lengths, NEW, options)
        fresh = _engine(converted["t5v11-gated-gelu"]).decode(other_ids, other_lengths, NEW,
                                                               options)
        assert torch.equal(again["output_ids"], fresh["output_ids"]), options
        assert torch.equal(again["sequence_lengths"], fresh["sequence_lengths"]), options


@pytest.mark.parametrize("name", ["t5-relu-tied", "bart"])
def test_log_probs_equal_hf_past_max_distance(name, models, converted):
    """16 decoder positions (past T5's max_distance 12, so the decoder's clamped bias runs):
    each chosen token's log prob equals HF's teacher-forced log softmax (the engine's head,
    with T5's rescale, and final_logits_bias included)."""
    model = models[name][0]
    ids, lengths, mask = _inputs(model)
    steps = 16
    out = _engine(converted[name]).decode(ids, lengths, steps,
                                          {"return_log_probs": torch.tensor(1)})
    tokens = out["output_ids"][:, 0].cpu().long()
    with torch.no_grad():
        forced = model(input_ids=ids.long(), attention_mask=mask,
                       decoder_input_ids=tokens[:, :steps]).logits
    want = torch.log_softmax(forced.float(), -1).gather(2, tokens[:, 1:, None]).squeeze(2)
    got = out["output_log_probs"][:, 0].cpu()
    n = out["sequence_lengths"][:, 0].cpu() - 1
    for row in range(len(LENGTHS)):
        k = int(n[row])
        torch.testing.assert_close(got[row, :k], want[row, :k], rtol=0, atol=2e-3)


@pytest.mark.parametrize("name", ["t5-relu-tied", "bart"])
def test_seq2seq_class_engine_equals_reference(name, models, converted):
    """warpformer.Seq2Seq on the engine gives the reference backend's tokens (fp32): greedy with
    penalties and bad words, beam search, and streaming."""
    model = models[name][0]
    ids, lengths, _ = _inputs(model)
    prompts = [ids[i, :n].tolist() for i, n in enumerate(LENGTHS)]
    kw = dict(max_batch=4, max_seq_len=MAX_SEQ)
    eng = warpformer.Seq2Seq.from_pretrained(converted[name], backend="engine",
                                             dtype=torch.float32, **kw)
    ref = warpformer.Seq2Seq.from_pretrained(converted[name], backend="reference", **kw)
    torch.testing.assert_close(eng.encode(prompts).float().cpu(), ref.encode(prompts).float(),
                               rtol=0, atol=1e-4 * float(ref.encode(prompts).abs().max()))
    for options in (dict(repetition_penalty=1.3, bad_words=[[5]]), dict(num_beams=3),
                    dict(min_length=NEW, return_log_probs=True)):
        a, b = eng.generate(prompts, NEW, **options), ref.generate(prompts, NEW, **options)
        assert a.tokens == b.tokens, options


@pytest.mark.parametrize("name", ["t5v11-gated-gelu", "bart"])
def test_step_graphs_equal_eager(name, models, converted):
    """Decode steps replayed from CUDA graphs (the default) give the tokens and log probs of an
    instance without graphs, greedy (a shared graph, replayed by the second call) and beam."""
    model = models[name][0]
    ids, lengths, _ = _inputs(model)
    graphs = _engine(converted[name], "fp16")
    eager = _engine(converted[name], "fp16", options=EngineOptions(cuda_graphs=False))
    for options in ({}, {}, {"beam_width": torch.tensor(3)},
                    {"top_k": torch.tensor(4), "seed": torch.tensor(5),
                     "return_log_probs": torch.tensor(1)}):
        a, b = graphs.decode(ids, lengths, NEW, options), eager.decode(ids, lengths, NEW, options)
        assert torch.equal(a["output_ids"], b["output_ids"]), options
        if "output_log_probs" in a:
            assert torch.equal(a["output_log_probs"], b["output_log_probs"])
