"""The generation front end that every model class shares (``warpformer.GPT``,
``warpformer.Seq2Seq``): keyword options checked and turned into the engine's options dict
(``docs/GENERATION_API.md``; the engine's ``generation_options`` op holds the rules), the
inputs placed, the engine's result turned into a :class:`GenerationOutput`, and streaming through
``decode_start`` / ``decode_step`` / ``decode_finish``."""

from __future__ import annotations

import abc
import warnings
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .words import is_token_list, with_words, words_to_ft

__all__ = ["GenerationOutput", "IdsLike"]

IdsLike = torch.Tensor | Sequence[Sequence[int]]


@dataclass
class GenerationOutput:
    """What :meth:`GPT.generate` returns (HF-style names; FT's in brackets). For
    :meth:`warpformer.Seq2Seq.generate` it describes the decoder: ``sequences`` are ``[B,
    beams, 1 + max_new_tokens]``, the decoder start token then the generated ids,
    ``sequence_lengths`` count the start token and ``input_lengths`` are the encoder's.

    Attributes:
        sequences: int64 ``[B, beams, S + max_new_tokens]`` [output_ids]: each prompt (right
            padded to ``S``) followed from its own length on by the generated tokens, ``end_id``
            past the end. Beams are sorted best first; ``beams`` is 1 without beam search.
        sequence_lengths: int64 ``[B, beams]`` [sequence_length]: prompt + generated tokens
            (``end_id`` counted when it was produced).
        input_lengths: int64 ``[B]``: the prompt lengths.
        tokens: ``tokens[b][k]`` is the list of generated ids of row ``b``, beam ``k`` (``end_id``
            included when produced, as in ``sequence_lengths``).
        cum_log_probs: float32 ``[B, beams]`` [cum_log_probs]: summed log probs of the generated
            tokens (plus the prompt's with ``return_cum_log_probs=2``); always set for beam
            search, else only when asked.
        log_probs: float32 ``[B, beams, max_new_tokens]`` [output_log_probs] of each chosen token
            (after penalties and temperature, before top-k/top-p), 0 past the end; when asked.
        context_embeddings: ``[B, S, hidden_size]`` in the model dtype [context_embeddings]: the
            final hidden states (after the final norm: what the head is applied to; before
            OPT's ``project_out``) of every prompt position, 0 past each row's length; when asked
            (``return_context_embeddings``).
        hidden_states: ``[B, 1, max_new_tokens, hidden_size]`` in the model dtype: for generated
            token ``i``, the final hidden state it was chosen from (``i = 0``: the last prompt
            token's; then that of token ``i - 1`` when it was fed), 0 past the row's end; when
            asked (``return_hidden_states``; not with beam search).
    """

    sequences: torch.Tensor
    sequence_lengths: torch.Tensor
    input_lengths: torch.Tensor
    tokens: list[list[list[int]]]
    cum_log_probs: torch.Tensor | None = None
    log_probs: torch.Tensor | None = None
    context_embeddings: torch.Tensor | None = None
    hidden_states: torch.Tensor | None = None

    @property
    def output_ids(self) -> torch.Tensor:
        """FT's name for :attr:`sequences` (int64 ``[B, beams, S + max_new_tokens]``)."""
        return self.sequences


def _tensor(name: str, value) -> torch.Tensor:
    """A number or a list of numbers as a tensor (its dtype, shape and values are the engine's
    to check); ValueError naming the argument when it is neither."""
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        raise ValueError(f"{name} must be a number or a list of numbers, got {value!r}") from None


def _cuda_available() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


class _GenerationAPI(abc.ABC):
    """What :class:`GPT` and :class:`warpformer.Seq2Seq` share: the inputs' checks, the
    keyword options turned into the engine's options dict (checked by its own rules), the
    engine's result turned into a :class:`GenerationOutput`, and streaming through
    ``decode_start`` / ``decode_step`` / ``decode_finish``. A subclass sets ``engine``,
    ``backend`` (``"reference"`` or an engine's), ``device``, ``_max_batch`` and
    ``_max_seq_len``, and has ``vocab_size``, ``end_id``, ``end_ids`` and ``_check_limits``."""

    engine: Any
    backend: str
    device: torch.device
    _max_batch: int
    _max_seq_len: int
    vocab_size: int
    end_id: int
    end_ids: tuple[int, ...]

    @abc.abstractmethod
    def _check_limits(self, batch: int, seq: int, new_tokens: int) -> None:
        """ValueError naming the limit when a call of ``batch`` inputs of width ``seq`` and
        ``new_tokens`` new tokens exceeds the instance's."""

    def _token_starts(self, input_lengths: list[int]) -> list[int]:
        """Where each row's generated tokens start in ``output_ids`` (GPT: after its prompt)."""
        return input_lengths

    @property
    def max_batch(self) -> int:
        """The largest batch a call may use (``max_batch`` of :meth:`from_pretrained`)."""
        return self._max_batch

    @property
    def max_seq_len(self) -> int:
        """The limit on a call's lengths (``max_seq_len`` of :meth:`from_pretrained`): GPT's
        prompt length + ``max_new_tokens``; Seq2Seq's encoder input, and 1 + ``max_new_tokens``
        decoder tokens."""
        return self._max_seq_len

    # ------------------------------------------------------------------ inputs
    def _inputs(self, input_ids: IdsLike, input_lengths, new_tokens: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Validate and return (ids int32 [B, S], lengths int32 [B]): on the CPU for the cuda
        backend (the engine checks them there and sends them to the GPU with the call's other
        arrays in one copy), on the model's device for the reference backend."""
        if isinstance(input_ids, torch.Tensor):
            ids = input_ids
            if ids.dim() == 1:
                ids = ids[None]
            if ids.dim() != 2:
                raise ValueError(f"input_ids must be [B, S], got shape {list(input_ids.shape)}")
            if ids.dtype.is_floating_point or ids.dtype == torch.bool:
                raise ValueError(f"input_ids must hold integers, got {ids.dtype}")
            if ids.shape[0] == 0:
                raise ValueError("input_ids is an empty batch")
            if ids.shape[1] == 0:
                raise ValueError("input_ids has empty rows (S = 0)")
            B, S = ids.shape
            if input_lengths is None:
                lengths = torch.full((B,), S, dtype=torch.int64)
            else:
                lengths = torch.as_tensor(input_lengths).reshape(-1).cpu().long()
                if lengths.shape != (B,):
                    raise ValueError(f"input_lengths must have {B} entries, got "
                                     f"{lengths.numel()}")
                if bool((lengths < 1).any()):
                    raise ValueError(f"input_lengths: row {int((lengths < 1).nonzero()[0])} is "
                                     "empty (every row needs at least one token)")
                if bool((lengths > S).any()):
                    raise ValueError(f"input_lengths must be <= S = {S}, got {lengths.tolist()}")
            ids = ids.cpu().long()
        else:
            if not isinstance(input_ids, (list, tuple)) or not all(
                    isinstance(r, (list, tuple)) for r in input_ids):
                raise ValueError("input_ids must be a tensor [B, S] or a list of token lists")
            if len(input_ids) == 0:
                raise ValueError("input_ids is an empty batch")
            for b, row in enumerate(input_ids):
                if len(row) == 0:
                    raise ValueError(f"input_ids row {b} is empty")
                if not is_token_list(row):
                    raise ValueError(f"input_ids row {b} must hold ints")
            if input_lengths is not None:
                raise ValueError("input_lengths is only accepted with a tensor input_ids")
            # Checked and converted on the Python lists (a few C-level passes): tensor ops on
            # these small inputs cost more than the lists' own loops.
            B, S, V = len(input_ids), max(len(r) for r in input_ids), self.vocab_size
            if min(map(min, input_ids)) < 0 or max(map(max, input_ids)) >= V:
                b, s = next((b, s) for b, r in enumerate(input_ids)
                            for s, t in enumerate(r) if not 0 <= t < V)
                raise ValueError(f"input_ids[{b}, {s}] = {input_ids[b][s]} is outside the "
                                 f"vocabulary [0, {V})")
            self._check_limits(B, S, new_tokens)
            ids = torch.tensor([list(r) + [0] * (S - len(r)) for r in input_ids],
                               dtype=torch.int32)
            lengths = torch.tensor([len(r) for r in input_ids], dtype=torch.int32)
            return self._placed(ids, lengths)
        valid = torch.arange(S)[None] < lengths[:, None]
        bad = valid & ((ids < 0) | (ids >= self.vocab_size))
        if bool(bad.any()):
            b, s = (int(v) for v in bad.nonzero()[0])
            raise ValueError(f"input_ids[{b}, {s}] = {int(ids[b, s])} is outside the vocabulary "
                             f"[0, {self.vocab_size})")
        self._check_limits(B, S, new_tokens)
        return self._placed(ids.masked_fill(~valid, 0).to(torch.int32), lengths.to(torch.int32))

    def _placed(self, ids: torch.Tensor, lengths: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.backend != "reference":  # the engine takes CPU inputs: one copy with its own arrays
            return ids, lengths
        return ids.to(self.device), lengths.to(self.device)

    def _options(self, batch: int, max_new_tokens: int, *, do_sample, top_k, top_p, temperature,
                 repetition_penalty, presence_penalty, frequency_penalty, min_length, num_beams,
                 length_penalty, diversity_rate, stop_words, bad_words, end_id, seed,
                 return_log_probs, return_cum_log_probs=0, memory_len=0, session=0,
                 prompt_table=None, return_context_embeddings=False, return_hidden_states=False,
                 stacklevel: int = 3) -> dict[str, torch.Tensor]:
        """The arguments as the engine's options dict, checked and normalised by its rules
        (:meth:`_checked`). Here Python values only become tensors (and ``do_sample`` picks
        ``top_k``/``top_p``/``seed``)."""
        # max_new_tokens was checked by the caller, before the inputs (_check_new_tokens).
        if do_sample:
            top_k = 0 if top_k is None else top_k  # no filter: top_k=1 is greedy
            if seed is None:  # fresh seeds from torch's generator: torch.manual_seed controls it
                seed = torch.randint(0, 2**62, (batch,))
        else:
            if top_k not in (None, 1) or top_p not in (None, 1.0):
                warnings.warn("top_k/top_p are ignored without do_sample=True (greedy decoding); "
                              "pass do_sample=True to sample", stacklevel=stacklevel)
            top_k, top_p = 1, 1.0
        values = dict(top_k=top_k, top_p=top_p, temperature=temperature,
                      repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
                      frequency_penalty=frequency_penalty, min_length=min_length, end_id=end_id,
                      seed=seed, beam_width=num_beams, length_penalty=length_penalty,
                      diversity_rate=diversity_rate, return_log_probs=int(bool(return_log_probs)),
                      return_cum_log_probs=return_cum_log_probs, memory_len=memory_len,
                      session=session,
                      return_context_embeddings=int(bool(return_context_embeddings)),
                      return_hidden_states=int(bool(return_hidden_states)))
        opts = {key: _tensor("num_beams" if key == "beam_width" else key, v)
                for key, v in values.items() if v is not None}
        for name, words in (("stop_words", stop_words), ("bad_words", bad_words)):
            if words is not None:
                opts[name] = words_to_ft(words, name=name)
        if prompt_table is not None:
            opts["prompt_table"] = prompt_table
        checked = self._checked(opts, batch)
        extra = self.end_ids[1:] if end_id is None else ()
        if not extra:
            return checked
        # The checkpoint's further end ids end a row as one-token stop words, which finish a row
        # and keep the token, as an end id does. min_length bans only end_id, and beam search
        # takes no stop words: with either, the others would not end a row (refused).
        what = ("min_length > 0" if bool((checked["min_length"] > 0).any())
                else "num_beams > 1" if int(checked["beam_width"]) > 1 else None)
        if what is not None:
            raise ValueError(
                f"{what} with the checkpoint's several end ids {list(self.end_ids)} is not "
                f"supported (only end_id {self.end_id} would end a row); pass end_id=<one id> "
                "to use it")
        opts["stop_words"] = words_to_ft(with_words(stop_words, [[t] for t in extra]),
                                         name="stop_words")
        return self._checked(opts, batch)

    def _checked(self, opts: dict[str, torch.Tensor], batch: int) -> dict[str, torch.Tensor]:
        """``opts`` checked and normalised by the engine's own rules
        (``torch.ops.warpformer.generation_options``, what ``GptModel.decode`` applies): every
        option, per-row ones ``[batch]``. Its errors, which name the argument, as ValueError."""
        try:
            return torch.ops.warpformer.generation_options(opts, batch, self.vocab_size,
                                                           self.end_id)
        except RuntimeError as exc:
            raise ValueError(str(exc)) from None

    def _output(self, result: dict[str, torch.Tensor], lengths: torch.Tensor
                ) -> GenerationOutput:
        # The first copy waits for the device; the second finds it idle; then host work only.
        cpu_seqs = result["output_ids"].cpu()
        cpu_len = result["sequence_lengths"].cpu().tolist()
        starts = self._token_starts(lengths.cpu().tolist())
        tokens = [[cpu_seqs[b, k, starts[b]: cpu_len[b][k]].tolist()
                   for k in range(cpu_seqs.shape[1])] for b in range(cpu_seqs.shape[0])]
        seqs = result["output_ids"].long()
        seq_len = result["sequence_lengths"].long()
        lengths = lengths.long().to(seqs.device)
        return GenerationOutput(sequences=seqs, sequence_lengths=seq_len, input_lengths=lengths,
                                tokens=tokens, cum_log_probs=result.get("cum_log_probs"),
                                log_probs=result.get("output_log_probs"),
                                context_embeddings=result.get("context_embeddings"),
                                hidden_states=result.get("hidden_states"))

    def generate_stream(self, input_ids: IdsLike, max_new_tokens: int, *, chunk_size: int = 1,
                        **kwargs: Any) -> Generator[torch.Tensor, None, GenerationOutput]:
        """Like :meth:`generate` (same arguments, ``num_beams`` must be 1) but yields the new
        tokens as they are produced: int64 ``[B, k]`` on CPU per engine call (``k <=
        chunk_size``; rows that have ended hold ``end_id``). The generator's return value (the
        ``value`` of its ``StopIteration``, or ``result = yield from gen``) is the final
        :class:`GenerationOutput`. Breaking out of the loop early ends the generation."""
        if kwargs.get("num_beams", 1) != 1:
            raise ValueError("num_beams must be 1 for generate_stream: beam search is not "
                             "streamable (beams are reordered until the end)")
        if not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"chunk_size must be an integer >= 1, got {chunk_size!r}")
        input_lengths = kwargs.pop("input_lengths", None)
        _check_new_tokens(max_new_tokens)
        ids, lengths = self._inputs(input_ids, input_lengths, max_new_tokens)
        opts = self._options(ids.shape[0], max_new_tokens, **_option_kwargs(kwargs))
        return self._stream(ids, lengths, max_new_tokens, opts, chunk_size)

    def _stream(self, ids, lengths, max_new_tokens, opts, chunk_size):
        with torch.no_grad():
            self.engine.decode_start(ids, lengths, max_new_tokens, opts)
        finished = False
        try:
            while True:
                with torch.no_grad():
                    step = self.engine.decode_step(chunk_size)
                if step.shape[-1] == 0:
                    break
                yield step[:, 0].long().cpu()
            with torch.no_grad():
                result = self.engine.decode_finish()
            finished = True
            return self._output(result, lengths)
        finally:
            if not finished:  # closed early or failed: release the engine's call state
                try:
                    self.engine.decode_finish()
                except RuntimeError:
                    pass


_OPTION_NAMES = ("do_sample", "top_k", "top_p", "temperature", "repetition_penalty",
                 "presence_penalty", "frequency_penalty", "min_length", "num_beams",
                 "length_penalty", "diversity_rate", "stop_words", "bad_words", "end_id", "seed",
                 "return_log_probs", "return_cum_log_probs", "memory_len",
                 "return_context_embeddings", "return_hidden_states")
_OPTION_DEFAULTS = dict(do_sample=False, top_k=None, top_p=None, temperature=1.0,
                        repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0,
                        min_length=0, num_beams=1, length_penalty=1.0, diversity_rate=0.0,
                        stop_words=None, bad_words=None, end_id=None, seed=None,
                        return_log_probs=False, return_cum_log_probs=0, memory_len=0,
                        return_context_embeddings=False, return_hidden_states=False)


def _option_kwargs(kwargs: dict) -> dict:
    unknown = set(kwargs) - set(_OPTION_NAMES)
    if unknown:
        raise TypeError(f"unexpected argument(s) {sorted(unknown)}")
    return {**_OPTION_DEFAULTS, **kwargs}


def _check_new_tokens(max_new_tokens: int) -> None:
    if (isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int)
            or max_new_tokens < 1):
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
