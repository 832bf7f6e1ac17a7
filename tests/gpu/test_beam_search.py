"""GPU tests of the beam-search kernels (kernels/sampling/beam_search.cu through the
torch.ops.warpformer.beam_* ops), driven step by step with log-probs from a random table against
the plain PyTorch twin tests/_beam_reference.py (itself checked against HF in
tests/test_beam_args.py). Both run the same fp32 operations in the same order, so everything is
compared exactly: tokens, parents, scores, the hypothesis store slot by slot, the running rows,
the cache indirection and the final outputs. The indirection is also checked on its own meaning:
reading a row through it gives back the row's sequence (tests/_beam_reference.TokenKvCache).
"""

from __future__ import annotations

import pytest
import torch

import warpformer  # noqa: F401
from tests import _beam_reference as ref
from tests.tolerances import DTYPES, TOLERANCES

pytestmark = pytest.mark.gpu
ops = torch.ops.warpformer

I32, F32 = torch.int32, torch.float32
STATE = ["output_ids", "cache_indir", "cum_log_probs", "cur_pos", "attn_len", "gen_len", "done",
         "hyp_count", "hyp_score", "hyp_cum", "hyp_len", "hyp_ids", "run_log_probs",
         "hyp_log_probs"]


class LogProbTable:
    """Log-probs of a row = a table row picked by (last token, position): deterministic, varied,
    peaked, with the end token likely in a third of the contexts and optionally banned tokens."""

    def __init__(self, vocab: int, end_id: int, seed: int, end_boost: float = 4.0,
                 banned: bool = False, n_ctx: int = 61):
        g = torch.Generator().manual_seed(seed)
        logits = torch.randn(n_ctx, vocab, generator=g) * 3.0
        logits[::3, end_id] += end_boost
        if banned:  # -inf entries (bad words, min_length) must never be chosen over real ones
            ban = torch.rand(n_ctx, vocab, generator=g) < 0.3
            ban[:, end_id] = False
            ban[:, 0] = False
            logits[ban] = float("-inf")
        self.table = torch.log_softmax(logits, dim=-1)
        self.n_ctx = n_ctx

    def __call__(self, st: ref.BeamState) -> torch.Tensor:
        rows = st.output_ids.shape[0]
        pos = st.cur_pos.long()
        last = st.output_ids[torch.arange(rows), pos].long()
        return self.table[(last * 7 + pos * 3) % self.n_ctx]


class Device:
    """The device state (the ops' tensors) with the reference's field names."""

    def __init__(self, ids, lengths, ends, beam, output_len, max_seq, shared_slot):
        self.lengths, self.ends = lengths.cuda(), ends.cuda()
        out = ops.beam_search_init(ids.cuda(), self.lengths, self.ends, beam, output_len, max_seq,
                                   shared_slot)
        self.t = dict(zip(STATE, out, strict=True))

    def step(self, log_probs, lp, div):
        t = self.t
        return ops.beam_search_step(
            log_probs.cuda(), self.lengths, self.ends, t["output_ids"], t["run_log_probs"],
            t["gen_len"], t["cum_log_probs"], t["done"], t["hyp_count"], t["hyp_score"],
            t["hyp_cum"], t["hyp_len"], t["hyp_ids"], t["hyp_log_probs"], lp, div)

    def update(self, parents, tokens, token_lp):
        t = self.t
        ops.beam_search_update(parents, tokens, token_lp, self.lengths, t["gen_len"],
                               t["output_ids"], t["cache_indir"], t["run_log_probs"],
                               t["cur_pos"], t["attn_len"])

    def finalize(self, lp, out_stride=-1):
        t = self.t
        out = ops.beam_search_finalize(
            self.lengths, self.ends, t["output_ids"], t["run_log_probs"], t["cum_log_probs"],
            t["gen_len"], t["done"], t["hyp_count"], t["hyp_score"], t["hyp_cum"], t["hyp_len"],
            t["hyp_ids"], t["hyp_log_probs"], lp, out_stride)
        return dict(zip(["output_ids", "sequence_lengths", "cum_log_probs", "scores",
                         "output_log_probs"], out, strict=True))


def assert_state_equal(dev: Device, st: ref.BeamState, where: str, names=STATE) -> None:
    for name in names:
        got, want = dev.t[name].cpu(), getattr(st, name)
        if name in ("cur_pos", "attn_len"):
            want = want.to(I32)
        assert torch.equal(got, want), \
            f"{where}: {name} differs\ndevice:\n{got}\nreference:\n{want}"


def run(batch_lengths, beam, vocab, *, lp=1.0, div=0.0, output_len=12, shared_first=False,
        shared_slot=False, banned=False, end_boost=4.0, seed=0):
    g = torch.Generator().manual_seed(seed + 1)
    B, S = len(batch_lengths), max(batch_lengths)
    ids = torch.randint(0, vocab, (B, S), generator=g, dtype=I32)
    lengths = torch.tensor(batch_lengths, dtype=I32)
    end = vocab - 1 if vocab > 7 else 3
    ends = torch.full((B,), end, dtype=I32)
    max_seq = S + output_len + 3  # indirection rows longer than the id rows
    table = LogProbTable(vocab, end, seed, end_boost=end_boost, banned=banned)

    st = ref.init_state(ids, lengths, ends, beam, output_len, max_seq, shared_slot)
    dev = Device(ids, lengths, ends, beam, output_len, max_seq, shared_slot)
    assert_state_equal(dev, st, "init")
    kv = ref.TokenKvCache(st, ids, shared_slot)
    for step in range(output_len):
        log_probs = table(st)
        if step == 0 and shared_first:
            log_probs = log_probs[::beam].contiguous()  # one row per entry (all rows equal)
        want = ref.step(st, log_probs, lp, div)
        got = dev.step(log_probs, lp, div)
        for name, a, b in zip(["parents", "tokens", "token_log_probs"], got, want,
                               strict=True):
            assert torch.equal(a.cpu(), b), f"step {step}: {name}\n{a.cpu()}\n{b}"
        assert_state_equal(dev, st, f"step {step}")
        ref.update(st)
        dev.update(*got)
        assert_state_equal(dev, st, f"update {step}")
        kv.write_and_check(dev.t["output_ids"], dev.t["cache_indir"], dev.t["cur_pos"],
                           dev.t["attn_len"])
    want = ref.finalize(st, lp)
    got = dev.finalize(lp)
    for name in want:
        assert torch.equal(got[name].cpu(), want[name]), f"finalize: {name}"
    return st, got


@pytest.mark.parametrize("vocab", [7, 50257])
@pytest.mark.parametrize("beam", [1, 2, 4, 16])
@pytest.mark.parametrize("div", [0.0, 0.5])
def test_beam_search_matches_reference(beam: int, vocab: int, div: float) -> None:
    # ragged prompts (one of length 1); the first step alternates between one log-prob row per
    # entry and W identical rows, and the prompt's KV slot between shared and per beam.
    run([5, 1, 9], beam, vocab, div=div, shared_first=beam % 4 == 0, shared_slot=div > 0,
        seed=beam + vocab)


@pytest.mark.parametrize("lp", [0.7, 0.0, 2.0, -0.5])
def test_length_penalties(lp: float) -> None:
    run([4, 6], 4, 50257, lp=lp, seed=11)


def test_banned_tokens_and_large_vocab() -> None:
    run([3, 8], 4, 50257, banned=True, seed=5)
    run([2], 16, 250880, output_len=4, banned=True, seed=6)


def test_done_entries() -> None:
    """A very likely end token fills the stores early: the early-stop rule fires, done entries
    repeat end_id with parent = own beam, and the results still equal the reference's."""
    st, out = run([5, 3, 7], 4, 50257, end_boost=12.0, output_len=16, seed=3)
    assert st.done.any(), "the early-stop rule never fired; raise end_boost"
    assert (out["sequence_lengths"] < torch.tensor([5, 3, 7]).cuda()[:, None] + 16).any()


def test_output_stride_and_log_probs() -> None:
    st, out = run([4, 2], 2, 1000, output_len=6, seed=9)
    # per-token log probs sum to the cum log prob (no diversity)
    gen = (out["sequence_lengths"] - torch.tensor([4, 2]).cuda()[:, None]).cpu()
    lps, cum = out["output_log_probs"].cpu(), out["cum_log_probs"].cpu()
    for b in range(2):
        for k in range(2):
            torch.testing.assert_close(lps[b, k, :gen[b, k]].sum(), cum[b, k], rtol=1e-5,
                                       atol=1e-5)
            assert (lps[b, k, gen[b, k]:] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [7, 50257, 250880])
def test_log_softmax(dtype: torch.dtype, vocab: int) -> None:
    x = (torch.randn(5, vocab, device="cuda") * 4).to(dtype)
    x[1, ::3] = float("-inf")
    out = ops.beam_log_softmax(x)
    assert out.dtype == F32
    want = torch.log_softmax(x.float(), dim=-1)
    tol = TOLERANCES[F32]
    finite = torch.isfinite(want)
    torch.testing.assert_close(out[finite], want[finite], atol=tol["atol"] * 10, rtol=tol["rtol"])
    assert (out[~finite] == float("-inf")).all()
