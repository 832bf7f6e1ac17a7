"""Interactive sessions (:meth:`warpformer.GPT.start_session`): conversations whose KV caches
stay on the GPU between turns.

    >>> with gpt.start_session(batch=1, max_len=2048) as chat:
    ...     out = chat.generate([user_turn_1], max_new_tokens=64)
    ...     out = chat.generate([user_turn_2], max_new_tokens=64)  # sees turn 1 and its reply

A session holds ``batch`` rows of the engine's KV cache. Each turn appends its new tokens to
every row's history (the earlier turns' prompts and generated tokens) and asks the engine to
generate from the whole history with the option ``session``; the engine reuses the prefix of the
history that the row's cache holds and runs the prompt pass over the rest only, so a turn costs
its new tokens, not the history. The tokens are those of :meth:`GPT.generate` over the whole
history in one call (in fp16/bf16 up to rounding: the earlier turns' generated tokens had their
keys and values computed by decode steps rather than a prompt pass, so near ties may differ).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .gpt import GPT, GenerationOutput, IdsLike

__all__ = ["GenerationSession"]


class GenerationSession:
    """``batch`` conversations on one model instance (see the module docstring).

    Args:
        gpt: the model.
        batch: rows (conversations), 1..``max_batch``.
        max_len: the most tokens of a row's history plus a turn's new tokens, 2..``max_seq_len``.
    """

    def __init__(self, gpt: GPT, batch: int, max_len: int) -> None:
        for name, value in (("batch", batch), ("max_len", max_len)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        if not 1 <= batch <= gpt.max_batch:
            raise ValueError(f"batch must be in [1, max_batch = {gpt.max_batch}], got {batch}")
        if not 2 <= max_len <= gpt.max_seq_len:
            raise ValueError(f"max_len must be in [2, max_seq_len = {gpt.max_seq_len}], got "
                             f"{max_len}")
        self._gpt = gpt
        self.batch = batch
        self.max_len = max_len
        self._handle = int(gpt.engine.open_session(batch, max_len))
        self._history: list[list[int]] = [[] for _ in range(batch)]

    @property
    def closed(self) -> bool:
        return self._handle == 0

    @property
    def history(self) -> list[list[int]]:
        """Each row's tokens so far: every turn's new tokens and generated tokens."""
        return [list(h) for h in self._history]

    def generate(self, new_ids: IdsLike, max_new_tokens: int, *,
                 input_lengths: torch.Tensor | Sequence[int] | None = None,
                 **options: Any) -> GenerationOutput:
        """One turn: append ``new_ids`` (``B`` token lists, or an int tensor ``[B, S]`` with
        ``input_lengths``; a row may add none if its history is not empty) to the histories and
        generate ``max_new_tokens`` tokens per row. ``options`` are :meth:`GPT.generate`'s
        (``num_beams`` must be 1). Returns what :meth:`GPT.generate` returns for the whole
        histories: ``sequences`` hold history + new tokens + generated ones."""
        from .generation_api import _check_new_tokens, _option_kwargs

        if self.closed:
            raise ValueError("the session is closed")
        _check_new_tokens(max_new_tokens)
        if options.get("num_beams", 1) != 1:
            raise ValueError("num_beams must be 1 in a session: beam search would leave each "
                             "row's cache to one beam")
        new = _rows(new_ids, input_lengths, self.batch)
        full = [h + n for h, n in zip(self._history, new, strict=True)]
        for b, row in enumerate(full):
            if not row:
                raise ValueError(f"row {b} has no tokens: its history is empty and new_ids[{b}] "
                                 "adds none")
            if len(row) + max_new_tokens > self.max_len:
                raise ValueError(
                    f"row {b}: history {len(self._history[b])} + new tokens {len(new[b])} + "
                    f"max_new_tokens {max_new_tokens} = {len(row) + max_new_tokens} exceeds the "
                    f"session's max_len ({self.max_len})")
        gpt = self._gpt
        call = gpt._prepare(full, max_new_tokens, input_lengths=None, session=self._handle,
                            **_option_kwargs(options))
        out = gpt._output(*call(gpt.engine))
        seqs = out.sequences[:, 0].cpu()
        lengths = out.sequence_lengths[:, 0].cpu().tolist()
        self._history = [seqs[b, :lengths[b]].tolist() for b in range(self.batch)]
        return out

    def close(self) -> None:
        """Frees the session's rows of the cache (idempotent)."""
        if not self.closed:
            self._gpt.engine.close_session(self._handle)  # refused while a call runs
            self._handle = 0

    def __enter__(self) -> GenerationSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"tokens={[len(h) for h in self._history]}"
        return f"GenerationSession(batch={self.batch}, max_len={self.max_len}, {state})"


def _rows(new_ids, input_lengths, batch: int) -> list[list[int]]:
    """``new_ids`` as ``batch`` Python token lists (validation of the ids themselves is left to
    :meth:`GPT.generate`'s checks of the whole history)."""
    if isinstance(new_ids, torch.Tensor):
        if new_ids.dim() != 2 or new_ids.dtype.is_floating_point or new_ids.is_complex():
            raise ValueError(f"new_ids must be an integer tensor [B, S], got "
                             f"{new_ids.dtype} {list(new_ids.shape)}")
        ids = new_ids.cpu().tolist()
        if input_lengths is None:
            lengths = [new_ids.shape[1]] * new_ids.shape[0]
        else:
            lengths = [int(n) for n in torch.as_tensor(input_lengths).reshape(-1).tolist()]
            if len(lengths) != len(ids) or any(not 0 <= n <= new_ids.shape[1] for n in lengths):
                raise ValueError(f"input_lengths must be {len(ids)} values in [0, "
                                 f"{new_ids.shape[1]}], got {lengths}")
        rows = [r[:n] for r, n in zip(ids, lengths, strict=True)]
    else:
        if input_lengths is not None:
            raise ValueError("input_lengths is only for a tensor new_ids")
        try:
            rows = [list(r) for r in new_ids]
        except TypeError:
            raise ValueError("new_ids must be a list of token lists or an int tensor [B, S]"
                             ) from None
    if len(rows) != batch:
        raise ValueError(f"new_ids has {len(rows)} rows; the session has {batch}")
    return rows
