"""`GptConfig`: the model configuration stored in a converted directory's ``config.ini``.

One dataclass describes every decoder-only architecture warpformer runs (GPT-2, Megatron GPT, OPT,
BLOOM, GPT-J, GPT-NeoX) through a handful of switches. It reads and writes the ``[gpt]`` section of
``config.ini`` (FasterTransformer's keys plus warpformer's, see ``docs/FORMAT.md``), converts to and
from plain dicts, and serialises to the JSON string that the C++ engine takes.

Files written by FasterTransformer's own converters load too: missing keys take FT's defaults,
legacy activation names (``Gelu``, ``Relu``) are mapped, booleans may be ``True``/``False`` or
``1``/``0``, FT's ``model_variant`` values (``bloom-pre``) are normalised, and the legacy
``[gptj]``/``[gptneox]`` sections are read as well. Weight-only quantized folders carry
``weight_quant`` and its keys (:class:`QuantScheme`); FT's ``int8_mode`` is read for them.
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

__all__ = [
    "ConfigError",
    "GptConfig",
    "QuantScheme",
    "ACTIVATIONS",
    "DATA_TYPES",
    "LAYERNORM_TYPES",
    "MODEL_VARIANTS",
    "ROPE_SCALING_TYPES",
    "ROTARY_STYLES",
    "WEIGHT_QUANTS",
    "local_vocab",
    "normalize_activation",
]


def local_vocab(vocab_size: int, tensor_para_size: int = 1) -> int:
    """The lm_head rows (logits columns) one rank multiplies, as ``GptConfig::local_vocab`` in
    the engine: its slice of the vocabulary, ``ceil(vocab_size / tensor_para_size)`` (all of it on
    one GPU), rounded up to a multiple of 8 (an odd width puts cuBLASLt on a slow kernel)."""
    per = -(-vocab_size // tensor_para_size)
    return -(-per // 8) * 8


class ConfigError(ValueError):
    """A config value is missing, malformed or inconsistent; the message names the key and rule."""


DATA_TYPES = ("fp32", "fp16", "bf16")
LAYERNORM_TYPES = ("pre_layernorm", "post_layernorm", "rmsnorm")
ROPE_SCALING_TYPES = ("none", "linear", "dynamic", "llama3", "yarn")
ACTIVATIONS = ("gelu_tanh", "gelu_erf", "relu", "silu")
MODEL_VARIANTS = ("gpt2", "opt", "bloom", "gptj", "gptneox", "megatron", "llama")
ROTARY_STYLES = ("interleaved", "half")
WEIGHT_QUANTS = ("none", "int8", "int4")
DEFAULT_GROUP_SIZE = 128

# Accepted spellings (lower-cased) -> canonical activation. FT's "Gelu" kernel is the tanh form.
_ACTIVATION_ALIASES = {
    "gelu": "gelu_tanh",
    "gelu_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_erf": "gelu_erf",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}

# FT's model_variant strings (BLOOM converter) -> ours.
_VARIANT_ALIASES = {"bloom-pre": "bloom", "bloom-post": "bloom", "gpt": "gpt2"}

_SECTION = "gpt"
_LEGACY_SECTIONS = ("gptj", "gptneox")


def read_ini(path: str | os.PathLike[str], **parser_args: Any) -> configparser.ConfigParser:
    """The parsed ``config.ini`` at ``path``; :class:`ConfigError` naming the file when it is
    missing or not an ini file. ``parser_args`` go to :class:`configparser.ConfigParser`."""
    parser = configparser.ConfigParser(**parser_args)
    try:
        read = parser.read(path, encoding="utf-8")
    except configparser.Error as exc:
        raise ConfigError(f"{path}: not a valid ini file: {exc}") from None
    if not read:
        raise ConfigError(f"{path}: config file not found")
    return parser


def normalize_activation(name: str) -> str:
    """Map an activation name (ours, FT's legacy ``Gelu``/``Relu``, case-insensitive) to ours."""
    canon = _ACTIVATION_ALIASES.get(str(name).strip().lower())
    if canon is None:
        raise ConfigError(
            f"activation_type {name!r} is not supported; use one of {', '.join(ACTIVATIONS)}"
        )
    return canon


def _parse_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{key} must be a boolean (0/1/true/false), got {value!r}")


def _parse_int(key: str, value: Any) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{key} must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    try:
        as_float = float(str(value).strip())
    except ValueError:
        raise ConfigError(f"{key} must be an integer, got {value!r}") from None
    if not as_float.is_integer():
        raise ConfigError(f"{key} must be an integer, got {value!r}")
    return int(as_float)


def _parse_float(key: str, value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key} must be a number, got {value!r}") from None


@dataclass(frozen=True)
class QuantScheme:
    """A weight-only quantization request or a folder's scheme (``docs/FORMAT.md``).

    ``mode`` ``"int8"`` (per output channel, FT ``int8_mode = 1``) or ``"int4"`` (groups of
    ``group_size`` input rows; default 128, even). ``asymmetric``: int4 with zero points.
    ``lm_head``: quantize the output head too (a tied head gets its own quantized copy of
    ``wte``). Scales are in the compute dtype, fp16 or bf16. Raises :class:`ConfigError` naming
    the field for a bad value."""

    mode: str
    group_size: int | None = None
    asymmetric: bool = False
    lm_head: bool = False

    def __post_init__(self) -> None:
        if self.mode not in WEIGHT_QUANTS[1:]:
            raise ConfigError(f"weight_quant must be one of {', '.join(WEIGHT_QUANTS[1:])}, got "
                              f"{self.mode!r}")
        for key in ("asymmetric", "lm_head"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(f"quant {key} must be True or False, got "
                                  f"{getattr(self, key)!r}")
        size = self.group_size
        if self.mode == "int8":
            if size not in (None, 0):
                raise ConfigError(f"quant_group_size ({size}) applies to int4 only: int8 has one "
                                  "scale per output channel")
            if self.asymmetric:
                raise ConfigError("int8 weight-only quantization is symmetric; asymmetric (zero "
                                  "points) applies to int4 only")
            object.__setattr__(self, "group_size", 0)
            return
        size = DEFAULT_GROUP_SIZE if size is None else size
        if isinstance(size, bool) or not isinstance(size, int) or size < 2 or size % 2:
            raise ConfigError(f"quant_group_size must be an even integer >= 2 (two int4 values "
                              f"share a byte along the input axis), got {size!r}")
        object.__setattr__(self, "group_size", size)

    @classmethod
    def parse(cls, value: str | QuantScheme | None) -> QuantScheme | None:
        """``None``, a mode string (``"int8"``, ``"int4"``: defaults otherwise) or a scheme."""
        if value is None or isinstance(value, QuantScheme):
            return value
        if not isinstance(value, str):
            raise ConfigError(f"weight_quant must be None, 'int8', 'int4' or a QuantScheme, got "
                              f"{value!r}")
        mode = value.strip().lower()
        return None if mode == "none" else cls(mode)


@dataclass
class GptConfig:
    """Configuration of one converted decoder-only model (``config.ini`` section ``[gpt]``).

    Shapes derived from it: hidden size ``h = head_num * size_per_head``; every weight file's shape
    is given by :func:`warpformer.weights.weight_specs`.
    """

    head_num: int
    size_per_head: int
    inter_size: int
    num_layer: int
    vocab_size: int
    max_pos_seq_len: int = 0
    model_name: str = "gpt"
    model_variant: str = "gpt2"
    start_id: int = 0
    end_id: int = 0
    weight_data_type: str = "fp32"
    tensor_para_size: int = 1
    layernorm_eps: float = 1e-5
    layernorm_type: str = "pre_layernorm"
    activation_type: str = "gelu_tanh"
    has_positional_encoding: bool = True
    has_pre_decoder_layernorm: bool = False
    has_post_decoder_layernorm: bool = True
    use_attention_linear_bias: bool = False
    rotary_embedding_dim: int = 0
    rotary_style: str = "interleaved"
    rotary_base: float = 10000.0
    parallel_residual: bool = False
    parallel_shared_layernorm: bool = False
    has_attention_bias: bool = True
    has_lm_head_bias: bool = False
    word_embed_proj_dim: int = 0
    row_parallel_bias_divided: bool = False
    weight_quant: str = "none"
    quant_group_size: int = 0
    quant_asymmetric: bool = False
    quant_lm_head: bool = False
    # LLaMA-style decoders (docs/FORMAT.md, "LLaMA-style decoders").
    kv_head_num: int = 0
    use_gated_activation: bool = False
    has_attention_out_bias: bool = True
    has_mlp_bias: bool = True
    sliding_window: int = 0
    # More end-of-sequence ids beside end_id, comma-separated (Llama 3 Instruct lists three): a
    # row ends at any of them (GPT.generate without end_id).
    extra_end_ids: str = ""
    rope_scaling_type: str = "none"
    rope_scaling_factor: float = 1.0
    rope_scaling_original_max_position: int = 0
    rope_scaling_low_freq_factor: float = 1.0
    rope_scaling_high_freq_factor: float = 4.0
    rope_scaling_beta_fast: float = 32.0
    rope_scaling_beta_slow: float = 1.0
    rope_scaling_attention_factor: float = 1.0
    rope_scaling_truncate: bool = True
    extra: dict[str, str] = field(default_factory=dict)
    """Keys of config.ini that warpformer does not use (FT's ``int8`` ...); kept on rewrite."""

    def __post_init__(self) -> None:
        self.validate()

    # ------------------------------------------------------------------ derived values
    @property
    def hidden_size(self) -> int:
        """``head_num * size_per_head``."""
        return self.head_num * self.size_per_head

    @property
    def quant(self) -> QuantScheme | None:
        """The weight-only quantization of the files, or ``None`` (``weight_quant = none``)."""
        if self.weight_quant == "none":
            return None
        return QuantScheme(self.weight_quant, self.quant_group_size, self.quant_asymmetric,
                           self.quant_lm_head)

    def with_quant(self, scheme: QuantScheme) -> GptConfig:
        """A copy of this config whose files are quantized as ``scheme`` says (validated)."""
        return dataclasses.replace(self, weight_quant=scheme.mode,
                                   quant_group_size=scheme.group_size,
                                   quant_asymmetric=scheme.asymmetric,
                                   quant_lm_head=scheme.lm_head)

    def without_quant(self) -> GptConfig:
        """A copy of this config describing the same weights unquantized (the dense table)."""
        return dataclasses.replace(self, weight_quant="none", quant_group_size=0,
                                   quant_asymmetric=False, quant_lm_head=False)

    @property
    def kv_heads(self) -> int:
        """Key/value heads: ``kv_head_num``, or ``head_num`` (multi-head attention) when 0."""
        return self.kv_head_num or self.head_num

    @property
    def grouped_query(self) -> bool:
        """Fewer key/value heads than query heads: QKV files hold each rank's Q, K, V heads."""
        return self.kv_heads != self.head_num

    @property
    def local_kv_heads(self) -> int:
        """Key/value heads one rank holds: ``kv_heads / tp``, or one (replicated) when fewer."""
        return max(1, self.kv_heads // self.tensor_para_size)

    @property
    def rmsnorm(self) -> bool:
        """Pre-norm blocks whose norms are RMSNorm (a weight, no bias)."""
        return self.layernorm_type == "rmsnorm"

    @property
    def embedding_dim(self) -> int:
        """Width of ``wte``/``lm_head`` rows: ``word_embed_proj_dim`` if set, else hidden size."""
        return self.word_embed_proj_dim or self.hidden_size

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Coerce field types and check every rule; raises :class:`ConfigError` naming the key."""
        types = {f.name: f.type for f in dataclasses.fields(self)}
        for name, typ in types.items():
            value = getattr(self, name)
            if typ == "int":
                setattr(self, name, _parse_int(name, value))
            elif typ == "float":
                setattr(self, name, _parse_float(name, value))
            elif typ == "bool":
                setattr(self, name, _parse_bool(name, value))
            elif typ == "str":
                setattr(self, name, str(value).strip())
        self.activation_type = normalize_activation(self.activation_type)
        self.model_variant = _VARIANT_ALIASES.get(self.model_variant.lower(), self.model_variant)
        self.weight_data_type = self.weight_data_type.lower()

        for key in ("head_num", "size_per_head", "inter_size", "num_layer", "vocab_size",
                    "tensor_para_size"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"{key} must be positive, got {getattr(self, key)}")
        for key in ("max_pos_seq_len", "rotary_embedding_dim", "word_embed_proj_dim"):
            if getattr(self, key) < 0:
                raise ConfigError(f"{key} must be >= 0, got {getattr(self, key)}")
        choices = {
            "weight_data_type": DATA_TYPES,
            "layernorm_type": LAYERNORM_TYPES,
            "model_variant": MODEL_VARIANTS,
            "rotary_style": ROTARY_STYLES,
        }
        choices["rope_scaling_type"] = ROPE_SCALING_TYPES
        for key, allowed in choices.items():
            if getattr(self, key) not in allowed:
                raise ConfigError(
                    f"{key} must be one of {', '.join(allowed)}, got {getattr(self, key)!r}"
                )
        tp = self.tensor_para_size
        if self.head_num % tp:
            raise ConfigError(
                f"head_num ({self.head_num}) must be divisible by tensor_para_size ({tp})"
            )
        if self.inter_size % tp:
            raise ConfigError(
                f"inter_size ({self.inter_size}) must be divisible by tensor_para_size ({tp})"
            )
        if self.layernorm_eps <= 0:
            raise ConfigError(f"layernorm_eps must be positive, got {self.layernorm_eps}")
        if self.rotary_embedding_dim:
            if self.rotary_embedding_dim > self.size_per_head or self.rotary_embedding_dim % 2:
                raise ConfigError(
                    f"rotary_embedding_dim ({self.rotary_embedding_dim}) must be even and at most "
                    f"size_per_head ({self.size_per_head})"
                )
            if self.rotary_base <= 0:
                raise ConfigError(f"rotary_base must be positive, got {self.rotary_base}")
        if self.has_positional_encoding and self.max_pos_seq_len <= 0:
            raise ConfigError(
                "max_pos_seq_len must be positive when has_positional_encoding = 1 "
                f"(it is the row count of model.wpe.bin), got {self.max_pos_seq_len}"
            )
        if self.parallel_residual and self.layernorm_type == "post_layernorm":
            raise ConfigError("parallel_residual = 1 requires a pre-norm layernorm_type "
                              "(pre_layernorm or rmsnorm)")
        self._validate_llama_keys()
        if self.parallel_shared_layernorm and not self.parallel_residual:
            raise ConfigError("parallel_shared_layernorm = 1 requires parallel_residual = 1")
        if not 0 <= self.start_id < self.vocab_size:
            raise ConfigError(f"start_id ({self.start_id}) must be in [0, vocab_size)")
        if not 0 <= self.end_id < self.vocab_size:
            raise ConfigError(f"end_id ({self.end_id}) must be in [0, vocab_size)")
        self._validate_quant()
        self.extra = {str(k): str(v) for k, v in dict(self.extra).items()}

    @property
    def end_ids(self) -> tuple[int, ...]:
        """``end_id`` and then ``extra_end_ids``, without repeats."""
        ids = [self.end_id] + [int(t) for t in self.extra_end_ids.split(",") if t.strip()]
        return tuple(dict.fromkeys(ids))

    def _validate_llama_keys(self) -> None:
        tp, kv = self.tensor_para_size, self.kv_head_num
        if kv < 0 or (kv and self.head_num % kv):
            raise ConfigError(f"kv_head_num ({kv}) must divide head_num ({self.head_num}) "
                              "(0: as many as head_num)")
        if kv and kv % tp and tp % kv:
            raise ConfigError(f"kv_head_num ({kv}) and tensor_para_size ({tp}) must divide one "
                              "another: key/value heads are split over the ranks, or each rank "
                              "holds a copy of one")
        if self.sliding_window < 0:
            raise ConfigError(f"sliding_window must be >= 0 (0: none), got {self.sliding_window}")
        try:
            extra = self.end_ids[1:]
        except ValueError:
            raise ConfigError(f"extra_end_ids must be comma-separated token ids, got "
                              f"{self.extra_end_ids!r}") from None
        bad = [i for i in extra if not 0 <= i < self.vocab_size]
        if bad:
            raise ConfigError(f"extra_end_ids {bad} outside [0, vocab_size = {self.vocab_size})")
        kind = self.rope_scaling_type
        if kind == "none":
            return
        if not self.rotary_embedding_dim:
            raise ConfigError(f"rope_scaling_type = {kind} needs rotary_embedding_dim > 0")
        if self.rope_scaling_factor <= 0:
            raise ConfigError(f"rope_scaling_factor must be positive, got "
                              f"{self.rope_scaling_factor}")
        if kind in ("dynamic", "llama3", "yarn") and self.rope_scaling_original_max_position <= 0:
            raise ConfigError(f"rope_scaling_type = {kind} needs "
                              "rope_scaling_original_max_position > 0 (the pretraining context)")
        if kind == "llama3" and (self.rope_scaling_high_freq_factor
                                 <= self.rope_scaling_low_freq_factor):
            raise ConfigError("rope_scaling_high_freq_factor must exceed "
                              "rope_scaling_low_freq_factor (llama3)")

    def _validate_quant(self) -> None:
        self.weight_quant = self.weight_quant.lower()
        if self.weight_quant not in WEIGHT_QUANTS:
            raise ConfigError(f"weight_quant must be one of {', '.join(WEIGHT_QUANTS)}, got "
                              f"{self.weight_quant!r}")
        if self.weight_quant == "none":
            for key, default in (("quant_group_size", 0), ("quant_asymmetric", False),
                                 ("quant_lm_head", False)):
                if getattr(self, key) != default:
                    raise ConfigError(f"{key} = {getattr(self, key)} needs weight_quant = int8 "
                                      "or int4 (it is none)")
            return
        scheme = QuantScheme(self.weight_quant, self.quant_group_size or None,
                             self.quant_asymmetric, self.quant_lm_head)
        self.quant_group_size = scheme.group_size or 0
        if self.weight_data_type not in ("fp16", "bf16"):
            raise ConfigError(f"weight_quant = {self.weight_quant} needs weight_data_type fp16 "
                              f"or bf16 (the compute dtype, which its scales are stored in), got "
                              f"{self.weight_data_type}: quantizing into an fp32 model is "
                              "not supported")

    # ------------------------------------------------------------------ dict / JSON
    def to_dict(self) -> dict[str, Any]:
        """Plain-value dict of every typed field (``extra`` excluded)."""
        fields = dataclasses.fields(self)
        return {f.name: getattr(self, f.name) for f in fields if f.name != "extra"}

    @classmethod
    def from_dict(cls, values: dict[str, Any], strict: bool = True) -> GptConfig:
        """Build from a dict of plain values. Unknown keys raise unless ``strict=False``, in which
        case they are kept in ``extra``."""
        names = {f.name for f in dataclasses.fields(cls)}
        known = {k: v for k, v in values.items() if k in names}
        unknown = {k: v for k, v in values.items() if k not in names}
        if unknown and strict:
            raise ConfigError(f"unknown config keys: {', '.join(sorted(unknown))}")
        missing = [
            f.name for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            and f.name not in known
        ]
        if missing:
            raise ConfigError(f"missing required config keys: {', '.join(missing)}")
        if unknown:
            known["extra"] = {**dict(known.get("extra", {})), **unknown}
        return cls(**known)

    def to_json(self) -> str:
        """JSON object of :meth:`to_dict` (booleans as JSON booleans): the C++ engine's input."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> GptConfig:
        """Inverse of :meth:`to_json`."""
        return cls.from_dict(json.loads(text))

    # ------------------------------------------------------------------ config.ini
    def to_ini(self, path: str | os.PathLike[str]) -> None:
        """Write ``config.ini`` with section ``[gpt]`` (booleans as 0/1, our keys included)."""
        parser = configparser.ConfigParser()
        section: dict[str, str] = {}
        for key, value in self.to_dict().items():
            if isinstance(value, bool):
                section[key] = "1" if value else "0"
            elif isinstance(value, float):
                section[key] = repr(value)
            else:
                section[key] = str(value)
        for key, value in self.extra.items():
            section.setdefault(key, value)
        section.pop("int8_mode", None)
        if self.weight_quant == "int8":
            section["int8_mode"] = "1"  # FT's flag for per-channel weight-only int8
        parser[_SECTION] = section
        with open(path, "w", encoding="utf-8") as f:
            parser.write(f)

    @classmethod
    def from_ini(cls, path: str | os.PathLike[str]) -> GptConfig:
        """Read a ``config.ini`` written by warpformer or by FasterTransformer's converters."""
        parser = read_ini(path)
        section = _SECTION if parser.has_section(_SECTION) else next(
            (s for s in _LEGACY_SECTIONS if parser.has_section(s)), None
        )
        if section is None:
            raise ConfigError(
                f"{path}: no [gpt] section (found: {', '.join(parser.sections()) or 'none'})"
            )
        values: dict[str, Any] = dict(parser[section])
        if "tensor_para_size" not in values:
            # FT's GPT-2/GPT-J/NeoX converters leave it out: it is the N of the "<N>-gpu" folder.
            match = re.fullmatch(r"(\d+)-gpu", Path(path).resolve().parent.name)
            values["tensor_para_size"] = match.group(1) if match else "1"
        try:
            _read_int8_mode(values)
            if section == _SECTION:
                values.setdefault("model_variant", _infer_variant(values))
            else:
                values = _from_legacy_section(section, values)
            return cls.from_dict(values, strict=False)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None


def _read_int8_mode(values: dict[str, Any]) -> None:
    """FT's ``int8_mode`` (popped from ``values``): ``1`` means per-channel weight-only int8,
    ``weight_quant = int8`` when that key is missing; ``0`` means no int8. It must agree with
    ``weight_quant`` when both are present; FT's ``2`` (SmoothQuant, int8 activations too) is
    refused."""
    if "int8_mode" not in values:
        return
    mode = _parse_int("int8_mode", values.pop("int8_mode"))
    if mode not in (0, 1):
        raise ConfigError(f"int8_mode = {mode} (FT's SmoothQuant, int8 activations) is not "
                          "supported; warpformer reads int8_mode = 1 (weight-only int8) or 0")
    quant = str(values.get("weight_quant", "int8" if mode else "none")).strip().lower()
    values["weight_quant"] = quant
    if (quant == "int8") != (mode == 1):
        raise ConfigError(f"int8_mode = {mode} contradicts weight_quant = {quant}")


def _infer_variant(values: dict[str, Any]) -> str:
    """Best guess of ``model_variant`` for an FT-written [gpt] section lacking it."""
    if _parse_bool("use_attention_linear_bias", values.get("use_attention_linear_bias", "0")):
        return "bloom"
    if str(values.get("activation_type", "")).strip().lower() == "relu":
        return "opt"
    return "gpt2"


def _from_legacy_section(section: str, values: dict[str, Any]) -> dict[str, Any]:
    """Translate FT's ``[gptj]`` / ``[gptneox]`` sections to our keys.

    FT's GPT-J files match our layout with ``has_attention_bias = 0``, a shared parallel
    layernorm and an ``lm_head`` bias. FT's GPT-NeoX converter divides the row-parallel biases by
    the tensor-parallel size when it is above 1 (FT adds them on every rank before the
    all-reduce); ``row_parallel_bias_divided`` tells the loader to multiply them back.
    """
    out = dict(values)
    rotary = _parse_int("rotary_embedding", out.pop("rotary_embedding", "0"))
    out.setdefault("rotary_embedding_dim", rotary)
    out.setdefault("has_positional_encoding", "0")
    out.setdefault("layernorm_eps", "1e-5")
    out.setdefault("parallel_residual", "1")
    if section == "gptj":
        out.setdefault("model_variant", "gptj")
        out.setdefault("rotary_style", "interleaved")
        out.setdefault("parallel_shared_layernorm", "1")
        out.setdefault("has_attention_bias", "0")
        out.setdefault("has_lm_head_bias", "1")
        out.setdefault("activation_type", "gelu_tanh")
    else:
        out.setdefault("model_variant", "gptneox")
        out.setdefault("rotary_style", "half")
        out["parallel_residual"] = out.pop("use_gptj_residual", out["parallel_residual"])
        out.setdefault("parallel_shared_layernorm", "0")
        out.setdefault("activation_type", "gelu_erf")
        if _parse_int("tensor_para_size", out.get("tensor_para_size", "1")) > 1:
            out.setdefault("row_parallel_bias_divided", "1")
    return out
