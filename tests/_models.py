"""Tiny randomly initialised HF models and checkpoint writers shared by the converter tests.

Every parameter (layernorm gains and biases included) is drawn at random, so a mis-mapped or
mis-laid-out tensor changes the logits. Sizes keep head counts divisible by 4 (tp 4) and the whole
suite fast on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import transformers

VOCAB = 96
HIDDEN = 32
HEADS = 4
LAYERS = 2
POSITIONS = 32


def _gpt2(**kw) -> transformers.PreTrainedModel:
    cfg = dict(vocab_size=VOCAB, n_embd=HIDDEN, n_head=HEADS, n_layer=LAYERS, n_positions=POSITIONS,
               n_inner=3 * HIDDEN, bos_token_id=1, eos_token_id=2)
    cfg.update(kw)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(**cfg))


def _opt(**kw) -> transformers.PreTrainedModel:
    cfg = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_attention_heads=HEADS,
               num_hidden_layers=LAYERS, ffn_dim=3 * HIDDEN, max_position_embeddings=POSITIONS,
               word_embed_proj_dim=HIDDEN, pad_token_id=1, bos_token_id=2, eos_token_id=2)
    cfg.update(kw)
    return transformers.OPTForCausalLM(transformers.OPTConfig(**cfg))


def _bloom(**kw) -> transformers.PreTrainedModel:
    cfg = dict(vocab_size=VOCAB, hidden_size=HIDDEN, n_head=HEADS, n_layer=LAYERS)
    cfg.update(kw)
    return transformers.BloomForCausalLM(transformers.BloomConfig(**cfg))


def _gptj(**kw) -> transformers.PreTrainedModel:
    cfg = dict(vocab_size=VOCAB, n_embd=HIDDEN, n_head=HEADS, n_layer=LAYERS, n_positions=POSITIONS,
               rotary_dim=4, bos_token_id=1, eos_token_id=2)
    cfg.update(kw)
    return transformers.GPTJForCausalLM(transformers.GPTJConfig(**cfg))


def _gptneox(**kw) -> transformers.PreTrainedModel:
    cfg = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_attention_heads=HEADS,
               num_hidden_layers=LAYERS, intermediate_size=3 * HIDDEN,
               max_position_embeddings=POSITIONS, rotary_pct=0.5, rotary_emb_base=1000,
               bos_token_id=1, eos_token_id=2)
    cfg.update(kw)
    return transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**cfg))


# Tiny shapes the CUDA engine runs (head sizes the kernels support: 32, 48, ..., 256 as FT's, a
# few of them here; every width a multiple of 32, so int4 groups of 32 fit too): the GPU tests'
# models (tests/gpu/test_gpt_engine.py, test_quant_engine.py).
ENGINE_TINY = {
    "gpt2": lambda: transformers.GPT2Config(vocab_size=1000, n_embd=128, n_head=2, n_layer=2,
                                            n_positions=512, bos_token_id=1, eos_token_id=2),
    "opt": lambda: transformers.OPTConfig(vocab_size=1000, hidden_size=128, num_attention_heads=2,
                                          num_hidden_layers=2, ffn_dim=512,
                                          max_position_embeddings=512, word_embed_proj_dim=128,
                                          pad_token_id=1, bos_token_id=2, eos_token_id=2),
    "opt-350m-style": lambda: transformers.OPTConfig(
        vocab_size=1000, hidden_size=128, num_attention_heads=2, num_hidden_layers=2,
        ffn_dim=512, max_position_embeddings=512, word_embed_proj_dim=64,
        do_layer_norm_before=False, pad_token_id=1, bos_token_id=2, eos_token_id=2),
    "bloom": lambda: transformers.BloomConfig(vocab_size=1000, hidden_size=192, n_head=3,
                                              n_layer=2, bos_token_id=1, eos_token_id=2),
    "gptj": lambda: transformers.GPTJConfig(vocab_size=1000, n_embd=256, n_head=4, n_layer=2,
                                            rotary_dim=32, n_positions=512, bos_token_id=1,
                                            eos_token_id=2),
    "gptneox-parallel": lambda: transformers.GPTNeoXConfig(
        vocab_size=1000, hidden_size=160, num_attention_heads=2, num_hidden_layers=2,
        intermediate_size=640, max_position_embeddings=512, rotary_pct=0.25,
        use_parallel_residual=True, bos_token_id=1, eos_token_id=2),
    "gptneox-sequential": lambda: transformers.GPTNeoXConfig(
        vocab_size=1000, hidden_size=160, num_attention_heads=2, num_hidden_layers=2,
        intermediate_size=640, max_position_embeddings=512, rotary_pct=0.25,
        use_parallel_residual=False, bos_token_id=1, eos_token_id=2),
    # Pythia-14m's widths: 32-wide heads with 8 rotary dims.
    "pythia-head32": lambda: transformers.GPTNeoXConfig(
        vocab_size=1000, hidden_size=128, num_attention_heads=4, num_hidden_layers=2,
        intermediate_size=512, max_position_embeddings=512, rotary_pct=0.25,
        use_parallel_residual=True, bos_token_id=1, eos_token_id=2),
    "gpt2-head160": lambda: transformers.GPT2Config(vocab_size=1000, n_embd=320, n_head=2,
                                                    n_layer=2, n_positions=512, bos_token_id=1,
                                                    eos_token_id=2),
    # RMSNorm, the gated SiLU MLP, grouped-query attention (4 query heads over 2 K/V heads).
    "llama-gqa": lambda: transformers.LlamaConfig(
        vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=1, eos_token_id=2),
}


# name -> builder; the names are the test ids.
MODELS = {
    "gpt2": _gpt2,
    "opt-125m": _opt,
    "opt-350m": lambda: _opt(word_embed_proj_dim=16, do_layer_norm_before=False),
    "bloom": _bloom,
    "gptj": _gptj,
    "gptneox-parallel": lambda: _gptneox(use_parallel_residual=True),
    "gptneox-sequential": lambda: _gptneox(use_parallel_residual=False, hidden_act="gelu_new"),
}


def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Draw every parameter at random (norm gains around 1) so that no tensor is trivial."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if "norm" in name or "ln_" in name or "layer_norm" in name:
                p.copy_((1.0 + 0.2 * noise) if name.endswith("weight") else 0.2 * noise)
            else:
                p.copy_(0.3 * noise if p.dim() >= 2 and "emb" not in name else 0.5 * noise)
    return model.eval()


def build(name: str, seed: int = 0) -> transformers.PreTrainedModel:
    """A random tiny HF model of kind ``name`` (a key of :data:`MODELS`), eager attention."""
    torch.manual_seed(seed)
    model = MODELS[name]()
    model.config._attn_implementation = "eager"
    return randomize(model, seed)


def hf_logits(model: transformers.PreTrainedModel, ids: torch.Tensor) -> torch.Tensor:
    """fp32 logits ``[B, S, V]`` of ``model`` for unpadded ``ids`` ``[B, S]``."""
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits.float()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|."""
    return float((a - b).abs().max() / b.abs().max())


def save_safetensors(model: transformers.PreTrainedModel, path: Path,
                     max_shard_size: str | None = None) -> Path:
    """``save_pretrained`` (safetensors; sharded with an index json if ``max_shard_size``)."""
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(path, **kwargs)
    return path


def save_bin(model: transformers.PreTrainedModel, path: Path, shards: int = 1) -> Path:
    """Legacy ``pytorch_model.bin`` (tied tensors under both names, like transformers 4 wrote),
    split into ``shards`` files with ``pytorch_model.bin.index.json`` when ``shards > 1``."""
    from safetensors.torch import load_file

    # save_pretrained applies transformers' on-disk names (e.g. NeoX "embed_out"); reuse them.
    model.save_pretrained(path)
    sd = load_file(path / "model.safetensors")
    (path / "model.safetensors").unlink()
    if "lm_head.weight" not in sd and model.config.tie_word_embeddings:
        sd["lm_head.weight"] = model.get_input_embeddings().weight.detach().clone()
    if shards == 1:
        torch.save(sd, path / "pytorch_model.bin")
        return path
    keys = list(sd)
    weight_map = {}
    for s in range(shards):
        name = f"pytorch_model-{s + 1:05d}-of-{shards:05d}.bin"
        part = {k: sd[k] for k in keys[s::shards]}
        torch.save(part, path / name)
        weight_map.update(dict.fromkeys(part, name))
    (path / "pytorch_model.bin.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path


# --------------------------------------------------------------------------- Megatron
def megatron_from_gpt2(model: transformers.GPT2LMHeadModel, root: Path, tp: int, pp: int = 1,
                       version: float = 3.0, openai_gelu: bool = True,
                       untie: bool = False) -> Path:
    """Write ``model`` (a GPT-2, which is Megatron's GPT architecture) as a Megatron-LM checkpoint
    trained with ``tp``/``pp``: ``root/latest_checkpointed_iteration.txt`` and
    ``root/iter_0000010/mp_rank_XX[_YYY]/model_optim_rng.pt``, QKV rows in the per-shard layout
    of checkpoint ``version`` (0: [3, heads, d]; 1.0: [heads, d, 3]; 2.0+: [heads, 3, d])."""
    c = model.config
    h, n, d, L = c.n_embd, c.n_head, c.n_embd // c.n_head, c.n_layer
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    g = lambda k: sd["transformer." + k]  # noqa: E731
    per_stage = L // pp
    old = version == 0  # v0-era naming: "transformer" + "attention"
    attn = "attention" if old else "self_attention"

    def shard(t: torch.Tensor, dim: int, r: int) -> torch.Tensor:
        return t.chunk(tp, dim=dim)[r].clone()

    def qkv(t: torch.Tensor, r: int) -> torch.Tensor:
        # Megatron [out, in] rows ordered [3, heads, d]; take this rank's heads.
        rest = t.shape[1:]
        part = t.reshape(3, n, d, *rest).chunk(tp, dim=1)[r]  # [3, n/tp, d, ...]
        if version == 0:
            out = part
        elif version == 1.0:
            out = part.permute(1, 2, 0, *range(3, part.dim()))  # [n/tp, d, 3, ...]
        else:
            out = part.transpose(0, 1)  # [n/tp, 3, d, ...]
        return out.reshape(-1, *rest).clone()

    args = argparse.Namespace(
        num_layers=L, hidden_size=h, num_attention_heads=n, ffn_hidden_size=c.n_inner or 4 * h,
        max_position_embeddings=c.n_positions, padded_vocab_size=c.vocab_size,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        openai_gelu=openai_gelu, bias_gelu_fusion=False, layernorm_epsilon=c.layer_norm_epsilon,
        untie_embeddings_and_output_weights=untie,
    )
    it_dir = root / "iter_0000010"
    for p in range(pp):
        for r in range(tp):
            enc: dict[str, torch.Tensor] = {}
            for local in range(per_stage):
                i = p * per_stage + local
                src, dst = f"h.{i}.", f"layers.{local}."
                enc[dst + "input_layernorm.weight"] = g(src + "ln_1.weight")
                enc[dst + "input_layernorm.bias"] = g(src + "ln_1.bias")
                enc[dst + f"{attn}.query_key_value.weight"] = qkv(
                    g(src + "attn.c_attn.weight").t(), r)
                enc[dst + f"{attn}.query_key_value.bias"] = qkv(g(src + "attn.c_attn.bias"), r)
                enc[dst + f"{attn}.dense.weight"] = shard(g(src + "attn.c_proj.weight").t(), 1, r)
                enc[dst + f"{attn}.dense.bias"] = g(src + "attn.c_proj.bias")
                enc[dst + "post_attention_layernorm.weight"] = g(src + "ln_2.weight")
                enc[dst + "post_attention_layernorm.bias"] = g(src + "ln_2.bias")
                enc[dst + "mlp.dense_h_to_4h.weight"] = shard(g(src + "mlp.c_fc.weight").t(), 0, r)
                enc[dst + "mlp.dense_h_to_4h.bias"] = shard(g(src + "mlp.c_fc.bias"), 0, r)
                enc[dst + "mlp.dense_4h_to_h.weight"] = shard(
                    g(src + "mlp.c_proj.weight").t(), 1, r)
                enc[dst + "mlp.dense_4h_to_h.bias"] = g(src + "mlp.c_proj.bias")
            lm: dict[str, object] = {}
            if p == 0:
                lm["embedding"] = {
                    "word_embeddings": {"weight": shard(g("wte.weight"), 0, r)},
                    "position_embeddings": {"weight": g("wpe.weight")},
                }
            if p == pp - 1:
                enc["final_layernorm.weight"] = g("ln_f.weight")
                enc["final_layernorm.bias"] = g("ln_f.bias")
                if untie:
                    lm["output_layer"] = {"weight": shard(sd["lm_head.weight"], 0, r)}
            lm["transformer" if old else "encoder"] = enc
            state = {"model": {"language_model": lm}, "args": args, "iteration": 10}
            if version != 0:
                state["checkpoint_version"] = version
            name = f"mp_rank_{r:02d}" + (f"_{p:03d}" if pp > 1 else "")
            (it_dir / name).mkdir(parents=True, exist_ok=True)
            torch.save(state, it_dir / name / "model_optim_rng.pt")
    (root / "latest_checkpointed_iteration.txt").write_text("10")
    return root


# HF class of each config type, for the GPU tests that build models at their own sizes.
ARCH_CLASSES = {
    transformers.GPT2Config: transformers.GPT2LMHeadModel,
    transformers.OPTConfig: transformers.OPTForCausalLM,
    transformers.BloomConfig: transformers.BloomForCausalLM,
    transformers.GPTJConfig: transformers.GPTJForCausalLM,
    transformers.GPTNeoXConfig: transformers.GPTNeoXForCausalLM,
    transformers.LlamaConfig: transformers.LlamaForCausalLM,
}


def make_hf(cfg: transformers.PretrainedConfig, seed: int,
            peak: float = 1.0) -> transformers.PreTrainedModel:
    """A random HF model on the GPU in fp32 (eager attention), norms and biases drawn at random
    too. ``peak`` > 1 scales the output embedding so that top-1 margins exceed numerical noise
    (greedy comparisons)."""
    torch.manual_seed(seed)
    cfg._attn_implementation = "eager"
    with torch.device("cuda"):
        model = ARCH_CLASSES[type(cfg)](cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "ln_" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p) if name.endswith("weight")
                        else 0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.normal_(0, 0.05)
        if peak != 1.0:
            model.get_output_embeddings().weight.mul_(peak)
    return model.eval()


def hf_greedy(hf, ids: torch.Tensor, n: int, steps: int) -> list[int]:
    """HF greedy continuation of ids[:n] (fp32, KV cache), `steps` tokens."""
    tokens = []
    with torch.no_grad():
        out = hf(input_ids=ids[None, :n].long(), use_cache=True)
        for _ in range(steps):
            nxt = out.logits[0, -1].float().argmax()
            tokens.append(int(nxt))
            out = hf(input_ids=nxt.view(1, 1), past_key_values=out.past_key_values,
                     use_cache=True)
    return tokens
