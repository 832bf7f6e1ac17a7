"""`T5Config`: the configuration of a converted encoder-decoder directory (T5 and BART families).

The layout is FasterTransformer's encoder-decoder layout (``docs/FORMAT.md``, "T5 family" and
"BART family"). ``config.ini`` holds ``[encoder]`` and ``[decoder]`` (one per stack: HF
``T5Config`` keys, with ``relative_attention_num_buckets`` renamed
``relative_attention_num_buckets_or_max_pos_seq_len``, plus ``weight_data_type``) and
``[structure]`` (``t5_with_bias``, ``use_gated_activation``, ``position_embedding_type``). FT's
T5 converter writes every HF config key as ``str(value)`` (``True``, ``None``); those spellings
are read here, and keys warpformer does not use are kept in ``extra`` and written back unchanged.

The BART family (BART, mBART) is marked as FT's BART converter marks it: ``[encoder]
model_name = bart`` and ``mbart = true|false``; its stacks carry ``max_pos_seq_len`` (learned
positions) instead of the relative-attention keys, and ``position_embedding_type`` is
``absolute``. ``model_type`` (``t5``, ``mt5``, ``bart``, ``mbart``) is the family switch the
weight table and the reference read.
"""

from __future__ import annotations

import configparser
import dataclasses
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import DATA_TYPES, ConfigError, _parse_bool, read_ini

__all__ = ["T5Config", "T5StackConfig", "T5_ACTIVATIONS", "t5_activation"]

# HF ``dense_act_fn`` (ACT2FN names) -> the activation warpformer runs. HF's ``gelu`` is the erf
# form; ``gated-gelu`` checkpoints use ``gelu_new`` (tanh form).
T5_ACTIVATIONS = {
    "relu": "relu",
    "gelu": "gelu_erf",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "silu": "silu",
    "swish": "silu",
}

_BUCKETS_KEY = "relative_attention_num_buckets_or_max_pos_seq_len"


def t5_activation(feed_forward_proj: str, dense_act_fn: str | None = None) -> tuple[str, bool]:
    """``(activation, gated)`` for HF's ``feed_forward_proj`` (``relu``, ``gated-gelu``,
    ``gated-silu`` ...) and optional ``dense_act_fn``; HF's rule: the part after ``gated-`` is the
    activation, except that ``gated-gelu`` means ``gelu_new``. Raises :class:`ConfigError`."""
    parts = str(feed_forward_proj).strip().split("-")
    if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
        raise ConfigError(f"feed_forward_proj {feed_forward_proj!r} is not 'ACT' or 'gated-ACT'")
    gated = len(parts) == 2
    name = dense_act_fn or ("gelu_new" if feed_forward_proj == "gated-gelu" else parts[-1])
    act = T5_ACTIVATIONS.get(str(name).strip().lower())
    if act is None:
        raise ConfigError(f"dense_act_fn {name!r} (feed_forward_proj {feed_forward_proj!r}) is not "
                          f"supported; supported: {', '.join(T5_ACTIVATIONS)}")
    return act, gated


def _int(key: str, value: Any, minimum: int | None = None) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ConfigError(f"{key} must be an integer, got {value!r}") from None
    if minimum is not None and number < minimum:
        raise ConfigError(f"{key} must be >= {minimum}, got {number}")
    return number


def _token(key: str, value: Any, default: int) -> int:
    """A token id; FT writes ``None`` for unset ones and may write a list (first entry)."""
    text = str(value).strip() if value is not None else "None"
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1].split(",")[0].strip() or "None"
    return default if text in ("None", "") else _int(key, text, 0)


@dataclass
class T5StackConfig:
    """One stack's section (``[encoder]`` or ``[decoder]``) of ``config.ini``.

    Weight shapes: ``inner = num_heads * d_kv`` (need not equal ``d_model``), FFN width ``d_ff``.
    ``max_pos_seq_len``: rows of the learned position table (BART family); 0 for T5's relative
    positions, whose bucket keys are then the ones used.
    """

    vocab_size: int
    d_model: int
    d_kv: int
    d_ff: int
    num_layers: int
    num_heads: int
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_epsilon: float = 1e-6
    feed_forward_proj: str = "relu"
    dense_act_fn: str = ""
    max_pos_seq_len: int = 0
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def inner_size(self) -> int:
        """``num_heads * d_kv``: width of Q, K, V and the attention output's input."""
        return self.num_heads * self.d_kv

    @property
    def activation(self) -> str:
        """warpformer's activation name (``relu``, ``gelu_erf``, ``gelu_tanh``, ``silu``)."""
        return t5_activation(self.feed_forward_proj, self.dense_act_fn or None)[0]

    @property
    def gated(self) -> bool:
        """Whether the FFN is gated (``wi`` and ``wi2``: ``act(x wi) * (x wi2)``)."""
        return t5_activation(self.feed_forward_proj, self.dense_act_fn or None)[1]

    def validate(self, section: str) -> None:
        """Check every rule; messages start with ``[section] key``."""
        try:
            for key in ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads",
                        "relative_attention_num_buckets", "relative_attention_max_distance"):
                setattr(self, key, _int(key, getattr(self, key), 1))
            self.max_pos_seq_len = _int("max_pos_seq_len", self.max_pos_seq_len, 0)
            try:
                self.layer_norm_epsilon = float(self.layer_norm_epsilon)
            except (TypeError, ValueError):
                raise ConfigError(f"layer_norm_epsilon must be a number, got "
                                  f"{self.layer_norm_epsilon!r}") from None
            if not self.layer_norm_epsilon > 0:
                raise ConfigError(f"layer_norm_epsilon must be positive, got "
                                  f"{self.layer_norm_epsilon}")
            t5_activation(self.feed_forward_proj, self.dense_act_fn or None)
        except ConfigError as exc:
            raise ConfigError(f"[{section}] {exc}") from None

    def to_section(self) -> dict[str, str]:
        """The section's keys as FT writes them (booleans ``True``/``False``); learned positions
        (``max_pos_seq_len > 0``) replace the relative-attention keys."""
        out = {k: str(v) for k, v in self.extra.items()}
        if self.max_pos_seq_len:
            out["max_pos_seq_len"] = str(self.max_pos_seq_len)
        else:
            out[_BUCKETS_KEY] = str(self.relative_attention_num_buckets)
            out["relative_attention_max_distance"] = str(self.relative_attention_max_distance)
        out.update({
            "vocab_size": str(self.vocab_size), "d_model": str(self.d_model),
            "d_kv": str(self.d_kv), "d_ff": str(self.d_ff), "num_layers": str(self.num_layers),
            "num_heads": str(self.num_heads),
            "layer_norm_epsilon": repr(self.layer_norm_epsilon),
            "feed_forward_proj": self.feed_forward_proj,
            "dense_act_fn": self.dense_act_fn or t5_activation_name(self.feed_forward_proj),
            "is_gated_act": str(self.gated),
        })
        return out

    @classmethod
    def from_section(cls, section: str, values: dict[str, str]) -> T5StackConfig:
        """Build from a ``config.ini`` section; raises :class:`ConfigError` naming the key."""
        values = dict(values)
        if _BUCKETS_KEY in values:
            values["relative_attention_num_buckets"] = values.pop(_BUCKETS_KEY)
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        required = [f.name for f in dataclasses.fields(cls)
                    if f.default is dataclasses.MISSING and f.name != "extra"]
        missing = [k for k in required if k not in values]
        if missing:
            shown = [_BUCKETS_KEY if k == "relative_attention_num_buckets" else k for k in missing]
            raise ConfigError(f"[{section}] missing required key(s): {', '.join(shown)}")
        known = {k: v for k, v in values.items() if k in names}
        extra = {k: v for k, v in values.items() if k not in names}
        stack = cls(**known, extra=extra)
        stack.validate(section)
        return stack


def t5_activation_name(feed_forward_proj: str) -> str:
    """HF's ``dense_act_fn`` for a ``feed_forward_proj`` (``gated-gelu`` -> ``gelu_new``)."""
    if feed_forward_proj == "gated-gelu":
        return "gelu_new"
    return feed_forward_proj.split("-")[-1]


# Keys of [encoder]/[decoder] that describe the model rather than one stack; read from [decoder].
_MODEL_KEYS = ("pad_token_id", "eos_token_id", "decoder_start_token_id", "tie_word_embeddings",
               "weight_data_type", "tensor_para_size")
_STRUCTURE_KEYS = ("t5_with_bias", "bart_with_bias", "use_gated_activation",
                   "position_embedding_type")
# FT's PositionEmbeddingType values, also written as numbers.
_POSITION_TYPES = {"relative": "relative", "0": "relative", "absolute": "absolute",
                   "1": "absolute"}


@dataclass
class T5Config:
    """A converted encoder-decoder model: two stacks and the model-level keys.

    ``model_type`` is the family switch: ``t5``/``mt5`` (relative positions, RMS norm) or
    ``bart``/``mbart`` (learned positions, LayerNorm with bias, post-LN for BART, pre-LN with
    final norms for mBART). ``tie_word_embeddings`` keeps FT's (and HF 4's) meaning for T5: the
    decoder output is scaled by ``d_model ** -0.5`` before ``lm_head`` (original T5); the head
    itself is always a file of its own. BART never rescales (the key must be false and is not
    written). ``tensor_para_size`` is written in ``[encoder]`` (as FT's Megatron T5 converter
    does); when missing it is the N of the ``<N>-gpu`` folder name.
    """

    encoder: T5StackConfig
    decoder: T5StackConfig
    pad_token_id: int = 0
    eos_token_id: int = 1
    decoder_start_token_id: int = 0
    tie_word_embeddings: bool = True
    weight_data_type: str = "fp32"
    tensor_para_size: int = 1
    model_type: str = "t5"
    extra_structure: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    @property
    def vocab_size(self) -> int:
        """Rows of the shared embedding and of ``lm_head``."""
        return self.decoder.vocab_size

    @property
    def d_model(self) -> int:
        """Model width (both stacks)."""
        return self.decoder.d_model

    @property
    def is_bart(self) -> bool:
        """BART family (``bart``, ``mbart``): FT's BART file names and behaviour."""
        return self.model_type in ("bart", "mbart")

    @property
    def position_embedding_type(self) -> str:
        """``relative`` (T5 buckets) or ``absolute`` (BART's learned table)."""
        return "absolute" if self.is_bart else "relative"

    @property
    def pre_layernorm(self) -> bool:
        """Norm before each sublayer and a final norm per stack (T5, mBART), or after the
        residual add (BART)."""
        return self.model_type != "bart"

    def validate(self) -> None:
        """Cross-stack rules; raises :class:`ConfigError` naming the key."""
        self.encoder.validate("encoder")
        self.decoder.validate("decoder")
        for key in ("vocab_size", "d_model"):
            if getattr(self.encoder, key) != getattr(self.decoder, key):
                raise ConfigError(f"[encoder] {key} ({getattr(self.encoder, key)}) must equal "
                                  f"[decoder] {key} ({getattr(self.decoder, key)}): the stacks "
                                  "share the embedding")
        self.weight_data_type = str(self.weight_data_type).strip().lower()
        if self.weight_data_type not in DATA_TYPES:
            raise ConfigError(f"weight_data_type must be one of {', '.join(DATA_TYPES)}, got "
                              f"{self.weight_data_type!r}")
        self.tensor_para_size = _int("tensor_para_size", self.tensor_para_size, 1)
        tp = self.tensor_para_size
        for name, stack in (("encoder", self.encoder), ("decoder", self.decoder)):
            for key in ("num_heads", "d_ff"):
                if getattr(stack, key) % tp:
                    raise ConfigError(f"[{name}] {key} ({getattr(stack, key)}) must be divisible "
                                      f"by tensor_para_size ({tp})")
        if self.encoder.gated != self.decoder.gated:
            raise ConfigError("[encoder] and [decoder] disagree on a gated FFN (feed_forward_proj)")
        self.tie_word_embeddings = _parse_bool("tie_word_embeddings", self.tie_word_embeddings)
        if self.is_bart:
            self._validate_bart()
        for key in ("pad_token_id", "eos_token_id", "decoder_start_token_id"):
            value = _int(key, getattr(self, key), 0)
            if value >= self.vocab_size:
                raise ConfigError(f"[decoder] {key} ({value}) must be in [0, vocab_size="
                                  f"{self.vocab_size})")
            setattr(self, key, value)

    def _validate_bart(self) -> None:
        for name, stack in (("encoder", self.encoder), ("decoder", self.decoder)):
            if stack.max_pos_seq_len < 1:
                raise ConfigError(f"[{name}] max_pos_seq_len (rows of the learned position "
                                  f"table, required for {self.model_type}) must be >= 1, got "
                                  f"{stack.max_pos_seq_len}")
            if stack.gated:
                raise ConfigError(f"[{name}] feed_forward_proj {stack.feed_forward_proj!r}: the "
                                  "BART family has no gated FFN")
        if self.tie_word_embeddings:
            raise ConfigError("tie_word_embeddings (T5's d_model ** -0.5 rescale before lm_head) "
                              f"does not apply to {self.model_type}")

    def structure(self) -> dict[str, str]:
        """The ``[structure]`` section as FT writes it (for BART: its T5 layout's keys with the
        BART values)."""
        out = dict(self.extra_structure)
        out["bart_with_bias" if self.is_bart else "t5_with_bias"] = str(self.is_bart).lower()
        out.update(use_gated_activation=str(self.decoder.gated).lower(),
                   position_embedding_type=self.position_embedding_type)
        return out

    # ------------------------------------------------------------------ engine
    def to_json(self) -> str:
        """The flat JSON the C++ side parses (``T5Config::from_json``,
        csrc/models/t5/t5_config.h): the model's keys, and each stack's fields as
        ``encoder_<field>`` / ``decoder_<field>`` with the activation in warpformer's names
        (``relu``, ``gelu_erf``, ``gelu_tanh``, ``silu``) and ``gated``."""
        out: dict[str, Any] = {
            "model_type": self.model_type, "vocab_size": self.vocab_size,
            "pad_token_id": self.pad_token_id, "eos_token_id": self.eos_token_id,
            "decoder_start_token_id": self.decoder_start_token_id,
            "tie_word_embeddings": bool(self.tie_word_embeddings),
            "weight_data_type": self.weight_data_type, "tensor_para_size": self.tensor_para_size,
        }
        for name, stack in (("encoder", self.encoder), ("decoder", self.decoder)):
            for key in ("d_model", "d_kv", "d_ff", "num_layers", "num_heads",
                        "relative_attention_num_buckets", "relative_attention_max_distance",
                        "max_pos_seq_len", "layer_norm_epsilon", "activation", "gated"):
                out[f"{name}_{key}"] = getattr(stack, key)
        return json.dumps(out, sort_keys=True)

    # ------------------------------------------------------------------ config.ini
    def to_ini(self, path: str | os.PathLike[str]) -> None:
        """Write ``config.ini`` with ``[encoder]``, ``[decoder]`` and ``[structure]``."""
        parser = configparser.ConfigParser()
        common = {"pad_token_id": str(self.pad_token_id), "eos_token_id": str(self.eos_token_id),
                  "decoder_start_token_id": str(self.decoder_start_token_id),
                  "model_type": self.model_type, "weight_data_type": self.weight_data_type}
        family = {}
        if self.is_bart:  # FT's BART converter's keys
            family = {"model_name": "bart", "mbart": str(self.model_type == "mbart").lower()}
        else:
            common["tie_word_embeddings"] = str(self.tie_word_embeddings)
        parser["encoder"] = {**self.encoder.to_section(), **common, **family, "is_decoder": "False",
                             "tensor_para_size": str(self.tensor_para_size)}
        parser["decoder"] = {**self.decoder.to_section(), **common, "is_decoder": "True"}
        parser["structure"] = self.structure()
        with open(path, "w", encoding="utf-8") as f:
            parser.write(f)

    @classmethod
    def from_ini(cls, path: str | os.PathLike[str]) -> T5Config:
        """Read a ``config.ini`` written by warpformer or by FT's ``huggingface_t5_ckpt_convert`` /
        ``huggingface_bart_convert``.

        Raises :class:`ConfigError` whose message starts with the file and names the key.
        """
        parser = read_ini(path, interpolation=None)
        try:
            missing = [s for s in ("encoder", "decoder") if not parser.has_section(s)]
            if missing:
                raise ConfigError(f"no [{'] or ['.join(missing)}] section (found: "
                                  f"{', '.join(parser.sections()) or 'none'}); not a T5 layout")
            enc, dec = dict(parser["encoder"]), dict(parser["decoder"])
            structure = dict(parser["structure"]) if parser.has_section("structure") else {}
            return cls._from_sections(path, enc, dec, structure)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None

    @classmethod
    def _from_sections(cls, path: str | os.PathLike[str], enc: dict[str, str],
                       dec: dict[str, str], structure: dict[str, str]) -> T5Config:
        model_type = dec.get("model_type", enc.get("model_type", "t5")).strip().lower() or "t5"
        bart = enc.pop("model_name", "").strip().lower() == "bart" or model_type in ("bart",
                                                                                     "mbart")
        if bart:
            mbart = _parse_bool("[encoder] mbart", enc.pop("mbart", str(model_type == "mbart")))
            model_type = "mbart" if mbart else "bart"
        _check_structure(structure, bart)
        defaults = {"pad": 0, "eos": 1}
        if bart:  # FT's BART converter writes neither; HF's BART values
            defaults = {"pad": 1, "eos": 2}
            for section in (enc, dec):
                section.setdefault("layer_norm_epsilon", "1e-05")
                section.setdefault("feed_forward_proj", "gelu")
        model = {k: dec.pop(k) for k in _MODEL_KEYS if k in dec}
        # Unset start id: T5 starts with pad, BART with eos (HF's defaults).
        start_key = "eos" if bart else "pad"
        start = _token(f"{start_key}_token_id", model.get(f"{start_key}_token_id"),
                       defaults[start_key])
        tp = enc.pop("tensor_para_size", None) or model.pop("tensor_para_size", None)
        if tp is None:
            match = re.fullmatch(r"(\d+)-gpu", Path(path).resolve().parent.name)
            tp = match.group(1) if match else "1"
        for key in _MODEL_KEYS:
            enc.pop(key, None)
        for section in (enc, dec):
            section.pop("is_decoder", None)
            section.pop("model_type", None)
            section.pop("is_gated_act", None)
        config = cls(
            encoder=T5StackConfig.from_section("encoder", enc),
            decoder=T5StackConfig.from_section("decoder", dec),
            pad_token_id=_token("[decoder] pad_token_id", model.get("pad_token_id"),
                                defaults["pad"]),
            eos_token_id=_token("[decoder] eos_token_id", model.get("eos_token_id"),
                                defaults["eos"]),
            decoder_start_token_id=_token("[decoder] decoder_start_token_id",
                                          model.get("decoder_start_token_id"), start),
            tie_word_embeddings=not bart and _parse_bool("[decoder] tie_word_embeddings",
                                                         model.get("tie_word_embeddings", "true")),
            weight_data_type=model.get("weight_data_type", "fp32"),
            tensor_para_size=tp,
            model_type=model_type,
            extra_structure={k: v for k, v in structure.items() if k not in _STRUCTURE_KEYS},
        )
        gated = structure.get("use_gated_activation")
        if gated is not None and _parse_bool("[structure] use_gated_activation", gated) != \
                config.decoder.gated:
            raise ConfigError(f"[structure] use_gated_activation = {gated} contradicts "
                              f"feed_forward_proj = {config.decoder.feed_forward_proj!r}")
        return config


def _check_structure(structure: dict[str, str], bart: bool) -> None:
    """Refuse ``[structure]`` values the family does not have; raises :class:`ConfigError`."""
    flag = "bart_with_bias" if bart else "t5_with_bias"
    if _parse_bool(f"[structure] {flag}", structure.get(flag, str(bart))) != bart:
        raise ConfigError(f"[structure] {flag} = {structure[flag]} is not supported ("
                          + ("BART always has biases)" if bart else
                             "Megatron/NeMo T5 with biases)"))
    if _parse_bool("[structure] t5_with_moe", structure.get("t5_with_moe", "0")):
        raise ConfigError("[structure] t5_with_moe (mixture of experts) is not supported")
    want = "absolute" if bart else "relative"
    position = structure.get("position_embedding_type", want).strip().lower()
    if _POSITION_TYPES.get(position) != want:
        raise ConfigError(f"[structure] position_embedding_type {position!r} is not supported "
                          f"for this family (only {want!r}, also written "
                          f"'{int(want == 'absolute')}')")
