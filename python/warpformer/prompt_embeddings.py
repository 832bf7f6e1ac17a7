"""Prompt embeddings (:meth:`warpformer.GPT.generate`'s ``prompt_embeddings`` / ``inputs_embeds``)
as engine inputs: each row's vectors become ids ``vocab_size + j`` that index the call's
``prompt_table`` (FT's prompt-tuning convention; docs/GENERATION_API.md), followed by its tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .gpt import GPT, IdsLike

__all__ = ["prompt_inputs"]


def prompt_inputs(gpt: GPT, input_ids: IdsLike | None, input_lengths, new_tokens: int,
                  prompt_embeddings: torch.Tensor, prompt_lengths
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, lengths, table) of a call with prompt embeddings: row b's first
    ``prompt_lengths[b]`` positions take ``prompt_embeddings[b]``'s rows (as ids
    ``vocab_size + j`` of the engine's ``prompt_table``), then its tokens follow. Raises
    ValueError naming the argument, as :meth:`GPT.generate` does."""
    E, width_wanted = prompt_embeddings, gpt.config.embedding_dim
    if not isinstance(E, torch.Tensor) or not E.dtype.is_floating_point or E.dim() != 3:
        got = f"{E.dtype} {list(E.shape)}" if isinstance(E, torch.Tensor) else type(E).__name__
        raise ValueError(f"prompt_embeddings must be a floating tensor [B, P, {width_wanted}], "
                         f"got {got}")
    B, P, width = E.shape
    if width != width_wanted:
        raise ValueError(f"prompt_embeddings must have the word embedding width {width_wanted} "
                         f"as last dimension, got {width}")
    if prompt_lengths is None:
        plen = [P] * B
    else:
        plen = [int(n) for n in torch.as_tensor(prompt_lengths).reshape(-1).tolist()]
        if len(plen) != B or any(not 0 <= n <= P for n in plen):
            raise ValueError(f"prompt_lengths must be {B} values in [0, {P}], got {plen}")
    if input_ids is None:
        if input_lengths is not None:
            raise ValueError("input_lengths needs input_ids")
        rows = [[] for _ in range(B)]
    else:
        ids, lengths = gpt._inputs(input_ids, input_lengths, 0)
        if ids.shape[0] != B:
            raise ValueError(f"prompt_embeddings has {B} rows; input_ids has {ids.shape[0]}")
        rows = [ids[b, :int(n)].tolist() for b, n in enumerate(lengths.tolist())]
    for b in range(B):
        if plen[b] + len(rows[b]) == 0:
            raise ValueError(f"row {b} is empty (no prompt embeddings and no tokens)")
    offsets = [sum(plen[:b]) for b in range(B)]
    if sum(plen) == 0:
        raise ValueError("prompt_lengths are all 0: pass the tokens alone")
    table = torch.cat([E[b, :plen[b]] for b in range(B)]).detach()
    V = gpt.vocab_size
    full = [list(range(V + offsets[b], V + offsets[b] + plen[b])) + rows[b] for b in range(B)]
    S = max(map(len, full))
    gpt._check_limits(B, S, new_tokens)
    ids = torch.tensor([r + [0] * (S - len(r)) for r in full], dtype=torch.int32)
    lengths = torch.tensor([len(r) for r in full], dtype=torch.int32)
    ids, lengths = gpt._placed(ids, lengths)
    return ids, lengths, table
