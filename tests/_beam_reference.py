"""Plain PyTorch twin of the beam-search kernels (kernels/sampling/beam_search.{h,cu}).

The state has the device state's layout, field for field, and every step does the same fp32
operations in the same order, so the GPU tests compare the kernels with it exactly (tokens,
parents, scores, hypothesis slots, cache indirection). `beam_generate` drives it with any
log-prob function; the CPU tests drive it with a HF model and compare with HF transformers'
`generate(num_beams=...)`, which is what pins the semantics to HF 5.x.

Algorithm per step (W beams, K = 2W candidates), see beam_search.h for the full statement:
  1. s = cum[b, k] + log_probs[row]; per row the top K by (s desc, token asc); candidate score
     = s - diversity_rate * rank-in-row; the entry's top K by (score desc, k * V + token asc).
  2. running beams: top W by (score + (token == end ? -1e9 : 0)) desc, rank asc.
  3. candidates of rank < W whose token is the end become hypotheses, score / n ** lp (n = new
     generated length); the store keeps the best W (free slot, else replace the lowest slot —
     highest index on ties — when strictly better).
  4. done (sticky) when the store is full and not (best running / n ** lp > lowest hypothesis).
  finalize: entries not done add their running beams (score cum / n ** lp), W best first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

IMPOSSIBLE = np.float32(-1.0e9)
F32 = torch.float32
I32 = torch.int32


@dataclass
class BeamState:
    """CPU mirror of kernels::BeamSearchState (rows = batch * beam, row = b * beam + k)."""

    beam: int
    input_lengths: torch.Tensor  # int32 [B]
    end_ids: torch.Tensor        # int32 [B]
    output_ids: torch.Tensor     # int32 [rows, ids_stride]
    cache_indir: torch.Tensor    # int32 [rows, indir_stride]
    cum_log_probs: torch.Tensor  # fp32 [B, W]
    cur_pos: torch.Tensor        # int32 [rows]
    attn_len: torch.Tensor       # int32 [rows]
    gen_len: torch.Tensor        # int32 [B]
    done: torch.Tensor           # int32 [B]
    hyp_count: torch.Tensor      # int32 [B]
    hyp_score: torch.Tensor      # fp32 [B, W]
    hyp_cum: torch.Tensor        # fp32 [B, W]
    hyp_len: torch.Tensor        # int32 [B, W]
    hyp_ids: torch.Tensor        # int32 [B, W, ids_stride]
    run_log_probs: torch.Tensor  # fp32 [rows, max_out]
    hyp_log_probs: torch.Tensor  # fp32 [B, W, max_out]
    parents: torch.Tensor        # int32 [B, W]
    tokens: torch.Tensor         # int32 [B, W]
    token_log_probs: torch.Tensor  # fp32 [B, W]

    @property
    def batch(self) -> int:
        return int(self.input_lengths.shape[0])


def init_state(input_ids: torch.Tensor, input_lengths: torch.Tensor, end_ids: torch.Tensor,
               beam: int, output_len: int, max_seq: int,
               shared_prompt_slot: bool = False) -> BeamState:
    """input_ids int32 [B, S] (row b valid up to input_lengths[b]); ids_stride = S + output_len,
    indir_stride = max_seq, log-prob buffers of output_len columns."""
    batch, seq = input_ids.shape
    rows, stride = batch * beam, seq + output_len
    lengths = input_lengths.to(I32).cpu()
    ends = end_ids.to(I32).cpu()
    ids = input_ids.to(I32).cpu()
    out = torch.empty(rows, stride, dtype=I32)
    indir = torch.empty(rows, max_seq, dtype=I32)
    for r in range(rows):
        b, n = r // beam, int(lengths[r // beam])
        out[r] = ends[b]
        out[r, :n] = ids[b, :n]
        indir[r] = r
        indir[r, :n] = b * beam if shared_prompt_slot else r
    cum = torch.full((batch, beam), float(IMPOSSIBLE), dtype=F32)
    cum[:, 0] = 0.0
    rep = lengths.repeat_interleave(beam)
    return BeamState(
        beam=beam, input_lengths=lengths, end_ids=ends, output_ids=out, cache_indir=indir,
        cum_log_probs=cum, cur_pos=rep - 1, attn_len=rep.clone(),
        gen_len=torch.zeros(batch, dtype=I32), done=torch.zeros(batch, dtype=I32),
        hyp_count=torch.zeros(batch, dtype=I32), hyp_score=torch.zeros(batch, beam, dtype=F32),
        hyp_cum=torch.zeros(batch, beam, dtype=F32), hyp_len=torch.zeros(batch, beam, dtype=I32),
        hyp_ids=torch.zeros(batch, beam, stride, dtype=I32),
        run_log_probs=torch.zeros(rows, output_len, dtype=F32),
        hyp_log_probs=torch.zeros(batch, beam, output_len, dtype=F32),
        parents=torch.arange(beam, dtype=I32).repeat(batch, 1),
        tokens=torch.zeros(batch, beam, dtype=I32),
        token_log_probs=torch.zeros(batch, beam, dtype=F32))


def _denominator(n: int, length_penalty: float) -> np.float32:
    # HF: `(cur_len + 1 - prompt_len) ** length_penalty`, a Python float, rounded to fp32 by the
    # fp32 tensor op it meets.
    return np.float32(float(n) ** float(length_penalty))


def _insert(scores: list, count: int, score: np.float32, beam: int) -> tuple[int, int]:
    """Slot for a new hypothesis (or -1) and the new count: a free slot, else the lowest slot
    (highest index on ties) when strictly worse."""
    if count < beam:
        return count, count + 1
    worst = 0
    for j in range(1, beam):
        if scores[j] <= scores[worst]:
            worst = j
    return (worst if score > scores[worst] else -1), count


def step(st: BeamState, log_probs: torch.Tensor, length_penalty: float = 1.0,
         diversity_rate: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step. log_probs fp32 [rows, V] or [B, V] (one row per entry). Mutates the state
    like launch_beam_step; returns (parents, tokens, token_log_probs), each [B, W]."""
    W, B = st.beam, st.batch
    lp_all = log_probs.detach().to("cpu", F32)
    shared = lp_all.shape[0] == B and W > 1
    V = lp_all.shape[1]
    K = 2 * W
    div = torch.tensor(diversity_rate, dtype=F32)
    for b in range(B):
        if st.done[b]:
            st.parents[b] = torch.arange(W, dtype=I32)
            st.tokens[b] = st.end_ids[b]
            st.token_log_probs[b] = 0.0
            continue

        def row_lp(k: int, b: int = b) -> torch.Tensor:
            return lp_all[b] if shared else lp_all[b * W + k]

        rows = lp_all[b].expand(W, V) if shared else lp_all[b * W:(b + 1) * W]
        s = st.cum_log_probs[b][:, None] + rows  # fp32 add, [W, V]
        s = s.masked_fill(torch.isnan(s), float("-inf"))
        n_real = min(K, V)
        # Per row, the top n_real by (s desc, token asc): everything above the n_real-th value
        # (sorted stably), then the tokens equal to it in index order.
        thr = torch.topk(s, n_real, dim=1).values[:, -1:]
        above, equal = (s > thr).nonzero(), (s == thr).nonzero()
        pen = div * torch.arange(n_real, dtype=F32)  # fp32 multiply
        cands = []  # (score, flat)
        for k in range(W):
            a = above[above[:, 0] == k, 1]
            a = a[torch.sort(s[k, a], descending=True, stable=True).indices]
            idx = torch.cat([a, equal[equal[:, 0] == k, 1]])[:n_real]
            adj = s[k, idx] - pen                            # fp32 subtract
            cands += [(float(adj[j]), k * V + int(idx[j])) for j in range(n_real)]
        cands.sort(key=lambda c: (-c[0], c[1]))
        top = cands[:K]
        end = int(st.end_ids[b])
        hit = [flat % V == end for _, flat in top]
        pen_scores = [np.float32(v) + IMPOSSIBLE if h else np.float32(v)
                      for (v, _), h in zip(top, hit, strict=True)]
        order = sorted(range(K), key=lambda c: (-float(pen_scores[c]), c))
        run_src = order[:W]

        g, n_prompt = int(st.gen_len[b]), int(st.input_lengths[b])
        pos = n_prompt + g
        denom = _denominator(g + 1, length_penalty)
        scores = [np.float32(x) for x in st.hyp_score[b].tolist()]
        count = int(st.hyp_count[b])
        slot_src = [-1] * W
        for c in range(W):
            if not hit[c]:
                continue
            score = np.float32(top[c][0]) / denom
            slot, count = _insert(scores, count, score, W)
            if slot < 0:
                continue
            scores[slot] = score
            st.hyp_cum[b, slot] = float(top[c][0])
            st.hyp_len[b, slot] = pos + 1
            slot_src[slot] = c
        st.hyp_score[b] = torch.tensor([float(x) for x in scores], dtype=F32)
        st.hyp_count[b] = count
        if count == W:
            lowest = min(scores)
            best = pen_scores[run_src[0]] / denom
            if not best > lowest:
                st.done[b] = 1
        # sequences of the new hypotheses (from the running rows before the reorder)
        for slot, c in enumerate(slot_src):
            if c < 0:
                continue
            parent, tok = divmod(top[c][1], V)
            prow = b * W + parent
            st.hyp_ids[b, slot, :pos] = st.output_ids[prow, :pos]
            st.hyp_ids[b, slot, pos] = tok
            st.hyp_log_probs[b, slot, :g] = st.run_log_probs[prow, :g]
            st.hyp_log_probs[b, slot, g] = row_lp(parent)[tok]
        for j, c in enumerate(run_src):
            parent, tok = divmod(top[c][1], V)
            st.parents[b, j] = parent
            st.tokens[b, j] = tok
            st.cum_log_probs[b, j] = float(pen_scores[c])
            st.token_log_probs[b, j] = row_lp(parent)[tok]
    return st.parents.clone(), st.tokens.clone(), st.token_log_probs.clone()


def update(st: BeamState) -> None:
    """launch_beam_update: reorder the running rows by parent, append the new tokens."""
    W = st.beam
    for b in range(st.batch):
        n_prompt, g = int(st.input_lengths[b]), int(st.gen_len[b])
        pos = n_prompt + g
        rows = slice(b * W, (b + 1) * W)
        par = st.parents[b].long()
        ids, indir, lps = st.output_ids[rows].clone(), st.cache_indir[rows].clone(), \
            st.run_log_probs[rows].clone()
        st.output_ids[rows, n_prompt:pos] = ids[par, n_prompt:pos]
        st.cache_indir[rows, n_prompt:pos] = indir[par, n_prompt:pos]
        st.run_log_probs[rows, :g] = lps[par, :g]
        for k in range(W):
            r = b * W + k
            st.output_ids[r, pos] = st.tokens[b, k]
            st.cache_indir[r, pos] = r
            st.run_log_probs[r, g] = st.token_log_probs[b, k]
            st.cur_pos[r] = pos
            st.attn_len[r] = pos + 1
        st.gen_len[b] = g + 1


def finalize(st: BeamState, length_penalty: float = 1.0,
             out_stride: int | None = None) -> dict[str, torch.Tensor]:
    """launch_beam_finalize: the W best hypotheses per entry, best first."""
    W, B = st.beam, st.batch
    stride = st.output_ids.shape[1] if out_stride is None else out_stride
    max_out = st.run_log_probs.shape[1]
    out = {
        "output_ids": torch.zeros(B, W, stride, dtype=I32),
        "sequence_lengths": torch.zeros(B, W, dtype=I32),
        "cum_log_probs": torch.zeros(B, W, dtype=F32),
        "scores": torch.zeros(B, W, dtype=F32),
        "output_log_probs": torch.zeros(B, W, max_out, dtype=F32),
    }
    for b in range(B):
        n_prompt, g, end = int(st.input_lengths[b]), int(st.gen_len[b]), int(st.end_ids[b])
        count = int(st.hyp_count[b])
        ent = [[np.float32(float(st.hyp_score[b, j])), float(st.hyp_cum[b, j]),
                int(st.hyp_len[b, j]), st.hyp_ids[b, j], st.hyp_log_probs[b, j]]
               for j in range(count)]
        ent += [None] * (W - count)
        if not st.done[b]:
            denom = _denominator(g, length_penalty) if g > 0 else np.float32(1.0)
            scores = [e[0] if e is not None else None for e in ent]
            for k in range(W):
                cum = np.float32(float(st.cum_log_probs[b, k]))
                score = cum / denom
                slot, count = _insert(scores, count, score, W)
                if slot < 0:
                    continue
                scores[slot] = score
                r = b * W + k
                ent[slot] = [score, float(cum), n_prompt + g, st.output_ids[r],
                             st.run_log_probs[r]]
        ent = ent[:count]
        order = sorted(range(count), key=lambda j: (-float(ent[j][0]), j))
        for i in range(W):
            if i >= count:
                out["output_ids"][b, i] = end
                out["cum_log_probs"][b, i] = float("-inf")
                out["scores"][b, i] = float("-inf")
                continue
            score, cum, total, ids, lps = ent[order[i]]
            n = min(total, ids.shape[0], stride)
            out["output_ids"][b, i] = end
            out["output_ids"][b, i, :n] = ids[:n]
            out["sequence_lengths"][b, i] = total
            out["cum_log_probs"][b, i] = cum
            out["scores"][b, i] = float(score)
            gen = total - n_prompt
            out["output_log_probs"][b, i, :gen] = lps[:gen]
    return out


def beam_generate(log_prob_fn: Callable[[list[list[int]]], torch.Tensor],
                  prompts: Sequence[Sequence[int]], beam: int, output_len: int,
                  end_id: int, length_penalty: float = 1.0, diversity_rate: float = 0.0,
                  stop_when_done: bool = True) -> dict[str, torch.Tensor]:
    """Beam search over `log_prob_fn(sequences) -> fp32 log-probs [len(sequences), V]`.

    prompts: B token lists (ragged). Returns finalize()'s dict ([B, W, ...]).
    """
    B = len(prompts)
    seq = max(len(p) for p in prompts)
    ids = torch.zeros(B, seq, dtype=I32)
    for b, p in enumerate(prompts):
        ids[b, :len(p)] = torch.tensor(list(p), dtype=I32)
    lengths = torch.tensor([len(p) for p in prompts], dtype=I32)
    ends = torch.full((B,), end_id, dtype=I32)
    st = init_state(ids, lengths, ends, beam, output_len, seq + output_len)
    for _ in range(output_len):
        if stop_when_done and bool(st.done.all()):
            break
        rows = [st.output_ids[r, :int(st.cur_pos[r]) + 1].tolist() for r in range(B * beam)]
        step(st, log_prob_fn(rows), length_penalty, diversity_rate)
        update(st)
    return finalize(st, length_penalty)


class TokenKvCache:
    """A KV cache that stores token ids instead of K/V: slot s, position p holds the token whose
    K/V a decode step writes there (row r writes slot r at cur_pos[r]). `write_and_check` after
    each update: reading row r through cache_indir must give back row r's own sequence at every
    attended position — the property the decode attention relies on."""

    def __init__(self, st: BeamState, input_ids: torch.Tensor, shared_prompt_slot: bool):
        rows, seq = st.output_ids.shape[0], st.cache_indir.shape[1]
        self.cache = torch.full((rows, seq), -1, dtype=I32)
        ids = input_ids.to("cpu", I32)
        for r in range(rows):
            if shared_prompt_slot and r % st.beam:
                continue  # the prompt was prefilled into slot b * beam only
            b = r // st.beam
            n = int(st.input_lengths[b])
            self.cache[r, :n] = ids[b, :n]

    def write_and_check(self, output_ids: torch.Tensor, cache_indir: torch.Tensor,
                        cur_pos: torch.Tensor, attn_len: torch.Tensor) -> None:
        output_ids, cache_indir = output_ids.cpu(), cache_indir.cpu()
        cur_pos, attn_len = cur_pos.cpu(), attn_len.cpu()
        rows = self.cache.shape[0]
        for r in range(rows):
            p = int(cur_pos[r])
            self.cache[r, p] = output_ids[r, p]
        for r in range(rows):
            n = int(attn_len[r])
            got = self.cache[cache_indir[r, :n].long(), torch.arange(n)]
            assert torch.equal(got, output_ids[r, :n]), f"row {r}: {got} != {output_ids[r, :n]}"


def hf_log_prob_fn(model) -> Callable[[list[list[int]]], torch.Tensor]:
    """Log-probs of a HF causal LM at the end of each sequence (full recompute, fp32; sequences
    of equal length are run together)."""

    @torch.no_grad()
    def fn(seqs: list[list[int]]) -> torch.Tensor:
        out = [None] * len(seqs)
        by_len: dict[int, list[int]] = {}
        for i, s in enumerate(seqs):
            by_len.setdefault(len(s), []).append(i)
        for idx in by_len.values():
            x = torch.tensor([seqs[i] for i in idx], dtype=torch.long)
            logits = model(input_ids=x).logits[:, -1, :].float()
            lp = torch.log_softmax(logits, dim=-1)
            for j, i in enumerate(idx):
                out[i] = lp[j]
        return torch.stack(out)

    return fn
