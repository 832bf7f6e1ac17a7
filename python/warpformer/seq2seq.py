"""``warpformer.Seq2Seq`` (also ``warpformer.T5``, ``warpformer.Bart``): load a converted
encoder-decoder checkpoint (T5, T5 v1.1, mT5, UL2, BART, mBART) and generate, stream or encode.

    >>> model = warpformer.Seq2Seq.from_pretrained("out/1-gpu")
    >>> out = model.generate([[13, 8, 27, 1]], max_new_tokens=16, num_beams=4,
    ...                      length_penalty=0.8)
    >>> out.tokens[0][0]                 # row 0, best beam: the decoder's generated ids
    >>> model.encode([[13, 8, 27, 1]])   # the encoder's output [1, 4, d_model]

:meth:`Seq2Seq.generate` takes :meth:`warpformer.GPT.generate`'s options and returns its
:class:`~warpformer.gpt.GenerationOutput`; both share one front end
(``generation_api._GenerationAPI``), so the checks, the options dict and the messages are the
same. The decoder-only options
(:data:`~warpformer.reference_seq2seq.UNSUPPORTED_OPTIONS`: sessions, prompt embeddings,
``memory_len``, ``return_context_embeddings``, ``return_cum_log_probs=2``) raise ``ValueError``
naming the option.

Two backends run the same calls: ``"engine"`` (``torch.classes.warpformer.Seq2SeqModel``, the
C++ engine) and ``"reference"``
(:class:`~warpformer.reference_seq2seq.Seq2SeqReferenceEngine`, plain PyTorch in fp32, on CPU or
a GPU). The engine contract both implement (``docs/GENERATION_API.md``, "Encoder-decoder
models")::

    Seq2SeqModel(config_json: str, weights: Dict[str, Tensor], options_json: str)
        # T5Config.to_json(), load_t5_weights(dir, tp_rank) (FT names without rank suffix),
        # model_options_json(EngineOptions(...), max_batch=, max_seq_len=, dtype=)
    max_batch() -> int;  max_seq_len() -> int   # max_seq_len bounds S and 1 + output_len
    encode(input_ids int32 [B, S], input_lengths int32 [B]) -> [B, S, d_model] (0 past lengths)
    decode(input_ids, input_lengths, output_len: int, options: Dict[str, Tensor]) -> Dict
    decode_start(input_ids, input_lengths, output_len, options) -> None
    decode_step(max_steps: int) -> int32 [B, beam, k]
    decode_finish() -> Dict[str, Tensor]

``input_ids`` are the encoder's, right padded; the result is the decoder's: ``output_ids`` int32
``[B, beam, 1 + output_len]`` (column 0 the decoder start token, then the generated tokens,
``end_id`` past a row's end), ``sequence_lengths`` int32 ``[B, beam]`` counting the start token,
``cum_log_probs`` / ``output_log_probs`` / ``hidden_states`` as GPT's.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from .generation_api import (
    GenerationOutput,
    IdsLike,
    _check_new_tokens,
    _cuda_available,
    _GenerationAPI,
    _option_kwargs,
    _tensor,
)
from .options import EngineOptions, model_options_json
from .reference_seq2seq import UNSUPPORTED_OPTIONS
from .t5_config import T5Config
from .weights import DTYPES, resolve_model_dir

__all__ = ["Seq2Seq", "build_seq2seq_model"]

_OP = "Seq2SeqModel.decode"
_DEFAULT_MAX_SEQ_LEN = 2048  # T5's relative positions have no table to bound a call


def _engine_class() -> Any | None:
    """``torch.classes.warpformer.Seq2SeqModel``, or None when this build lacks it."""
    try:
        return torch.classes.warpformer.Seq2SeqModel
    except (RuntimeError, AttributeError):
        return None


def build_seq2seq_model(config: T5Config, weights: dict[str, torch.Tensor], *,
                        dtype: torch.dtype, max_batch: int, max_seq_len: int,
                        options: EngineOptions | None = None) -> torch.ScriptObject:
    """``torch.classes.warpformer.Seq2SeqModel`` from a config and one rank's weights
    (:func:`~warpformer.t5_weights.load_t5_weights`: FT names, per-rank shapes, on the GPU)."""
    from .models.gpt import dtype_name

    cls = _engine_class()
    if cls is None:
        raise ValueError("this warpformer build has no torch.classes.warpformer.Seq2SeqModel "
                         "(the encoder-decoder engine); rebuild it, or use backend='reference'")
    text = model_options_json(options or EngineOptions(), max_batch=max_batch,
                              max_seq_len=max_seq_len, dtype=dtype_name(dtype))
    return cls(config.to_json(), weights, text)


class Seq2Seq(_GenerationAPI):
    """A converted encoder-decoder model ready to generate. Build it with
    :meth:`from_pretrained`."""

    def __init__(self, engine: Any, config: T5Config, backend: str, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.engine = engine
        """``torch.classes.warpformer.Seq2SeqModel`` (engine) or ``Seq2SeqReferenceEngine``."""
        self._max_batch, self._max_seq_len = int(engine.max_batch()), int(engine.max_seq_len())
        self.config = config
        self.backend = backend
        self.dtype = dtype
        self.device = device

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(cls, converted_dir: str | os.PathLike[str], *, backend: str = "auto",
                        dtype: torch.dtype | None = None, tensor_para_size: int = 1,
                        pipeline_para_size: int = 1, max_batch: int = 8,
                        max_seq_len: int | None = None, device: str | torch.device | None = None,
                        cuda_graphs: bool = True, prefill_tokens: int | None = None,
                        peer_allreduce: bool = True,
                        gemm_config: str | os.PathLike[str] | None = None) -> Seq2Seq:
        """Load a directory written by ``warpformer convert`` from a T5- or BART-family
        checkpoint (``OUT`` or ``OUT/<tp>-gpu``).

        Args:
            converted_dir: the converted checkpoint.
            backend: ``"engine"`` (the C++ engine; ``"cuda"`` is accepted as GPT spells it),
                ``"reference"`` (plain PyTorch) or ``"auto"`` (the engine when a GPU is
                visible and this build has it, else the reference with a warning).
            dtype: the engine's compute dtype (default: the folder's ``weight_data_type``; T5
                v1.1 / mT5 overflow in float16). The reference computes in float32 whatever
                is asked.
            tensor_para_size, pipeline_para_size: 1 (parallel encoder-decoder runs are not
                available yet).
            max_batch: the largest batch a call may use.
            max_seq_len: the longest encoder input, and the most decoder tokens (1 +
                ``max_new_tokens``); default: the BART family's position tables, 2048 for T5.
            device: where the model lives (default ``cuda`` for the engine, ``cpu`` for the
                reference).
            cuda_graphs, prefill_tokens, peer_allreduce, gemm_config: the engine options
                (:mod:`warpformer.options`; the reference has none).
        """
        from .models.gpt import dtype_name
        from .t5_weights import read_t5_config

        if dtype is not None:
            dtype_name(dtype)  # ValueError for unsupported dtypes
        options = EngineOptions(cuda_graphs=cuda_graphs, prefill_tokens=prefill_tokens,
                                peer_allreduce=peer_allreduce, gemm_config=gemm_config)
        if backend not in ("auto", "engine", "cuda", "reference"):
            raise ValueError(f"backend must be 'auto', 'engine' (or 'cuda') or 'reference', got "
                             f"{backend!r}")
        for arg, value in (("tensor_para_size", tensor_para_size),
                           ("pipeline_para_size", pipeline_para_size), ("max_batch", max_batch)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{arg} must be a positive integer, got {value!r}")
        if tensor_para_size * pipeline_para_size > 1:
            raise ValueError("tensor_para_size/pipeline_para_size > 1: encoder-decoder models "
                             "run on one device for now (the reference loads any converted "
                             "tensor_para_size merged)")
        path = resolve_model_dir(converted_dir)
        config = read_t5_config(path)
        limit = max_seq_len if max_seq_len is not None else _default_max_seq_len(config)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 2:
            raise ValueError(f"max_seq_len must be an integer >= 2, got {limit!r}")
        if config.is_bart:
            table = min(config.encoder.max_pos_seq_len, config.decoder.max_pos_seq_len)
            if limit > table:
                raise ValueError(f"max_seq_len ({limit}) exceeds the model's position tables "
                                 f"(max_pos_seq_len = {table})")
        if backend == "auto":
            if _cuda_available() and _engine_class() is not None:
                backend = "engine"
            else:
                backend = "reference"
                warnings.warn("warpformer: no CUDA device visible or no encoder-decoder engine "
                              "in this build; using the plain-PyTorch reference backend (slow, "
                              "same results)", stacklevel=2)
        if backend == "reference":
            from .reference_seq2seq import Seq2SeqReference, Seq2SeqReferenceEngine

            device = torch.device(device if device is not None else "cpu")
            model = Seq2SeqReference.from_dir(path, device=device)
            return cls(Seq2SeqReferenceEngine(model, max_batch, limit), config, "reference",
                       torch.float32, device)
        if not _cuda_available():
            raise ValueError("backend='engine' needs a CUDA device and none is visible; use "
                             "backend='reference' (or 'auto') to run on CPU")
        if config.tensor_para_size != tensor_para_size:
            raise ValueError(f"tensor_para_size={tensor_para_size} but {path} was converted for "
                             f"tensor_para_size {config.tensor_para_size}; pass "
                             f"{config.tensor_para_size} or reconvert")
        from .t5_weights import load_t5_weights

        dtype = dtype if dtype is not None else DTYPES[config.weight_data_type]
        device = torch.device(device if device is not None else "cuda")
        weights = load_t5_weights(path, 0, dtype=dtype, device=device)
        engine = build_seq2seq_model(config, weights, dtype=dtype, max_batch=max_batch,
                                     max_seq_len=limit, options=options)
        return cls(engine, config, "engine", dtype, device)

    # ------------------------------------------------------------------ properties
    @property
    def vocab_size(self) -> int:
        """``V``: the checkpoint's vocabulary size (token ids are in ``[0, V)``)."""
        return self.config.vocab_size

    @property
    def end_id(self) -> int:
        """The checkpoint's end-of-sequence id (``eos_token_id``; :meth:`generate`'s default)."""
        return self.config.eos_token_id

    @property
    def end_ids(self) -> tuple[int, ...]:
        """Every end-of-sequence id of the checkpoint (one for these families)."""
        return (self.end_id,)

    @property
    def decoder_start_id(self) -> int:
        """The token the decoder starts from (``decoder_start_token_id``): column 0 of every
        output sequence."""
        return self.config.decoder_start_token_id

    # ------------------------------------------------------------------ the shared front end
    def _check_limits(self, batch: int, seq: int, new_tokens: int) -> None:
        if batch > self.max_batch:
            raise ValueError(f"batch size {batch} exceeds max_batch ({self.max_batch}) given to "
                             "from_pretrained")
        if seq > self.max_seq_len:
            raise ValueError(f"encoder input length {seq} exceeds max_seq_len "
                             f"({self.max_seq_len})")
        if 1 + new_tokens > self.max_seq_len:
            raise ValueError(f"1 (the decoder start token) + max_new_tokens {new_tokens} = "
                             f"{1 + new_tokens} exceeds max_seq_len ({self.max_seq_len})")

    def _token_starts(self, input_lengths: list[int]) -> list[int]:
        return [1] * len(input_lengths)  # after the decoder start token

    def _options(self, batch: int, max_new_tokens: int, *, memory_len=0, session=0,
                 prompt_table=None, return_context_embeddings=False, return_cum_log_probs=0,
                 stacklevel: int = 3, **kwargs: Any) -> dict[str, torch.Tensor]:
        """GPT's options dict, the decoder-only options refused by name first."""
        refused = (
            ("memory_len", bool(_tensor("memory_len", memory_len).ne(0).any())),
            ("session", bool(_tensor("session", session).ne(0).any())),
            ("prompt_table", prompt_table is not None),
            ("return_context_embeddings", bool(return_context_embeddings)),
            ("return_cum_log_probs",
             bool(_tensor("return_cum_log_probs", return_cum_log_probs).eq(2).any())),
        )
        for name, given in refused:
            if given:
                shown = "return_cum_log_probs=2" if name == "return_cum_log_probs" else name
                raise ValueError(f"{shown} is not supported by encoder-decoder models: "
                                 f"{UNSUPPORTED_OPTIONS[name]}")
        return super()._options(batch, max_new_tokens, return_cum_log_probs=return_cum_log_probs,
                                stacklevel=stacklevel + 1, **kwargs)

    def _checked(self, opts: dict[str, torch.Tensor], batch: int) -> dict[str, torch.Tensor]:
        try:
            return super()._checked(opts, batch)
        except ValueError as exc:  # the op names GPT's engine
            raise ValueError(str(exc).replace("GptModel.decode", _OP, 1)) from None

    # ------------------------------------------------------------------ calls
    def encode(self, input_ids: IdsLike,
               input_lengths: torch.Tensor | Sequence[int] | None = None) -> torch.Tensor:
        """The encoder's output ``[B, S, d_model]`` (after its final norm where the family has
        one), zeros past each row's length; the engine's dtype (fp32 on the reference).
        ``input_ids`` / ``input_lengths`` as in :meth:`generate`."""
        ids, lengths = self._inputs(input_ids, input_lengths, 0)
        with torch.no_grad():
            return self.engine.encode(ids, lengths)

    def generate(self, input_ids: IdsLike, max_new_tokens: int, *,
                 input_lengths: torch.Tensor | Sequence[int] | None = None,
                 prompt_embeddings: torch.Tensor | None = None,
                 prompt_lengths: torch.Tensor | Sequence[int] | None = None,
                 inputs_embeds: torch.Tensor | None = None,
                 **options: Any) -> GenerationOutput:
        """Encode ``input_ids`` and generate up to ``max_new_tokens`` decoder tokens per row.

        Args:
            input_ids: the encoder's input: an int tensor ``[B, S]`` (right padded; any
                device) or a list of ``B`` token lists of any lengths; ids in
                ``[0, vocab_size)``.
            max_new_tokens: decoder tokens to generate, >= 1 (1 + it <= ``max_seq_len``).
            input_lengths: with a tensor ``input_ids``: int ``[B]`` valid lengths (default S).
            **options: :meth:`warpformer.GPT.generate`'s (``do_sample``, ``top_k``, ``top_p``,
                ``temperature``, the repetition / presence / frequency penalties,
                ``min_length`` (new tokens), ``num_beams``, ``length_penalty``,
                ``diversity_rate``, ``stop_words``, ``bad_words``, ``end_id``, ``seed``,
                ``return_log_probs``, ``return_cum_log_probs`` (0 or 1),
                ``return_hidden_states``), with the same meaning on the decoder's sequence:
                the start token is its prompt (penalties count it; bad and stop words may
                start with it). ``memory_len``, ``return_context_embeddings``,
                ``return_cum_log_probs=2`` and prompt embeddings (``prompt_embeddings``,
                ``prompt_lengths``, ``inputs_embeds``) raise ``ValueError``.
        Returns:
            :class:`~warpformer.gpt.GenerationOutput` of the decoder: ``sequences`` int64
            ``[B, beams, 1 + max_new_tokens]`` (the start token, the generated ids, ``end_id``
            past the end), ``sequence_lengths`` counting the start token, ``input_lengths`` the
            encoder's, ``tokens[b][k]`` the generated ids (``end_id`` included when produced),
            ``cum_log_probs`` / ``log_probs`` / ``hidden_states`` when asked.
        """
        for name, value in (("prompt_embeddings", prompt_embeddings),
                            ("prompt_lengths", prompt_lengths), ("inputs_embeds", inputs_embeds)):
            if value is not None:
                raise ValueError(f"{name} is not supported by encoder-decoder models: "
                                 f"{UNSUPPORTED_OPTIONS['prompt_table']}")
        _check_new_tokens(max_new_tokens)
        ids, lengths = self._inputs(input_ids, input_lengths, max_new_tokens)
        opts = self._options(ids.shape[0], max_new_tokens, **_option_kwargs(options),
                             stacklevel=3)
        with torch.no_grad():
            result = self.engine.decode(ids, lengths, max_new_tokens, opts)
        return self._output(result, lengths)

    def __repr__(self) -> str:
        c = self.config
        return (f"Seq2Seq({c.model_type}, layers={c.encoder.num_layers}+{c.decoder.num_layers}, "
                f"d_model={c.d_model}, vocab={c.vocab_size}, backend={self.backend}, "
                f"dtype={self.dtype}, device={self.device})")


def _default_max_seq_len(config: T5Config) -> int:
    """The BART family's position tables (the shorter of the two); T5: 2048."""
    if config.is_bart:
        return min(config.encoder.max_pos_seq_len, config.decoder.max_pos_seq_len)
    return _DEFAULT_MAX_SEQ_LEN
