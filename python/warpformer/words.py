"""Stop and bad word lists: the user's forms (one list of words shared by every row, or one list
per row) and FT's ``[B, 2, L]`` int32 format the engine takes (:func:`words_to_ft`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["WordsLike", "is_token_list", "with_words", "words_to_ft"]

# one list of words shared by every row, or one such list per row (see words_to_ft)
WordsLike = Sequence[Sequence[int]] | Sequence[Sequence[Sequence[int]]]


def is_token_list(x) -> bool:
    if not isinstance(x, (list, tuple)):
        return False
    if set(map(type, x)) <= {int}:  # the common case, checked without a Python-level loop
        return True
    return all(isinstance(t, int) and not isinstance(t, bool) for t in x)


def _per_row_words(words) -> bool:
    """Whether word lists are one list per row (``[[[5, 6]], [[7]]]``), not one shared list."""
    return len(words) > 0 and all(
        isinstance(w, (list, tuple)) and all(is_token_list(x) for x in w) and len(w) > 0
        and not is_token_list(w) for w in words)


def words_to_ft(words: WordsLike, batch_size: int | None = None,
                name: str = "stop_words") -> torch.Tensor:
    """Convert word lists to FT's ``[B, 2, L]`` int32 format.

    Args:
        words: either one list of words shared by every row (``[[5, 6], [7]]``: two words, one
            of two tokens) or one such list per row (``[[[5, 6]], [[7], [8, 9]]]``).
        batch_size: ``B``; a shared list is repeated ``B`` times (``None``: a shared list gives
            ``[2, L]``, per-row lists ``[rows, 2, L]``).
        name: argument name used in error messages.
    Returns:
        int32 ``[B, 2, L]`` (or ``[2, L]``): row 0 holds the words' ids concatenated, row 1 the
        end offset of each word; both padded with -1 to the longest row's ``L`` (at least 1).
    """
    if not isinstance(words, (list, tuple)):
        raise ValueError(f"{name} must be a list of token lists (e.g. [[5, 6], [7]]) or one such "
                         f"list per row, got {type(words).__name__}")
    per_row = _per_row_words(words)
    if per_row:
        rows = [list(w) for w in words]
        if batch_size is not None and len(rows) != batch_size:
            raise ValueError(f"{name} has {len(rows)} per-row lists for a batch of {batch_size}")
    else:
        if not all(is_token_list(w) for w in words):
            raise ValueError(f"{name} must be a list of token lists (e.g. [[5, 6], [7]]) or one "
                             "such list per row")
        rows = [list(words)] * (1 if batch_size is None else batch_size)
    for row in rows:
        for w in row:
            if len(w) == 0:
                raise ValueError(f"{name} contains an empty word")
    width = max([1] + [sum(len(w) for w in row) for row in rows])
    out = torch.full((len(rows), 2, width), -1, dtype=torch.int32)
    for r, row in enumerate(rows):
        flat = [t for w in row for t in w]
        out[r, 0, : len(flat)] = torch.tensor(flat, dtype=torch.int32)
        ends, pos = [], 0
        for w in row:
            pos += len(w)
            ends.append(pos)
        out[r, 1, : len(ends)] = torch.tensor(ends, dtype=torch.int32)
    return out[0] if batch_size is None and not per_row else out


def with_words(words: WordsLike | None, more: list[list[int]]) -> WordsLike:
    """``words`` (shared by every row, or one list per row, as :func:`words_to_ft` takes them)
    with the words ``more`` added for every row."""
    if words is None:
        return more
    return [list(w) + more for w in words] if _per_row_words(words) else list(words) + more
