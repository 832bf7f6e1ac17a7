"""HF ``T5ForConditionalGeneration`` / ``MT5ForConditionalGeneration`` -> FT's T5 layout.

Covers original T5 (ReLU FFN, head tied to the embedding with the ``d_model ** -0.5`` rescale),
T5 v1.1 / Flan-T5 (gated-GELU, untied head), mT5 and UL2-shaped gated-SiLU models, any vocabulary.
The layout and its tensor-parallel split are :func:`warpformer.t5_weights.t5_weight_specs`
(``docs/FORMAT.md``, "T5 family"); ``config.ini`` is :class:`warpformer.t5_config.T5Config`.

File names are FT's (``encoder.block.0.layer.0.SelfAttention.q.weight.0.bin``, no ``model.``
prefix). The shared writer names files ``model.<name>[.<rank>].bin``; :class:`FtT5Output`, the
plan's config, drops that prefix inside the temporary folder when the writer asks it to write
``config.ini``, which happens after every tensor was written and checked and before the folder
is renamed into place, so the output stays atomic.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from warpformer.config import ConfigError
from warpformer.t5_config import T5Config, T5StackConfig, t5_activation_name
from warpformer.t5_weights import EMBEDDING, LM_HEAD, t5_weight_specs

from .errors import ConversionError
from .mapping import Plan, Rule, Task, copy, expand, linear, qkv_from_separate, token_id
from .sources import HfCheckpoint

ARCHITECTURES = ("T5ForConditionalGeneration", "MT5ForConditionalGeneration")

_EMBEDDING_SOURCES = "shared.weight|encoder.embed_tokens.weight|decoder.embed_tokens.weight"

E = "encoder.block.{i}.layer."
D = "decoder.block.{i}.layer."


def _rules(gated: bool, head_sources: str) -> tuple[list[Rule], list[Rule], list[Rule]]:
    """``(model, encoder-layer, decoder-layer)`` rules; targets are FT names."""
    model = [
        Rule(EMBEDDING, (_EMBEDDING_SOURCES,), copy),
        Rule(LM_HEAD, (head_sources,), copy),
        Rule("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
             ("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",), linear),
        Rule("decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
             ("decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",), linear),
        Rule("encoder.final_layer_norm.weight", ("encoder.final_layer_norm.weight",), copy),
        Rule("decoder.final_layer_norm.weight", ("decoder.final_layer_norm.weight",), copy),
    ]
    encoder = [Rule(E + "0.layer_norm.weight", (E + "0.layer_norm.weight",), copy)]
    encoder += [Rule(E + f"0.SelfAttention.{m}.weight", (E + f"0.SelfAttention.{m}.weight",),
                     linear) for m in "qkvo"]
    encoder += [Rule(E + "1.layer_norm.weight", (E + "1.layer_norm.weight",), copy)]
    encoder += _ffn_rules(E + "1.DenseReluDense.", gated)
    decoder = [
        Rule(D + "0.layer_norm.weight", (D + "0.layer_norm.weight",), copy),
        Rule(D + "0.SelfAttention.qkv.weight",
             tuple(D + f"0.SelfAttention.{m}.weight" for m in "qkv"), qkv_from_separate),
        Rule(D + "0.SelfAttention.o.weight", (D + "0.SelfAttention.o.weight",), linear),
        Rule(D + "1.layer_norm.weight", (D + "1.layer_norm.weight",), copy),
    ]
    decoder += [Rule(D + f"1.EncDecAttention.{m}.weight", (D + f"1.EncDecAttention.{m}.weight",),
                     linear) for m in "qkvo"]
    decoder += [Rule(D + "2.layer_norm.weight", (D + "2.layer_norm.weight",), copy)]
    decoder += _ffn_rules(D + "2.DenseReluDense.", gated)
    return model, encoder, decoder


def _ffn_rules(p: str, gated: bool) -> list[Rule]:
    """FT names HF's gated ``wi_0`` / ``wi_1`` ``wi`` / ``wi2``."""
    if gated:
        return [Rule(p + "wi.weight", (p + "wi_0.weight",), linear),
                Rule(p + "wi2.weight", (p + "wi_1.weight",), linear),
                Rule(p + "wo.weight", (p + "wo.weight",), linear)]
    return [Rule(p + "wi.weight", (p + "wi.weight",), linear),
            Rule(p + "wo.weight", (p + "wo.weight",), linear)]


def make_config(hf: Any, tp: int, data_type: str) -> T5Config:
    """:class:`T5Config` for a T5/mT5 ``config.json`` (a :class:`~.mapping.ConfigDict`)."""
    where = getattr(hf, "where", "config.json")
    mt5 = hf.get("model_type") == "mt5"
    proj = hf.get("feed_forward_proj") or ("gated-gelu" if mt5 else "relu")
    act = hf.get("dense_act_fn") or t5_activation_name(proj)
    num_layers = hf["num_layers"]

    def stack(layers: int) -> T5StackConfig:
        return T5StackConfig(
            vocab_size=hf["vocab_size"], d_model=hf["d_model"], d_kv=hf["d_kv"], d_ff=hf["d_ff"],
            num_layers=layers, num_heads=hf["num_heads"],
            relative_attention_num_buckets=hf.get("relative_attention_num_buckets", 32),
            relative_attention_max_distance=hf.get("relative_attention_max_distance", 128),
            layer_norm_epsilon=hf.get("layer_norm_epsilon", 1e-6), feed_forward_proj=proj,
            dense_act_fn=act)

    # The rescale before the head: HF 4 (and FT) read it from tie_word_embeddings; transformers 5
    # ties every T5 head and stores the rescale as scale_decoder_outputs; mT5 never rescales there.
    scale = (False if mt5 else hf.get("scale_decoder_outputs",
                                      hf.get("tie_word_embeddings", True) is not False))
    pad = token_id(hf, "pad_token_id", 0)
    try:
        return T5Config(
            encoder=stack(num_layers), decoder=stack(hf.get("num_decoder_layers") or num_layers),
            pad_token_id=pad, eos_token_id=token_id(hf, "eos_token_id", 1),
            decoder_start_token_id=token_id(hf, "decoder_start_token_id", pad),
            tie_word_embeddings=bool(scale), weight_data_type=data_type, tensor_para_size=tp,
            model_type="mt5" if mt5 else "t5")
    except ConfigError as exc:
        raise ConversionError(f"{where}: {exc}") from None


class FtT5Output:
    """The plan's config as the shared writer sees it (``tensor_para_size``,
    ``weight_data_type``, ``to_ini``)."""

    def __init__(self, config: T5Config) -> None:
        self.config = config

    @property
    def tensor_para_size(self) -> int:
        return self.config.tensor_para_size

    @property
    def weight_data_type(self) -> str:
        return self.config.weight_data_type

    @weight_data_type.setter
    def weight_data_type(self, value: str) -> None:
        self.config.weight_data_type = value

    def to_ini(self, path: str | Path) -> None:
        self.config.to_ini(path)


def check_hf_shapes(ckpt: HfCheckpoint, tasks: list[Task]) -> None:
    """Compare the checkpoint's shapes of the tensors ``tasks`` read (the first present of each
    ``a|b`` alternative) with those HF's own seq2seq class has for the same ``config.json``
    (built on the ``meta`` device); skipped if transformers cannot build it."""
    present = [next((n for n in s.split("|") if ckpt.shape(n) is not None), None)
               for t in tasks for s in t.sources]
    names = [n for n in present if n is not None]
    try:
        import transformers
    except ImportError:
        return
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = transformers.AutoConfig.from_pretrained(ckpt.root)
            with torch.device("meta"):
                model = transformers.AutoModelForSeq2SeqLM.from_config(config)
    except Exception:  # our own checks (the format's shapes) still run
        return
    finally:
        transformers.logging.set_verbosity(verbosity)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    wrong = [f"{ckpt.where(n)}: tensor {n!r} has shape {list(ckpt.shape(n))}, "
             f"{type(model).__name__} with this config.json expects {list(expected[n])}"
             for n in dict.fromkeys(names)
             if n in expected and ckpt.shape(n) is not None and ckpt.shape(n) != expected[n]]
    if wrong:
        more = f"\n(and {len(wrong) - 4} more)" if len(wrong) > 4 else ""
        raise ConversionError("\n".join(wrong[:4]) + more)


def build_plan(root: Path, hf: Any, tp: int, data_type: str) -> Plan:
    """Plan converting the T5/mT5 checkpoint under ``root`` for ``tp`` ranks."""
    config = make_config(hf, tp, data_type)
    ckpt = HfCheckpoint.open(root)
    # A head the config declares untied must be in the checkpoint; a tied one may be saved only
    # as the embedding (transformers 5 omits the tied lm_head.weight).
    untied = hf.get("tie_word_embeddings", True) is False
    head = "lm_head.weight" if untied else "lm_head.weight|" + _EMBEDDING_SOURCES
    model, encoder, decoder = _rules(config.decoder.gated, head)
    tasks = (expand(model, 0) + expand(encoder, config.encoder.num_layers)
             + expand(decoder, config.decoder.num_layers))
    check_hf_shapes(ckpt, tasks)
    arch = "MT5ForConditionalGeneration" if config.model_type == "mt5" else \
        "T5ForConditionalGeneration"
    return Plan(FtT5Output(config), t5_weight_specs(config), tasks, ckpt, arch, file_prefix="")
