"""The generation contract of the engines' decode sessions in plain PyTorch.

:class:`ReferenceEngine` wraps a :class:`~warpformer.reference.GptReference` and offers the same
methods as ``torch.classes.warpformer.GptModel``, with the same arguments, option dictionary and
returned dictionary (``docs/GENERATION_API.md``): ``forward``, greedy ``generate``, ``decode``,
``decode_start``, ``decode_step`` and ``decode_finish``. :class:`warpformer.GPT` drives either
engine through that one interface, so the CPU fallback supports every option the GPU does.
:class:`~warpformer.reference_seq2seq.Seq2SeqReferenceEngine` is the encoder-decoder twin.

The options live in one loop, :class:`Decoding`, which drives a model through a small adapter
(:class:`DecoderAdapter`: ``step`` feeds one token per row and returns its logits, ``reorder``
moves rows' caches for beams); each engine runs its own prefill and hands the loop the logits of
each row's last prompt token:

* sampling per step in the contract's order: repetition / presence / frequency penalties ->
  ``min_length`` and bad words (banned = -inf) -> temperature -> top-k -> top-p -> draw
  (greedy when ``top_k == 1``);
* stop words (a row ends when its sequence ends with one) and per-row ``end_id``;
* beam search that follows HF transformers' algorithm step for step (2 x beam_width candidates,
  hypotheses finished by ``end_id`` or a stop word scored ``cum_log_prob / generated_len **
  length_penalty``, HF's ``early_stopping=False`` heuristic, running beams finalised at the
  length limit), plus FT's ``diversity_rate``.

RNG: each row draws from its own ``torch.Generator`` seeded with the row's ``seed`` (so a row's
tokens do not depend on the other rows of the batch) through ``torch.multinomial``. The CUDA
engine uses its own counter-based generator, so the same seed gives reproducible tokens on each
backend, but not the same tokens on both; distributions agree, draws do not.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Protocol

import torch

from .reference import GptReference

__all__ = ["DecoderAdapter", "Decoding", "ReferenceEngine", "StepwiseEngine", "parse_ft_words"]

_WORD_KEYS = ("bad_words", "stop_words")
_NEG = -1.0e9


def parse_ft_words(t: torch.Tensor, batch: int) -> list[list[list[int]]]:
    """FT's ``[B, 2, L]`` / ``[2, L]`` word list, as ``generation_options`` checked it (row 0
    concatenated ids, row 1 end offsets, -1 padded) -> per row of the ``batch``, a list of token
    lists."""
    rows = t.expand(batch, -1, -1) if t.dim() == 2 else t
    words = []
    for ids, offsets in rows.tolist():
        ends = offsets[: next((i for i, e in enumerate(offsets) if e < 0), len(offsets))]
        words.append([ids[start:end] for start, end in zip([0] + ends, ends, strict=False)])
    return words


@dataclass
class _Options:
    """The option dict, validated and broadcast: per-row values are lists of length B."""

    end_id: list[int]
    top_k: list[int]
    top_p: list[float]
    temperature: list[float]
    repetition_penalty: list[float]
    presence_penalty: list[float]
    frequency_penalty: list[float]
    min_length: list[int]
    seed: list[int]
    beam_width: int
    length_penalty: float
    diversity_rate: float
    return_log_probs: int
    return_cum_log_probs: int
    return_context_embeddings: int
    return_hidden_states: int
    memory_len: int
    session: int
    prompt_table: torch.Tensor | None
    bad_words: list[list[list[int]]]
    stop_words: list[list[list[int]]]

    @classmethod
    def parse(cls, options: dict[str, torch.Tensor], batch: int, vocab: int,
              default_end: int) -> _Options:
        """``options`` checked and normalised by the C++ engine's own rules
        (``torch.ops.warpformer.generation_options``; RuntimeError naming the option)."""
        checked = torch.ops.warpformer.generation_options(options, batch, vocab, default_end)
        table = checked.pop("prompt_table", None)
        values = {key: t.tolist() for key, t in checked.items() if key not in _WORD_KEYS}
        values["prompt_table"] = table
        for key in _WORD_KEYS:
            values[key] = (parse_ft_words(checked[key], batch) if key in checked
                           else [[] for _ in range(batch)])
        return cls(**values)

    @property
    def penalties(self) -> bool:
        return (any(p != 1.0 for p in self.repetition_penalty)
                or any(p != 0.0 for p in self.presence_penalty)
                or any(p != 0.0 for p in self.frequency_penalty))


def _ends_with(seq: list[int], word: list[int]) -> bool:
    return len(seq) >= len(word) and seq[len(seq) - len(word):] == word


def _top_k_top_p(logits: torch.Tensor, k: int, p: float) -> torch.Tensor:
    """Keep the ``k`` largest logits (0 = all) of ``logits`` ``[V]``, then the smallest set of
    the most probable ones whose probability mass reaches ``p``; others become -inf."""
    if 0 < k < logits.numel():
        kth = torch.topk(logits, k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs
        drop = mass_before >= p
        drop[0] = False
        logits = logits.clone()
        logits[order[drop]] = float("-inf")
    return logits


class DecoderAdapter(Protocol):
    """What :class:`Decoding` asks of a model. Rows are ``b * beam_width + k``."""

    def step(self, tokens: torch.Tensor, positions: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed ``tokens`` ``[R]`` at sequence positions ``positions`` ``[R]`` (appending to
        each row's cache); returns their logits ``[R, V]`` and final hidden states ``[R, H]``."""
        ...

    def reorder(self, rows: torch.Tensor) -> None:
        """Row ``r`` continues from the cached state of row ``rows[r]`` (beam parents; also the
        expansion of ``B`` prompt rows into ``B * beam_width``). ``rows[r]`` always belongs to
        the batch entry of ``r``."""
        ...


class Decoding:
    """One decode call: the options, the per-row state and the steps over a model adapter.

    Args:
        model: the adapter, its caches holding the prompt of each batch entry (``B`` rows).
        opts: the call's parsed options.
        ids: long ``[B, S]`` right-padded prompt (for a decoder-only model the prompt; for an
            encoder-decoder the decoder's start tokens); outputs repeat it in their first ``S``
            columns, penalties, bad and stop words see it.
        lengths: long ``[B]`` prompt lengths; generated token ``i`` of row ``b`` sits at
            position ``lengths[b] + i``.
        output_len: the most tokens to generate.
        last, last_hidden: logits ``[B, V]`` and final hidden states ``[B, H]`` of each row's
            last prompt token (what the first token is chosen from).
        vocab: ``V``; prompt ids ``>= V`` (prompt-table rows) are not counted by the penalties.
        ctx_lp: ``[B]`` the prompts' summed log probs (``return_cum_log_probs == 2``).
        context: the prompts' final hidden states (``return_context_embeddings``).
    """

    def __init__(self, model: DecoderAdapter, opts: _Options, ids: torch.Tensor,
                 lengths: torch.Tensor, output_len: int, last: torch.Tensor,
                 last_hidden: torch.Tensor, *, vocab: int, ctx_lp: torch.Tensor | None = None,
                 context: torch.Tensor | None = None) -> None:
        dev = ids.device
        B, S = ids.shape
        W, N = opts.beam_width, output_len
        self.model, self.opts = model, opts
        self.B, self.W, self.N, self.S = B, W, N, S
        self.lengths = lengths
        self.context = context
        self.ctx_lp = torch.zeros(B, device=dev) if ctx_lp is None else ctx_lp
        if W > 1:  # every beam starts from the same prompt
            model.reorder(torch.arange(B, device=dev).repeat_interleave(W))
            last = last.repeat_interleave(W, 0)
            last_hidden = last_hidden.repeat_interleave(W, 0)
        self.last, self.last_hidden = last, last_hidden
        tokens = torch.full((B, W, S + N), 0, dtype=torch.long, device=dev)
        self.end = torch.tensor(opts.end_id, dtype=torch.long, device=dev)
        tokens[:] = self.end[:, None, None]
        tokens[:, :, :S] = ids[:, None, :]
        self.tokens = tokens
        self.hist = [[ids[b, : int(lengths[b])].tolist() for _ in range(W)] for b in range(B)]
        self.counts = None
        if opts.penalties:
            self.counts = torch.zeros(B * W, vocab, device=dev)
            for n in range(B * W):
                row = ids[n // W, : int(lengths[n // W])]
                row = row[row < vocab]  # prompt-table positions are not tokens
                self.counts[n].index_add_(0, row, torch.ones(row.shape[0], device=dev))
        # return_hidden_states (beam width 1): column i of row b holds the final hidden state
        # that generated token i was chosen from (zeros past the row's end).
        self.hidden = (torch.zeros(B, 1, N, last_hidden.shape[-1], dtype=last_hidden.dtype,
                                   device=dev) if opts.return_hidden_states else None)
        self.step = 0
        self.token_lp = torch.zeros(B, W, N, device=dev)
        self.running = torch.zeros(B, W, device=dev)
        self.done = torch.zeros(B, dtype=torch.bool, device=dev)
        if W == 1:
            self.gens = [torch.Generator(device=dev).manual_seed(int(s)) for s in opts.seed]
            self.gen_len = torch.zeros(B, dtype=torch.long, device=dev)
        else:
            self.running[:, 1:] = _NEG
            self.fin_tokens = tokens.clone()
            self.fin_score = torch.full((B, W), _NEG, device=dev)
            self.fin_cum = torch.zeros(B, W, device=dev)
            self.fin_len = torch.zeros(B, W, dtype=torch.long, device=dev)
            self.fin_lp = torch.zeros(B, W, N, device=dev)
            self.fin_set = torch.zeros(B, W, dtype=torch.bool, device=dev)

    def _process(self, logits: torch.Tensor) -> torch.Tensor:
        """Penalties, min_length, bad words and temperature on ``logits`` ``[B*W, V]``."""
        o, W, dev = self.opts, self.W, logits.device
        per_row = lambda xs: torch.tensor(xs, device=dev, dtype=torch.float32).repeat_interleave(W)  # noqa: E731
        logits = logits.float().clone()
        if self.counts is not None:
            counts = self.counts
            seen = counts > 0
            rep = per_row(o.repetition_penalty)[:, None]
            penalised = torch.where(logits < 0, logits * rep, logits / rep)
            logits = torch.where(seen, penalised, logits)
            logits = logits - per_row(o.presence_penalty)[:, None] * seen
            logits = logits - per_row(o.frequency_penalty)[:, None] * counts
        for n in range(logits.shape[0]):
            b = n // W
            if self.step < o.min_length[b]:
                logits[n, o.end_id[b]] = float("-inf")
            seq = self.hist[b][n % W]
            for word in o.bad_words[b]:
                if _ends_with(seq, word[:-1]) and 0 <= word[-1] < logits.shape[1]:
                    logits[n, word[-1]] = float("-inf")
        return logits / per_row(o.temperature)[:, None]

    def _stops(self, b: int, seq: list[int], token: int) -> bool:
        o = self.opts
        return token == o.end_id[b] or any(_ends_with(seq, w) for w in o.stop_words[b])

    def _advance(self, tokens: torch.Tensor) -> None:
        """Feed ``tokens`` ``[B*W]`` (the last chosen ones) through the model."""
        pos = self.lengths.repeat_interleave(self.W) + self.step - 1
        self.last, self.last_hidden = self.model.step(tokens, pos)

    def _sample_step(self) -> torch.Tensor:
        o, B, step = self.opts, self.B, self.step
        if self.hidden is not None:  # the rows still generating choose token `step` from these
            live = ~self.done
            self.hidden[live, 0, step] = self.last_hidden[live]
        logits = self._process(self.last)
        logp = torch.log_softmax(logits, -1)
        chosen = logits.argmax(-1)
        for b in range(B):
            if o.top_k[b] != 1 and not bool(self.done[b]):
                probs = torch.softmax(_top_k_top_p(logits[b], o.top_k[b], o.top_p[b]), -1)
                chosen[b] = torch.multinomial(probs, 1, generator=self.gens[b])[0]
        emitted = torch.where(self.done, self.end, chosen)
        for b in range(B):
            if bool(self.done[b]):
                continue
            tok = int(chosen[b])
            at = int(self.lengths[b]) + step
            self.tokens[b, 0, at] = tok
            self.token_lp[b, 0, step] = logp[b, tok]
            self.gen_len[b] += 1
            seq = self.hist[b][0]
            seq.append(tok)
            if self.counts is not None:
                self.counts[b, tok] += 1
            if self._stops(b, seq, tok):
                self.done[b] = True
        self.step += 1
        if self.step < self.N and not bool(self.done.all()):
            self._advance(emitted)
        return emitted[:, None]

    def _beam_step(self) -> torch.Tensor:
        o, B, W, N, step = self.opts, self.B, self.W, self.N, self.step
        dev = self.last.device
        K = 2 * W
        logp = torch.log_softmax(self._process(self.last), -1).view(B, W, -1)
        acc = logp + self.running[:, :, None]
        pv, pi = acc.topk(K, dim=-1)  # per parent: [B, W, K]
        sel = pv - o.diversity_rate * torch.arange(K, device=dev, dtype=pv.dtype)
        cand_sel, ci = sel.view(B, W * K).topk(K, dim=-1)  # sorted best first
        parent = ci // K
        tok = pi.view(B, W * K).gather(1, ci)
        cand_acc = pv.view(B, W * K).gather(1, ci)
        tok_lp = logp.gather(1, parent[:, :, None].expand(-1, -1, logp.shape[2])).gather(
            2, tok[:, :, None])[..., 0]
        finished = torch.zeros(B, K, dtype=torch.bool, device=dev)
        cand_hist = []
        for b in range(B):
            row = []
            for j in range(K):
                seq = self.hist[b][int(parent[b, j])] + [int(tok[b, j])]
                row.append(seq)
                finished[b, j] = step + 1 == N or self._stops(b, seq, int(tok[b, j]))
            cand_hist.append(row)
        at = self.lengths + step  # [B]
        rows = torch.arange(B, device=dev)[:, None]
        cand_tokens = self.tokens[rows, parent]  # [B, K, T]
        cand_tokens[rows, torch.arange(K, device=dev)[None], at[:, None]] = tok
        cand_lp = self.token_lp[rows, parent]  # [B, K, N]
        cand_lp[:, :, step] = tok_lp

        # finished hypotheses: only the top W candidates, only while improvement is possible
        gen_len = step + 1
        score = cand_acc / gen_len ** o.length_penalty
        eligible = finished & (torch.arange(K, device=dev) < W)[None] & ~self.done[:, None]
        score = torch.where(eligible, score, torch.full_like(score, _NEG))
        m_score = torch.cat([self.fin_score, score], 1)
        keep = m_score.topk(W, dim=1).indices
        self.fin_score = m_score.gather(1, keep)
        self.fin_tokens = torch.cat([self.fin_tokens, cand_tokens], 1)[rows, keep]
        self.fin_lp = torch.cat([self.fin_lp, cand_lp], 1)[rows, keep]
        self.fin_cum = torch.cat([self.fin_cum, cand_acc], 1).gather(1, keep)
        new_len = at[:, None].expand(B, K) + 1
        self.fin_len = torch.cat([self.fin_len, new_len], 1).gather(1, keep)
        self.fin_set = torch.cat([self.fin_set, eligible], 1).gather(1, keep)

        # running beams: the best W candidates that did not finish
        run = (cand_sel + finished.float() * _NEG).topk(W, dim=1).indices
        parents = parent.gather(1, run)
        self.running = cand_acc.gather(1, run) + finished.float().gather(1, run) * _NEG
        self.tokens = cand_tokens[rows, run]
        self.token_lp = cand_lp[rows, run]
        self.hist = [[cand_hist[b][int(run[b, w])] for w in range(W)] for b in range(B)]
        flat = (parents + torch.arange(B, device=dev)[:, None] * W).view(-1)
        self.model.reorder(flat)
        if self.counts is not None:
            self.counts = self.counts[flat]
            self.counts[torch.arange(B * W, device=dev), tok.gather(1, run).view(-1)] += 1
        emitted = tok.gather(1, run)

        # HF's early_stopping=False heuristic: stop a row once no running beam can beat the
        # worst finished hypothesis at the current length.
        best = self.running[:, 0] / gen_len ** o.length_penalty
        worst = self.fin_score.min(1).values
        can_improve = ~self.fin_set.all(1) | (best > worst)
        self.done = self.done | ~can_improve
        self.step += 1
        if self.step < N and not bool(self.done.all()):
            self._advance(emitted.view(-1))
        return emitted[:, :, None]

    @torch.no_grad()
    def run(self, max_steps: int) -> torch.Tensor:
        """Up to ``max_steps`` steps; int32 ``[B, beam, k]`` tokens (k == 0 once ended)."""
        out = []
        for _ in range(max_steps):
            if self.step >= self.N or bool(self.done.all()):
                break
            out.append(self._sample_step() if self.W == 1 else self._beam_step())
        if not out:
            return torch.zeros(self.B, self.W, 0, dtype=torch.int32, device=self.lengths.device)
        return torch.cat(out, -1).view(self.B, self.W, -1).to(torch.int32)

    def result(self) -> dict[str, torch.Tensor]:
        """The result dict of ``docs/GENERATION_API.md`` (see ``decode_finish``)."""
        o, W = self.opts, self.W
        if W == 1:
            ids, lp = self.tokens, self.token_lp
            seq_len = (self.lengths + self.gen_len)[:, None]
            cum = lp.sum(-1)
        else:
            ids, lp, seq_len, cum = self._finalize_beams()
        out = {"output_ids": ids.to(torch.int32), "sequence_lengths": seq_len.to(torch.int32)}
        if o.return_cum_log_probs or W > 1:
            extra = self.ctx_lp[:, None] if o.return_cum_log_probs == 2 else 0.0
            out["cum_log_probs"] = (cum + extra).float()
        if o.return_log_probs:
            out["output_log_probs"] = lp.float()
        if self.context is not None:
            out["context_embeddings"] = self.context
        if self.hidden is not None:
            out["hidden_states"] = self.hidden
        return out

    def _finalize_beams(self):
        """Fill empty hypothesis slots with running beams (length limit or early finish)."""
        o, B, W = self.opts, self.B, self.W
        dev = self.running.device
        steps = max(self.step, 1)
        run_score = self.running / steps ** o.length_penalty
        run_len = (self.lengths + self.step)[:, None].expand(B, W)
        score = torch.cat([self.fin_score, torch.where(self.fin_set.all(1, keepdim=True),
                                                       torch.full_like(run_score, 2 * _NEG),
                                                       run_score)], 1)
        keep = score.topk(W, dim=1).indices
        rows = torch.arange(B, device=dev)[:, None]
        ids = torch.cat([self.fin_tokens, self.tokens], 1)[rows, keep]
        lp = torch.cat([self.fin_lp, self.token_lp], 1)[rows, keep]
        seq_len = torch.cat([self.fin_len, run_len], 1).gather(1, keep)
        cum = torch.cat([self.fin_cum, self.running], 1).gather(1, keep)
        # end_id past each hypothesis' end, zero log probs past it
        t = torch.arange(ids.shape[2], device=dev)
        ids = torch.where(t[None, None] < seq_len[:, :, None], ids, self.end[:, None, None])
        gen = seq_len - self.lengths[:, None]
        lp = lp * (torch.arange(lp.shape[2], device=dev)[None, None] < gen[:, :, None])
        return ids, lp, seq_len, cum


class StepwiseEngine(abc.ABC):
    """``decode`` / ``decode_step`` / ``decode_finish`` over the :class:`Decoding` that a
    subclass's ``decode_start`` leaves in ``self._state``, and the instance's limits."""

    def __init__(self, max_batch: int, max_seq_len: int) -> None:
        self._max_batch = max_batch
        self._max_seq_len = max_seq_len
        self._state: Decoding | None = None

    def max_batch(self) -> int:
        """The largest batch a call may use."""
        return self._max_batch

    def max_seq_len(self) -> int:
        """The limit on a call's lengths (GPT: prompt + output; encoder-decoder: the encoder's
        input, and the decoder's start token + output)."""
        return self._max_seq_len

    @abc.abstractmethod
    def decode_start(self, input_ids: torch.Tensor, input_lengths: torch.Tensor,
                     output_len: int, options: dict[str, torch.Tensor]) -> None:
        """Checks the call and leaves its :class:`Decoding` in ``self._state``."""

    def decode(self, input_ids: torch.Tensor, input_lengths: torch.Tensor, output_len: int,
               options: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """:meth:`decode_start` + :meth:`decode_step` ``(output_len)`` + :meth:`decode_finish`:
        the whole generation, returning the result dict of :meth:`decode_finish`."""
        self.decode_start(input_ids, input_lengths, output_len, options)
        self.decode_step(output_len)
        return self.decode_finish()

    def decode_step(self, max_steps: int) -> torch.Tensor:
        """Run up to ``max_steps`` steps; int32 ``[B, beam, k]`` tokens (k == 0 once ended)."""
        if self._state is None:
            raise RuntimeError("decode_step called without decode_start")
        if max_steps < 1:
            raise RuntimeError("max_steps must be >= 1")
        return self._state.run(max_steps)

    def decode_finish(self) -> dict[str, torch.Tensor]:
        """The result dict of ``docs/GENERATION_API.md`` (releases the per-call state).

        ``output_ids`` int32 ``[B, beam, S + output_len]``, ``sequence_lengths`` int32
        ``[B, beam]``, ``cum_log_probs`` float32 ``[B, beam]`` (when asked or beam search) and
        ``output_log_probs`` float32 ``[B, beam, output_len]`` (when asked), and (when asked)
        ``context_embeddings`` ``[B, S, H]`` and ``hidden_states`` ``[B, 1, output_len, H]`` in
        the compute dtype, on the engine's device.
        """
        st, self._state = self._state, None
        if st is None:
            raise RuntimeError("decode_finish called without decode_start")
        return st.result()


class _GptAdapter:
    """:class:`GptReference` with per-row KV caches ``[(k, v)]`` as :class:`DecoderAdapter`."""

    def __init__(self, model: GptReference, caches: list, memory_len: int) -> None:
        self.model, self.caches, self.memory_len = model, caches, memory_len

    def step(self, tokens: torch.Tensor, positions: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
        self.model.memory_len = self.memory_len  # a forward() between steps resets it
        logits, final = self.model._run(tokens[:, None], positions[:, None], self.caches,
                                        hidden=True)
        return logits[:, 0], final[:, 0]

    def reorder(self, rows: torch.Tensor) -> None:
        self.caches = [(k[rows], v[rows]) for k, v in self.caches]


class ReferenceEngine(StepwiseEngine):
    """Plain-PyTorch twin of ``torch.classes.warpformer.GptModel`` (same methods and dicts).

    Args:
        model: the reference model (weights on the device and in the dtype to compute with).
        max_batch: the largest batch a call may use.
        max_seq_len: the largest prompt + output length.
    """

    def __init__(self, model: GptReference, max_batch: int, max_seq_len: int) -> None:
        self.model = model
        super().__init__(max_batch, max_seq_len)
        self.config = model.config
        # open_session's sessions: handle -> their caches and each row's cached ids
        self._sessions: dict[int, dict] = {}
        self._next_handle = 1

    @property
    def device(self) -> torch.device:
        """Where the model's weights live (inputs are moved there; outputs are returned there)."""
        return self.model.w["wte"].device

    # ------------------------------------------------------------------ checks
    def _check(self, ids: torch.Tensor, lengths: torch.Tensor, output_len: int) -> None:
        if ids.dim() != 2 or lengths.shape != (ids.shape[0],):
            raise RuntimeError(f"input_ids must be [B, S] and input_lengths [B], got "
                               f"{list(ids.shape)} and {list(lengths.shape)}")
        B, S = ids.shape
        if B > self._max_batch:
            raise RuntimeError(f"batch size {B} exceeds max_batch ({self._max_batch})")
        if output_len < 0:
            raise RuntimeError("output_len must be >= 0")
        if S + output_len > self._max_seq_len:
            raise RuntimeError(f"input length {S} + output_len {output_len} exceeds max_seq_len "
                               f"({self._max_seq_len})")

    # ------------------------------------------------------------------ logits
    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, input_lengths: torch.Tensor) -> torch.Tensor:
        """Logits fp32 ``[B, S, V]``, zero past each row's length, on :attr:`device`.

        ``input_ids``: integer ``[B, S]`` right padded (int32 in the engine's contract);
        ``input_lengths``: integer ``[B]`` valid lengths (any device).
        """
        self._check(input_ids, input_lengths, 0)
        ids = input_ids.to(self.device).long()
        lengths = input_lengths.to(self.device).long()
        self.model.memory_len = 0
        self.model.prompt_table = None
        logits = self.model.forward(ids, lengths)
        valid = torch.arange(ids.shape[1], device=ids.device)[None] < lengths[:, None]
        return logits * valid[:, :, None]

    def generate(self, input_ids: torch.Tensor, input_lengths: torch.Tensor, output_len: int,
                 end_id: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy decoding of ``output_len`` tokens (``end_id < 0``: the checkpoint's).

        ``input_ids``/``input_lengths`` as in :meth:`forward`. Returns ``(output_ids int32
        [B, 1, S + output_len], sequence_lengths int32 [B, 1])``.
        """
        opts = {} if end_id < 0 else {"end_id": torch.tensor(end_id, dtype=torch.int32)}
        out = self.decode(input_ids, input_lengths, output_len, opts)
        return out["output_ids"], out["sequence_lengths"]

    # ------------------------------------------------------------------ sessions
    def open_session(self, batch: int, max_len: int) -> int:
        """``batch`` rows whose KV caches (``max_len`` positions) are kept between decode calls
        with the option ``session`` (the returned handle); as ``GptModel.open_session``."""
        if self._state is not None:
            raise RuntimeError("GptModel.open_session: a generation session is running; call "
                               "decode_finish() first")
        if not 1 <= batch <= self._max_batch:
            raise RuntimeError(f"GptModel.open_session: batch must be in [1, max_batch = "
                               f"{self._max_batch}], got {batch}")
        if not 2 <= max_len <= self._max_seq_len:
            raise RuntimeError(f"GptModel.open_session: max_len must be in [2, max_seq_len = "
                               f"{self._max_seq_len}], got {max_len}")
        c, dev = self.config, self.device
        dt = self.model.w["wte"].dtype
        caches = [(torch.zeros(batch, max_len, c.kv_heads, c.size_per_head, dtype=dt, device=dev),
                   torch.zeros(batch, max_len, c.kv_heads, c.size_per_head, dtype=dt, device=dev))
                  for _ in range(c.num_layer)]
        handle, self._next_handle = self._next_handle, self._next_handle + 1
        self._sessions[handle] = dict(batch=batch, max_len=max_len, caches=caches,
                                      cached=[[] for _ in range(batch)], window=0)
        return handle

    def close_session(self, handle: int) -> None:
        """Frees a session's caches."""
        if handle not in self._sessions:
            raise RuntimeError(f"GptModel.close_session: no open session {handle}")
        if self._state is not None:  # as the engine, whose shared slots would move
            raise RuntimeError("GptModel.close_session: a generation session is running; call "
                               "decode_finish() first")
        del self._sessions[handle]

    def _session_prefixes(self, handle: int, ids: torch.Tensor, lengths: torch.Tensor,
                          beam: int, output_len: int, window: int) -> tuple[dict, list[int]]:
        op = "GptModel.decode"
        held = self._sessions.get(handle)
        if held is None:
            raise RuntimeError(f"{op}: option session = {handle} is not an open session of this "
                               "instance (open_session)")
        if beam != 1:
            raise RuntimeError(f"{op}: a session generates with beam_width 1, got {beam}")
        if ids.shape[0] != held["batch"]:
            raise RuntimeError(f"{op}: session {handle} has {held['batch']} rows; input_ids has "
                               f"{ids.shape[0]}")
        if ids.shape[1] + output_len > held["max_len"]:
            raise RuntimeError(f"{op}: session {handle}: input_ids' width {ids.shape[1]} + "
                               f"output_len {output_len} = {ids.shape[1] + output_len} exceeds "
                               f"the session's max_len ({held['max_len']})")
        past = []
        for b in range(ids.shape[0]):
            n = int(lengths[b])
            if n + output_len > held["max_len"]:
                raise RuntimeError(f"{op}: row {b} of session {handle}: input length {n} + "
                                   f"output_len {output_len} = {n + output_len} exceeds the "
                                   f"session's max_len ({held['max_len']})")
            # K/V computed under another attention window differ past the first layer.
            row = ids[b, :n].tolist()
            cached = held["cached"][b] if window == held["window"] else []
            k = 0
            while k < min(len(cached), n - 1) and cached[k] == row[k]:
                k += 1
            past.append(k)
        return held, past

    # ------------------------------------------------------------------ decoding
    @torch.no_grad()
    def decode_start(self, input_ids: torch.Tensor, input_lengths: torch.Tensor, output_len: int,
                     options: dict[str, torch.Tensor]) -> None:
        """Validate, run the prompt (prefill) and prepare the per-row state.

        Args:
            input_ids: integer ``[B, S]`` right padded (int32 in the engine's contract).
            input_lengths: integer ``[B]`` prompt lengths in ``[1, S]``.
            output_len: tokens to generate, >= 1.
            options: ``docs/GENERATION_API.md``'s option dict, checked by the C++ engine's own
                rules (``torch.ops.warpformer.generation_options``).
        """
        self._state = None
        if output_len < 1:
            raise RuntimeError("output_len must be >= 1")
        self._check(input_ids, input_lengths, output_len)
        dev = self.device
        ids = input_ids.to(dev).long()
        lengths = input_lengths.to(dev).long()
        B, S = ids.shape
        if bool((lengths < 1).any()) or bool((lengths > S).any()):
            raise RuntimeError(f"input_lengths must be in [1, {S}], got {lengths.tolist()}")
        o = _Options.parse(options, B, self.config.vocab_size, self.config.end_id)
        N, c = output_len, self.config
        self.model.memory_len = o.memory_len  # the prompt pass and the steps of this call
        if o.prompt_table is not None:
            if o.prompt_table.shape[1] != c.embedding_dim:
                raise RuntimeError(f"GptModel.decode: option 'prompt_table' rows must have the "
                                   f"word embedding width {c.embedding_dim}, got "
                                   f"{o.prompt_table.shape[1]}")
            self.model.prompt_table = o.prompt_table.to(dev)
        else:
            self.model.prompt_table = None
        total = S + N
        dt = self.model.w["wte"].dtype
        rows = torch.arange(B, device=dev)
        if o.session:
            # Each row runs only the tokens past the prefix its session row holds, through the
            # session's caches.
            held, past = self._session_prefixes(o.session, ids, lengths, o.beam_width, N,
                                                o.memory_len)
            caches = held["caches"]
            # Until the call finishes, the rows' caches hold unknown contents (as the engine's
            # slots after an error): nothing is reused.
            held["cached"] = [[] for _ in range(B)]
            last, last_hidden = [], []
            for b in range(B):
                n = int(lengths[b])
                pos = torch.arange(past[b], n, device=dev)[None]
                row_caches = [(k[b:b + 1], v[b:b + 1]) for k, v in caches]
                row_logits, row_hidden = self.model._run(ids[b:b + 1, past[b]:n], pos, row_caches,
                                                         hidden=True)
                last.append(row_logits[0, -1])
                last_hidden.append(row_hidden[0, -1])
            last, last_hidden = torch.stack(last), torch.stack(last_hidden)
            context = None  # return_context_embeddings is refused with a session
            logits = (self.model._run(ids, torch.arange(S, device=dev).expand(B, S))
                      if o.return_cum_log_probs == 2 else None)
        else:
            caches = [(torch.zeros(B, total, c.kv_heads, c.size_per_head, dtype=dt, device=dev),
                       torch.zeros(B, total, c.kv_heads, c.size_per_head, dtype=dt, device=dev))
                      for _ in range(c.num_layer)]
            pos = torch.arange(S, device=dev).expand(B, S)
            logits, final = self.model._run(ids, pos, caches, hidden=True)  # [B, S, V], [B, S, H]
            last, last_hidden = logits[rows, lengths - 1], final[rows, lengths - 1]
            context = None
            if o.return_context_embeddings:  # zeros past each row's length
                valid = torch.arange(S, device=dev)[None] < lengths[:, None]
                context = final.masked_fill(~valid[:, :, None], 0)
        ctx_lp = torch.zeros(B, device=dev)
        if o.return_cum_log_probs == 2 and S > 1:
            nxt = ids[:, 1:]
            lp = torch.log_softmax(logits[:, :-1], -1).gather(
                2, nxt.clamp(max=c.vocab_size - 1)[..., None])[..., 0]
            # a prompt-table position is not a token: it has no log prob
            valid = (torch.arange(1, S, device=dev)[None] < lengths[:, None]) & (nxt < c.vocab_size)
            ctx_lp = (lp * valid).sum(1)
        self._state = Decoding(_GptAdapter(self.model, caches, o.memory_len), o, ids, lengths, N,
                               last, last_hidden, vocab=c.vocab_size, ctx_lp=ctx_lp,
                               context=context)

    def decode_finish(self) -> dict[str, torch.Tensor]:
        st = self._state
        out = super().decode_finish()
        if st is not None and st.opts.session:
            # a row's caches hold its ids but the last (never fed back)
            held = self._sessions[st.opts.session]
            for b in range(out["output_ids"].shape[0]):
                n = int(out["sequence_lengths"][b, 0])
                held["cached"][b] = out["output_ids"][b, 0, :max(n - 1, 0)].tolist()
            held["window"] = st.opts.memory_len
        return out
