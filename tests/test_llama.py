"""LLaMA-style decoders on CPU (issue 54's converters and reference): Llama (grouped-query
attention, llama3 / yarn / linear / dynamic rotary scaling, optional biases), Mistral (a sliding
window shorter than the prompt) and Qwen2 (q/k/v biases, tied embeddings), converted at
tensor_para_size 1, 2 and 4 (K/V heads split over the ranks, and copied when fewer than the ranks),
equal to HF in fp32: logits, greedy and beam tokens through the reference backend; bad configs and
the engine's refusals get clear errors (the CUDA engine against HF:
tests/gpu/test_llama_engine.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import io

import pytest
import torch
import transformers

import warpformer  # noqa: F401
from warpformer.cli import main as cli_main
from warpformer.config import ConfigError, GptConfig, QuantScheme
from warpformer.converters import ConversionError, convert
from warpformer.gpt import GPT
from warpformer.reference import GptReference
from warpformer.weights import weight_specs

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32}
CASES = {
    "llama-gqa": ("llama", dict(num_key_value_heads=2)),
    "llama3-mqa": ("llama", dict(num_key_value_heads=1, rope_parameters=LLAMA3_ROPE)),
    "llama-yarn-mha": ("llama", dict(num_key_value_heads=4, rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
        "original_max_position_embeddings": 64})),
    "llama-linear-biases": ("llama", dict(num_key_value_heads=2, attention_bias=True,
                                          mlp_bias=True, rope_parameters={
                                              "rope_type": "linear", "rope_theta": 10000.0,
                                              "factor": 2.0})),
    "llama-dynamic": ("llama", dict(num_key_value_heads=2, max_position_embeddings=16,
                                    rope_parameters={"rope_type": "dynamic",
                                                     "rope_theta": 10000.0, "factor": 2.0})),
    "mistral-window": ("mistral", dict(num_key_value_heads=2, sliding_window=5)),
    "qwen2-tied": ("qwen2", dict(num_key_value_heads=2, tie_word_embeddings=True)),
}
_CLASSES = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
            "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
            "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}


def _hf(name: str) -> transformers.PreTrainedModel:
    kind, extra = CASES[name]
    cfg_cls, model_cls = _CLASSES[kind]
    kw = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, max_position_embeddings=256, bos_token_id=1,
              eos_token_id=2)
    cfg = cfg_cls(**{**kw, **extra})
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = model_cls(cfg).eval()
    with torch.no_grad():  # norms and biases away from their initial 1 / 0
        for n, p in model.named_parameters():
            if "norm" in n:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif n.endswith("bias"):
                p.normal_(0, 0.1)
        model.lm_head.weight.mul_(8.0)  # peaked logits: greedy and beam without near ties
    return model


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """name -> (HF model, its saved folder)."""
    root = tmp_path_factory.mktemp("llama")
    out = {}
    for name in CASES:
        model = _hf(name)
        model.save_pretrained(root / name)
        out[name] = (model, root / name)
    return out


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("name", list(CASES))
def test_logits_equal_hf(models, name, tp, tmp_path):
    model, folder = models[name]
    ids = torch.randint(3, 128, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids).logits
    out = convert(folder, tmp_path, tp, "fp32").output_dir
    got = GptReference.from_dir(out)(ids)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_config_keys(models, tmp_path):
    out = convert(models["llama3-mqa"][1], tmp_path, 2, "fp32").output_dir
    cfg = GptConfig.from_ini(out / "config.ini")
    assert (cfg.layernorm_type, cfg.kv_head_num, cfg.use_gated_activation) == ("rmsnorm", 1, True)
    assert (cfg.rope_scaling_type, cfg.rope_scaling_factor) == ("llama3", 8.0)
    assert cfg.rope_scaling_original_max_position == 32 and cfg.rotary_base == 500000.0
    assert not cfg.has_attention_bias and not cfg.has_mlp_bias
    # One K/V head copied on both ranks: each rank's QKV is [h, (2 + 1 + 1) * 16].
    assert weight_specs(cfg)["layers.0.attention.query_key_value.weight"].shape == (64, 2 * 64)
    assert (out / "model.layers.0.attention.query_key_value.weight.1.bin").stat().st_size == (
        64 * 64 * 4)
    qwen = GptConfig.from_ini(convert(models["qwen2-tied"][1], tmp_path / "q", 1,
                                      "fp32").output_dir / "config.ini")
    assert qwen.has_attention_bias and not qwen.has_attention_out_bias
    specs = weight_specs(qwen)
    assert "layers.0.attention.dense.bias" not in specs and "lm_head.weight" in specs
    assert not (tmp_path / "q" / "1-gpu" / "model.lm_head.weight.bin").exists()  # tied


@pytest.mark.parametrize("name", ["llama-gqa", "mistral-window", "qwen2-tied", "llama-dynamic"])
def test_greedy_and_beam_equal_hf(models, name, tmp_path):
    """Prompts longer than Mistral's window; llama-dynamic generates past its 16 positions, where
    the dynamic rotary base grows every step as HF's does."""
    model, folder = models[name]
    out = convert(folder, tmp_path, 2, "fp32").output_dir
    gpt = GPT.from_pretrained(out, backend="reference", max_batch=2, max_seq_len=64)
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(3, 128, (1, 11), generator=g)
    with torch.no_grad():
        hf = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12,
                            do_sample=False, eos_token_id=None, pad_token_id=0)
    got = gpt.generate([prompt[0].tolist()], 12, end_id=0).tokens[0][0]
    assert got == hf[0, 11:].tolist()
    with torch.no_grad():
        hf_beam = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8,
                                 num_beams=3, do_sample=False, eos_token_id=None, pad_token_id=0,
                                 length_penalty=1.0, early_stopping=True)
    beam = gpt.generate([prompt[0].tolist()], 8, num_beams=3, end_id=0).tokens[0][0]
    assert beam == hf_beam[0, 11:].tolist()


def _cli(*argv) -> tuple[int, str, str]:
    """``warpformer generate ARGV`` on the reference backend: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli_main(["generate", "--backend", "reference", *map(str, argv)])
    return rc, out.getvalue(), err.getvalue()


def test_several_end_ids_end_rows_as_hf(models, tmp_path):
    """A HF eos_token_id list (Llama 3 Instruct's, in generation_config.json) converts to end_id +
    extra_end_ids, and
    generate without end_id ends a row at any of them, as HF's generate with the list does
    (greedy tokens equal HF's); min_length and beam search, which would end rows at end_id only,
    are refused by name."""
    model, _ = models["llama-gqa"]
    prompt = torch.randint(3, 128, (1, 11), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        free = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=16,
                              do_sample=False, eos_token_id=None, pad_token_id=0)[0, 11:].tolist()
    stop = free[6]  # a token greedy emits mid-generation: the second end id
    first = next(t for t in range(3, 128) if t not in free)  # never emitted
    eos = [first, stop]
    # As Llama 3 Instruct ships them: config.json has one id, generation_config.json (what
    # transformers' generate reads) the list.
    model.config.eos_token_id = first
    model.generation_config.eos_token_id = eos
    try:
        model.save_pretrained(tmp_path / "hf")
        with torch.no_grad():
            want = model.generate(prompt, attention_mask=torch.ones_like(prompt),
                                  max_new_tokens=16, do_sample=False, eos_token_id=eos,
                                  pad_token_id=first)[0, 11:].tolist()
    finally:
        model.config.eos_token_id = model.generation_config.eos_token_id = 2
    out = convert(tmp_path / "hf", tmp_path / "wf", 1, "fp32").output_dir
    cfg = GptConfig.from_ini(out / "config.ini")
    assert (cfg.end_id, cfg.extra_end_ids, cfg.end_ids) == (first, str(stop), (first, stop))
    gpt = GPT.from_pretrained(out, backend="reference", max_batch=1, max_seq_len=64)
    assert gpt.end_ids == (first, stop)
    got = gpt.generate([prompt[0].tolist()], 16).tokens[0][0]
    assert got == want[:want.index(stop) + 1] and got[-1] == stop, (got, want)
    # With stop words of the caller's own (shared, and per row) the end ids still apply.
    assert gpt.generate([prompt[0].tolist()], 16, stop_words=[[127, 126]]).tokens[0][0] == got
    assert gpt.generate([prompt[0].tolist()], 16, stop_words=[[[127]]]).tokens[0][0] == got
    # An explicit end_id replaces the list: the row runs on past `stop`.
    assert gpt.generate([prompt[0].tolist()], 16, end_id=first).tokens[0][0] == free
    for kwargs, what in ((dict(min_length=3), "min_length > 0"),
                         (dict(num_beams=3), "num_beams > 1")):
        with pytest.raises(ValueError, match=rf"{what} with the checkpoint's several end ids "
                                             rf"\[{first}, {stop}\] is not supported"):
            gpt.generate([prompt[0].tolist()], 10, **kwargs)
    # ... and with end_id given they run as for any model.
    beam = gpt.generate([prompt[0].tolist()], 10, num_beams=3, end_id=first).tokens[0][0]
    assert len(beam) == 10
    # warpformer generate: a row ends at either id (streamed too, with nothing after it), and
    # beam search runs on the first id alone, with a note.
    ids_arg = ",".join(map(str, prompt[0].tolist()))
    for extra_args in ([], ["--stream"]):
        rc, out_text, err = _cli("--model", out, "--input-ids", ids_arg, "--max-new-tokens", 16,
                                 "--output-format", "ids", *extra_args)
        assert rc == 0, err
        assert [int(t) for t in out_text.strip().split(",")] == got, (extra_args, out_text)
    rc, _, err = _cli("--model", out, "--input-ids", ids_arg, "--max-new-tokens", 4,
                      "--num-beams", 2)
    assert rc == 0 and f"only the first of the model's end ids [{first}, {stop}]" in err, err
    with pytest.raises(ConfigError, match=r"extra_end_ids \[500\] outside \[0, vocab_size"):
        dataclasses.replace(cfg, extra_end_ids="500")
    with pytest.raises(ConfigError, match=r"extra_end_ids must be comma-separated token ids"):
        dataclasses.replace(cfg, extra_end_ids="7;8")


def _as_mistral(model: transformers.PreTrainedModel, window: int) -> transformers.PreTrainedModel:
    """The Llama ``model``'s weights in a Mistral model with a sliding window of ``window``
    (the same parameter names): transformers' reference for a bounded attention window."""
    d = model.config.to_dict()
    keep = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
            "rms_norm_eps", "rope_theta", "bos_token_id", "eos_token_id")
    cfg = transformers.MistralConfig(**{k: d[k] for k in keep if k in d}, sliding_window=window)
    cfg._attn_implementation = "eager"
    mistral = transformers.MistralForCausalLM(cfg).eval()
    mistral.load_state_dict(model.state_dict())
    return mistral


def test_memory_len_equals_a_sliding_window(models, tmp_path):
    """generate(memory_len=N) on a model without a window: every token attends to its last N
    positions, prompt and generated alike: greedy tokens and log probs equal transformers'
    Mistral (a sliding window of N) over the same weights; memory_len=0 is no window; on a
    model with its own window the narrower one applies; a negative memory_len is refused."""
    model, folder = models["llama-gqa"]
    window = 6
    mistral = _as_mistral(model, window)
    prompt = torch.randint(3, 128, (1, 15), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = mistral.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12,
                                do_sample=False, eos_token_id=None,
                                pad_token_id=0)[0, 15:].tolist()
        plain = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12,
                               do_sample=False, eos_token_id=None,
                               pad_token_id=0)[0, 15:].tolist()
    assert want != plain  # the window changes the text, so the test can tell
    out = convert(folder, tmp_path, 2, "fp32").output_dir
    gpt = GPT.from_pretrained(out, backend="reference", max_batch=2, max_seq_len=64)
    row = [prompt[0].tolist()]
    got = gpt.generate(row, 12, end_id=0, memory_len=window, return_log_probs=True)
    assert got.tokens[0][0] == want
    assert gpt.generate(row, 12, end_id=0, memory_len=0).tokens[0][0] == plain
    assert gpt.generate(row, 12, end_id=0).tokens[0][0] == plain  # the call before left nothing
    # A forward pass between the steps of a windowed stream leaves the stream's window alone.
    stream = gpt.generate_stream(row, 12, end_id=0, memory_len=window)
    streamed = [int(t) for t in next(stream).reshape(-1)]
    gpt.logits(row)
    for step in stream:
        streamed += [int(t) for t in step.reshape(-1)]
    assert streamed[:len(want)] == want
    # Mistral's own window of 5 with memory_len 6: the narrower (5) applies.
    m_model, m_folder = models["mistral-window"]
    m_gpt = GPT.from_pretrained(convert(m_folder, tmp_path / "m", 1, "fp32").output_dir,
                                backend="reference", max_batch=1, max_seq_len=64)
    assert (m_gpt.generate(row, 8, end_id=0, memory_len=6).tokens
            == m_gpt.generate(row, 8, end_id=0).tokens)
    with pytest.raises(ValueError, match=r"option 'memory_len' must be >= 0 \(0: no window\)"):
        gpt.generate(row, 4, memory_len=-1)


@pytest.mark.parametrize("scheme", [QuantScheme("int8"), QuantScheme("int4", 16),
                                    QuantScheme("int4", 16, True)], ids=str)
def test_weight_quant_llama(scheme, tmp_path):
    """int8 / int4 Llama weights (the gated MLP's gate included, grouped-query QKV with one K/V
    head copied on both ranks): converted at TP 1 and 2 they give the same logits (every split
    falls on the quantization's rows and groups), quantizing at load equals the converted
    folder, and the error against the fp16 weights is int8's / int4's size."""
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=1, max_position_embeddings=256)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).eval().half().save_pretrained(tmp_path / "hf")
    ids = torch.randint(3, 128, (2, 10), generator=torch.Generator().manual_seed(3))
    dense_dir = convert(tmp_path / "hf", tmp_path / "dense", 1, "fp16").output_dir
    dense = GPT.from_pretrained(dense_dir, backend="reference").logits(ids).float()
    got = {}
    for tp in (1, 2):
        out = convert(tmp_path / "hf", tmp_path / f"q{tp}", tp, "fp16",
                      weight_quant=scheme).output_dir
        assert (out / "model.layers.0.mlp.gate.weight_scale.0.bin").exists()
        got[tp] = GPT.from_pretrained(out, backend="reference").logits(ids).float()
    torch.testing.assert_close(got[2], got[1], rtol=0, atol=0)
    at_load = GPT.from_pretrained(dense_dir, backend="reference", weight_quant=scheme)
    torch.testing.assert_close(at_load.logits(ids).float(), got[1], rtol=0, atol=0)
    err = float((got[1] - dense).abs().max() / dense.abs().max())
    assert 1e-4 < err < (0.05 if scheme.mode == "int8" else 0.3), err


def test_engine_refuses_what_its_kernels_lack(models, tmp_path):
    out = convert(models["llama-gqa"][1], tmp_path / "gqa", 1, "fp32").output_dir
    # A head size the attention kernels have (the tiny models' 16 is refused first).
    cfg = dataclasses.replace(GptConfig.from_ini(out / "config.ini"), size_per_head=32,
                              parallel_residual=True)
    with pytest.raises(RuntimeError, match=r"a gated MLP beside the attention or after a "
                                           r"post-norm is not supported by the CUDA engine yet; "
                                           r"backend='reference' runs"):
        torch.classes.warpformer.GptModel(cfg.to_json(), {}, "{}")
    with pytest.raises(RuntimeError, match=r"rope_scaling_type must be none, linear, dynamic, "
                                           r"llama3 or yarn, got 'ntk'"):
        torch.classes.warpformer.GptModel(
            cfg.to_json().replace('"rope_scaling_type": "none"', '"rope_scaling_type": "ntk"'),
            {}, "{}")


def test_bad_configs_are_named(models, tmp_path):
    base = dict(head_num=4, size_per_head=16, inter_size=96, num_layer=2, vocab_size=128,
                layernorm_type="rmsnorm", has_positional_encoding=False)
    with pytest.raises(ConfigError, match=r"kv_head_num \(3\) must divide head_num \(4\)"):
        GptConfig(**base, kv_head_num=3)
    with pytest.raises(ConfigError, match=r"kv_head_num \(2\) and tensor_para_size \(3\)"):
        GptConfig(**{**base, "head_num": 6, "inter_size": 96}, kv_head_num=2, tensor_para_size=3)
    with pytest.raises(ConfigError, match="rope_scaling_type = llama3 needs rotary"):
        GptConfig(**base, rope_scaling_type="llama3", rope_scaling_factor=8.0,
                  rope_scaling_original_max_position=32)
    with pytest.raises(ConfigError, match="rope_scaling_type must be one of"):
        GptConfig(**base, rotary_embedding_dim=16, rope_scaling_type="longrope")
    model, folder = models["qwen2-tied"]
    cfg = model.config.to_dict()
    cfg.update(use_sliding_window=True, sliding_window=4)
    bad = tmp_path / "qwen-window"
    model.save_pretrained(bad)
    transformers.Qwen2Config(**{k: v for k, v in cfg.items() if k != "transformers_version"}
                             ).save_pretrained(bad)
    with pytest.raises(ConversionError, match="use_sliding_window"):
        convert(bad, tmp_path / "out", 1, "fp32")
