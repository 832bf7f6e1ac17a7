"""The encoder-decoder weight table is the engine's (torch.ops.warpformer.t5_weight_table,
csrc/models/t5/t5_weights.cpp): every file, shape, split, per-rank bias, layer, stack and role of
docs/FORMAT.md's T5 and BART tables for real models' shapes at tp 1 and 2, what
warpformer.t5_weights derives from it, and T5Config::from_json's errors, which name the key."""

from __future__ import annotations

import json

import pytest
import torch

from warpformer.config import ConfigError
from warpformer.t5_config import T5Config, T5StackConfig
from warpformer.t5_weights import layer_names, model_names, t5_weight_specs


def _t5(model_type: str, proj: str, vocab: int, d: int, d_kv: int, d_ff: int, layers: int,
        heads: int, tp: int, decoder_layers: int | None = None, tied: bool = False) -> T5Config:
    def stack(n: int) -> T5StackConfig:
        return T5StackConfig(vocab_size=vocab, d_model=d, d_kv=d_kv, d_ff=d_ff, num_layers=n,
                             num_heads=heads, feed_forward_proj=proj)

    return T5Config(stack(layers), stack(decoder_layers or layers), tie_word_embeddings=tied,
                    tensor_para_size=tp, model_type=model_type)


def _bart(model_type: str, vocab: int, d: int, heads: int, d_ff: int, layers: int, positions: int,
          tp: int) -> T5Config:
    def stack(ff: int, n: int) -> T5StackConfig:
        return T5StackConfig(vocab_size=vocab, d_model=d, d_kv=d // heads, d_ff=ff, num_layers=n,
                             num_heads=heads, layer_norm_epsilon=1e-5, feed_forward_proj="gelu",
                             max_pos_seq_len=positions)

    # The decoder differs from the encoder (FFN width, depth) to catch a stack's shape taken
    # from the other.
    return T5Config(stack(d_ff, layers), stack(d_ff + 8 * tp, layers + 1), pad_token_id=1,
                    eos_token_id=2, decoder_start_token_id=2, tie_word_embeddings=False,
                    tensor_para_size=tp, model_type=model_type)


# name -> builder(tp): the shapes of real checkpoints (UL2 with fewer layers: its width, d_kv 256
# and gated SiLU are what matter).
CONFIGS = {
    "t5-small": lambda tp: _t5("t5", "relu", 32128, 512, 64, 2048, 6, 8, tp, tied=True),
    "t5-v1_1-small": lambda tp: _t5("t5", "gated-gelu", 32128, 512, 64, 1024, 8, 6, tp),
    "mt5-small": lambda tp: _t5("mt5", "gated-gelu", 250112, 512, 64, 1024, 8, 6, tp),
    "ul2-shaped": lambda tp: _t5("t5", "gated-silu", 32128, 4096, 256, 16384, 4, 16, tp,
                                 decoder_layers=3),
    "bart-base": lambda tp: _bart("bart", 50265, 768, 12, 3072, 6, 1024, tp),
    "mbart-large": lambda tp: _bart("mbart", 250027, 1024, 16, 4096, 12, 1024, tp),
}


def _expected(c: T5Config) -> dict[str, tuple]:
    """docs/FORMAT.md's tables: name -> (full shape, split axis, layer, per_rank, stack, role)."""
    V, d = c.vocab_size, c.d_model
    out: dict[str, tuple] = {}

    def add(name, shape, split=None, layer=None, stack="", role="", per_rank=False, bias=None):
        out[name] = (tuple(shape), split, layer, per_rank, stack, role)
        if bias is not None and c.is_bart:  # [*out] split with the output axis; rows: whole
            b_shape = shape if len(shape) == 1 else shape[1:]
            b_split = None if split in (None, 0) else split - 1
            out[bias] = (tuple(b_shape), b_split, layer, split == 0, stack, role + "_bias")

    if c.is_bart:
        add("decoder.lm_head.weight", (V, d), role="lm_head")
        add("decoder.final_logits_bias", (V,), role="logits_bias")
    else:
        add("shared.weight_T", (V, d), role="embedding")
        add("lm_head.weight", (V, d), role="lm_head")
    for s in ("encoder", "decoder"):
        st = getattr(c, s)
        inner, f, n = st.num_heads * st.d_kv, st.d_ff, st.num_heads
        if c.is_bart:
            add(f"{s}.embed_tokens.weight", (V, d), role=f"{s}_embedding")
            add(f"{s}.embed_positions.weight", (st.max_pos_seq_len, d), role=f"{s}_positions")
            add(f"{s}.final_layer_norm.weight", (d,), role=f"{s}_embedding_norm",
                bias=f"{s}.final_layer_norm.bias")
            if c.model_type == "mbart":
                add(f"{s}.layer_norm.weight", (d,), role=f"{s}_final_norm",
                    bias=f"{s}.layer_norm.bias")
        else:
            add(f"{s}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                (n, st.relative_attention_num_buckets), 0, 0, role=f"{s}_positions")
            add(f"{s}.final_layer_norm.weight", (d,), role=f"{s}_final_norm")
        for i in range(st.num_layers):
            if c.is_bart:
                sa, ca = f"{s}.{i}.layer.SelfAttention.", f"{s}.{i}.layer.CrossAttention."
                names = {"self_norm": sa + "attn_layer_norm", "self_o": sa + "out_proj",
                         "cross_norm": ca + "attn_layer_norm", "cross_o": ca + "out_proj",
                         "ffn_norm": sa + "final_layer_norm", "ffn_in": sa + "fc1",
                         "ffn_out": sa + "fc2"}
            else:
                b = f"{s}.block.{i}.layer."
                sa, ca = b + "0.SelfAttention.", b + "1.EncDecAttention."
                ffn = b + ("2." if s == "decoder" else "1.")
                names = {"self_norm": b + "0.layer_norm", "self_o": sa + "o",
                         "cross_norm": b + "1.layer_norm", "cross_o": ca + "o",
                         "ffn_norm": ffn + "layer_norm", "ffn_in": ffn + "DenseReluDense.wi",
                         "ffn_gate": ffn + "DenseReluDense.wi2",
                         "ffn_out": ffn + "DenseReluDense.wo"}
            names.update({f"self_{m}": sa + m for m in "qkv"})
            names.update({"self_qkv": sa + "qkv"}, **{f"cross_{m}": ca + m for m in "qkv"})
            shapes = {"self_o": ((inner, d), 0), "cross_o": ((inner, d), 0),
                      "ffn_in": ((d, f), 1), "ffn_gate": ((d, f), 1), "ffn_out": ((f, d), 0),
                      "self_qkv": ((d, 3, inner), 2)}
            roles = ["self_norm", "self_qkv"] if s == "decoder" else ["self_norm", "self_q",
                                                                        "self_k", "self_v"]
            roles += ["self_o"]
            if s == "decoder":
                roles += ["cross_norm", "cross_q", "cross_k", "cross_v", "cross_o"]
            roles += ["ffn_norm", "ffn_in"] + (["ffn_gate"] if st.gated else []) + ["ffn_out"]
            for role in roles:
                shape, split = ((d,), None) if role.endswith("norm") else \
                    shapes.get(role, ((d, inner), 1))
                add(names[role] + ".weight", shape, split, i, s, role, bias=names[role] + ".bias")
    return out


def _table(c: T5Config) -> list[dict]:
    return json.loads(torch.ops.warpformer.t5_weight_table(c.to_json()))


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_table_is_the_format(name, tp):
    c = CONFIGS[name](tp)
    table = _table(c)
    got = {e["name"]: (tuple(e["shape"]), e["split"], e["layer"], e["per_rank"], e["stack"],
                       e["role"]) for e in table}
    assert len(got) == len(table)  # no name twice
    want = _expected(c)
    assert sorted(set(got) ^ set(want)) == []
    assert {k: v for k, v in got.items() if v != want[k]} == {}
    assert all(e["stage"] == "" and not e["optional"] and e["dtype"] is None for e in table)
    # Each rank's files: heads and FFN columns divide, row-parallel biases stay whole.
    specs = t5_weight_specs(c)
    assert {k: (s.shape, s.split_axis, s.layer, s.per_rank) for k, s in specs.items()} == \
        {k: v[:4] for k, v in want.items()}
    dec = c.decoder
    qkv = next(k for k, v in want.items() if v[5] == "self_qkv" and v[2] == 0)
    assert specs[qkv].shard_shape(tp) == (c.d_model, 3, dec.num_heads * dec.d_kv // tp)
    wo = next(k for k, v in want.items() if v[5] == "ffn_out" and v[4] == "decoder")
    assert specs[wo].shard_shape(tp) == (dec.d_ff // tp, c.d_model)
    if c.is_bart:
        bias = "decoder.0.layer.SelfAttention.fc2.bias"
        assert specs[bias].ranked and specs[bias].shard_shape(tp) == (c.d_model,)
    else:
        table0 = "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
        assert specs[table0].shard_shape(tp) == (dec.num_heads // tp, 32)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_names_by_role(name):
    """model_names / layer_names are the table's roles (biases beside their weights left out)."""
    c = CONFIGS[name](2)
    want = _expected(c)
    bias_roles = {v[5] for v in want.values() if v[5].endswith("_bias") and v[5] != "logits_bias"}
    models = {v[5]: k for k, v in want.items() if not v[4] and v[5] not in bias_roles}
    if "embedding" in models:  # T5: one table, both stacks
        models["encoder_embedding"] = models["decoder_embedding"] = models.pop("embedding")
    assert model_names(c) == models
    for s in ("encoder", "decoder"):
        for i in (0, getattr(c, s).num_layers - 1):
            assert layer_names(c, s, i) == {v[5]: k for k, v in want.items()
                                            if v[4] == s and v[2] == i and v[5] not in bias_roles}
    last = c.decoder.num_layers - 1
    if c.is_bart:
        assert layer_names(c, "decoder", last)["ffn_out"] == \
            f"decoder.{last}.layer.SelfAttention.fc2.weight"
        assert model_names(c)["logits_bias"] == "decoder.final_logits_bias"
    else:
        assert layer_names(c, "decoder", last)["cross_v"] == \
            f"decoder.block.{last}.layer.1.EncDecAttention.v.weight"
        assert model_names(c)["decoder_embedding"] == "shared.weight_T"
        assert ("ffn_gate" in layer_names(c, "encoder", 0)) == c.encoder.gated


def test_gpt_entries_have_no_role():
    """GPT-family entries share the table's form: no stack, no role, nothing per rank."""
    from warpformer.config import GptConfig

    cfg = GptConfig(head_num=2, size_per_head=16, inter_size=64, num_layer=1, vocab_size=50,
                    max_pos_seq_len=16)
    table = json.loads(torch.ops.warpformer.gpt_weight_table(cfg.to_json()))
    assert all(e["stack"] == "" and e["role"] == "" and not e["per_rank"] for e in table)


# ----------------------------------------------------------------------------- config errors
def _json(**change) -> str:
    c = json.loads(CONFIGS["t5-v1_1-small"](1).to_json())
    for key, value in change.items():
        if value is None:
            del c[key]
        else:
            c[key] = value
    return json.dumps(c)


def _bart_json(**change) -> str:
    c = json.loads(CONFIGS["bart-base"](1).to_json())
    c.update(change)
    return json.dumps(c)


@pytest.mark.parametrize("text,message", [
    (_json(encoder_d_model=None), r"required key 'encoder_d_model' is missing"),
    (_json(vocab_size=None), r"required key 'vocab_size' is missing"),
    (_json(decoder_num_head=6), r"unknown key 'decoder_num_head'"),
    (_json(model_type="t6"), r"model_type must be one of t5, mt5, bart, mbart, got 't6'"),
    (_json(decoder_num_heads=7, tensor_para_size=2),
     r"decoder_num_heads \(7\) must be divisible by tensor_para_size \(2\)"),
    (_json(encoder_d_ff=1000, tensor_para_size=16),
     r"encoder_num_heads \(6\) must be divisible by tensor_para_size \(16\)"),
    (_json(encoder_d_ff=1031, tensor_para_size=2),
     r"encoder_d_ff \(1031\) must be divisible by tensor_para_size \(2\)"),
    (_json(decoder_d_kv=0), r"decoder_d_kv must be positive, got 0"),
    (_json(encoder_relative_attention_num_buckets=-1),
     r"encoder_relative_attention_num_buckets must be positive"),
    (_json(decoder_layer_norm_epsilon=0.0), r"decoder_layer_norm_epsilon must be positive"),
    (_json(encoder_activation="swoosh"), r"encoder_activation must be one of gelu_tanh, "
                                         r"gelu_erf, relu, silu; got 'swoosh'"),
    (_json(decoder_num_layers=2.5), r"'decoder_num_layers' must be an integer"),
    (_json(encoder_gated="yes"), r"'encoder_gated' must be a boolean"),
    (_json(decoder_gated=False), r"encoder_gated \(true\) must equal decoder_gated \(false\)"),
    (_json(decoder_d_model=768), r"encoder_d_model \(512\) must equal decoder_d_model \(768\)"),
    (_json(weight_data_type="int3"), r"weight_data_type must be one of fp32, fp16, bf16"),
    (_json(eos_token_id=32128), r"eos_token_id \(32128\) must be in \[0, vocab_size = 32128\)"),
    (_json(tensor_para_size=0), r"tensor_para_size must be positive, got 0"),
    (_bart_json(decoder_max_pos_seq_len=0), r"decoder_max_pos_seq_len \(rows of the learned "
                                            r"position table\) must be >= 1 for bart"),
    (_bart_json(encoder_gated=True, decoder_gated=True),
     r"encoder_gated must be false: the BART family has no gated FFN"),
    (_bart_json(tie_word_embeddings=True), r"tie_word_embeddings .* must be false for bart"),
    ("{\"vocab_size\": [1]}", r"vocab_size"),
])
def test_config_errors_name_the_key(text, message):
    with pytest.raises(RuntimeError, match=rf"T5Model config.*{message}"):
        torch.ops.warpformer.t5_weight_table(text)


def test_format_table_takes_any_head_size():
    """The table is the format's: a head size the attention kernels lack (6) still has one (the
    reference backend runs it); only the engine refuses it."""
    c = _t5("t5", "relu", 96, 32, 6, 40, 2, 4, 2)
    assert t5_weight_specs(c)["encoder.block.1.layer.0.SelfAttention.q.weight"].shard_shape(2) == \
        (32, 12)


def test_engine_refusal_is_a_config_error():
    """A config the table's rules refuse raises ConfigError from t5_weight_specs."""
    c = CONFIGS["t5-small"](1)
    c.weight_data_type = "int3"  # set after validation, as a converter's output may
    with pytest.raises(ConfigError, match=r"weight_data_type must be one of fp32, fp16, bf16"):
        t5_weight_specs(c)
