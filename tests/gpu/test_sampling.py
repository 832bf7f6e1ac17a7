"""GPU tests of the sampling kernels (kernels/sampling): token counts, the logits processor against
a plain PyTorch reference (each option alone and combined, three logits dtypes, odd and padded
vocabularies), the sampler (greedy == torch.argmax with ties; top-k / top-p / temperature
distributions by chi-square over 20,000 draws; the tie rule; reproducibility, seed sensitivity,
batch independence; log-probs; BLOOM's 250,880-token vocabulary) and the generation-state update
(end ids, stop words across the prompt boundary, output limit, log-probs, finished rows); the
engine's greedy-step kernel (warpformer.greedy_tokens) against torch.argmax; batches of more rows
than a grid's y dimension takes (65,535)."""

from __future__ import annotations

import math

import pytest
import torch

import warpformer  # noqa: F401
from tests.tolerances import DTYPES, TOLERANCES

pytestmark = pytest.mark.gpu
ops = torch.ops.warpformer
DEV = "cuda"
I32, I64, F32 = torch.int32, torch.int64, torch.float32
NEG_INF = float("-inf")
DRAWS = 20_000
MANY_ROWS = 70_000  # more than a grid's y dimension takes (65,535)


def i32(v) -> torch.Tensor:
    return torch.tensor(v, dtype=I32, device=DEV)


def f32(v) -> torch.Tensor:
    return torch.tensor(v, dtype=F32, device=DEV)


def ft_words(entries_per_row: list[list[list[int]]], length: int | None = None) -> torch.Tensor:
    """FT word lists: rows x entries x tokens -> int32 [rows, 2, L] (ids 0-padded, offsets -1)."""
    flats = [[t for e in entries for t in e] for entries in entries_per_row]
    L = length or max(1, max(len(f) for f in flats))
    out = torch.full((len(entries_per_row), 2, L), -1, dtype=I32)
    out[:, 0] = 0
    for r, entries in enumerate(entries_per_row):
        out[r, 0, : len(flats[r])] = torch.tensor(flats[r], dtype=I32)
        end = 0
        for i, e in enumerate(entries):
            end += len(e)
            out[r, 1, i] = end
    return out.to(DEV)


# ---- references ----------------------------------------------------------------------------------
def ref_counts(ids: torch.Tensor, lengths: list[int], vocab: int) -> torch.Tensor:
    out = torch.zeros(ids.shape[0], vocab, dtype=torch.int64)
    for r, n in enumerate(lengths):
        row = ids[r, :n].long().cpu()
        row = row[(row >= 0) & (row < vocab)]
        out[r] = torch.bincount(row, minlength=vocab)
    return out


def ref_process(logits, vocab, *, counts=None, rep=None, pres=None, freq=None, temp=None,
                min_length=None, end_ids=None, generated=None, bad_words=None, seqs=None):
    """float32 reference. Per-row options are lists (None: off); bad_words is, per row, a list of
    token lists and seqs, per row, the sequence so far."""
    x = logits[:, :vocab].float().clone()
    for r in range(x.shape[0]):
        xr = x[r].clone()
        if counts is not None:
            c = counts[r].to(x.device)
            seen = c > 0
            if rep is not None:
                xr = torch.where(seen, torch.where(xr < 0, xr * rep[r], xr / rep[r]), xr)
            if freq is not None:
                xr = torch.where(seen, xr - freq[r] * c.float(), xr)
            if pres is not None:
                xr = torch.where(seen, xr - pres[r], xr)
        if min_length is not None and generated[r] < min_length[r]:
            xr[end_ids[r]] = NEG_INF
        if bad_words is not None:
            seq = seqs[r]
            for w in bad_words[r]:
                n = len(w) - 1
                if n == 0 or (len(seq) >= n and seq[len(seq) - n:] == w[:-1]):
                    xr[w[-1]] = NEG_INF
        if temp is not None:
            xr = xr / temp[r]
        x[r] = xr
    return x


def assert_processed(out, expected):
    tol = TOLERANCES[torch.float32]
    assert out.dtype == F32 and out.shape == expected.shape
    assert torch.equal(torch.isneginf(out), torch.isneginf(expected)), "banned tokens differ"
    torch.testing.assert_close(out, expected, atol=tol["atol"] * 10, rtol=tol["rtol"] * 10)


def ref_filtered_probs(row: torch.Tensor, k: int, p: float) -> torch.Tensor:
    """The distribution the sampler draws from: softmax, top-k (k best by a stable descending
    sort: lowest index first among equal logits), then top-p renormalised within that set
    (keep a token iff the mass ranked above it is < p)."""
    x = row.double().cpu()
    probs = torch.softmax(x, 0)
    order = torch.sort(x, descending=True, stable=True).indices
    finite = int(torch.isfinite(x).sum())
    keep = order[: finite if k == 0 else min(k, finite)]
    if p < 1.0:
        kp = probs[keep]
        above = torch.cumsum(kp, 0) - kp
        keep = keep[: max(1, int((above < p * kp.sum()).sum()))]
    out = torch.zeros_like(probs)
    out[keep] = probs[keep]
    return out / out.sum()


def chi2_sf(stat: float, dof: int) -> float:
    """P(X >= stat) for X ~ chi-square(dof): scipy when present, else the regularised upper
    incomplete gamma Q(dof/2, stat/2) by its series / continued fraction."""
    try:
        from scipy.stats import chi2
        return float(chi2.sf(stat, dof))
    except ImportError:
        pass
    a, x = dof / 2.0, stat / 2.0
    if x <= 0:
        return 1.0
    lg = math.lgamma(a)
    if x < a + 1:  # series for P(a, x)
        term = total = 1.0 / a
        ap = a
        for _ in range(10_000):
            ap += 1
            term *= x / ap
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(-x + a * math.log(x) - lg))
    b = x + 1 - a  # Lentz's continued fraction for Q(a, x)
    c, d = 1e300, 1.0 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1e-300 if abs(d) < 1e-300 else d
        c = b + an / c
        c = 1e-300 if abs(c) < 1e-300 else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return math.exp(-x + a * math.log(x) - lg) * h


def check_distribution(tokens: torch.Tensor, probs: torch.Tensor, what: str) -> None:
    """Chi-square goodness of fit of the drawn tokens to `probs`, with bins of expected count
    >= 10 (tokens taken in order of decreasing probability); tokens of probability 0 must never
    appear."""
    draws = tokens.numel()
    counts = torch.bincount(tokens.long().cpu(), minlength=probs.numel()).double()
    outside = counts[probs == 0].sum().item()
    assert outside == 0, f"{what}: {int(outside)} draws fell outside the filtered set"
    order = torch.argsort(probs, descending=True)
    expected = (probs[order] * draws).tolist()
    observed = counts[order].tolist()
    bins_e, bins_o = [], []
    acc_e = acc_o = 0.0
    for e, o in zip(expected, observed, strict=True):
        if e == 0:
            break
        acc_e += e
        acc_o += o
        if acc_e >= 10:
            bins_e.append(acc_e)
            bins_o.append(acc_o)
            acc_e = acc_o = 0.0
    if acc_e > 0:
        if bins_e:
            bins_e[-1] += acc_e
            bins_o[-1] += acc_o
        else:
            bins_e.append(acc_e)
            bins_o.append(acc_o)
    dof = len(bins_e) - 1
    if dof == 0:
        return
    stat = sum((o - e) ** 2 / e for o, e in zip(bins_o, bins_e, strict=True))
    pval = chi2_sf(stat, dof)
    assert pval > 1e-4, f"{what}: chi-square {stat:.1f} with {dof} dof, p = {pval:.2e}"


def draw_many(row: torch.Tensor, k: int, p: float, *, vary: str = "position", seed: int = 1234):
    """DRAWS samples from one logits row (broadcast with stride 0), varying the RNG counter or
    the seed per draw."""
    logits = row.float().view(1, -1).expand(DRAWS, -1)
    ar = torch.arange(DRAWS, device=DEV)
    if vary == "position":
        seeds, pos = torch.tensor(seed, dtype=I64, device=DEV), ar.to(I32)
    else:
        seeds, pos = (ar * 7919 + seed).to(I64), i32(17)
    tokens, _ = ops.sample_tokens(logits, i32(k), f32(p), seeds, pos)
    return tokens


# ---- token counts --------------------------------------------------------------------------------
@pytest.mark.parametrize("vocab", [1, 7, 50257])
def test_count_tokens(vocab, seed):
    rows, S = 5, 40
    ids = torch.randint(0, min(vocab, 30), (rows, S), device=DEV, dtype=I32)
    ids[1, 5] = -1  # ignored (outside the vocabulary) ...
    ids[2, 7] = vocab  # ... as is this
    lengths = [40, 12, 9, 1, 0]
    counts = ops.count_tokens(ids, i32(lengths), vocab)
    assert torch.equal(counts.cpu().long(), ref_counts(ids, lengths, vocab))
    before = counts.clone()
    tokens = torch.randint(0, vocab, (rows,), device=DEV, dtype=I32)
    ops.add_token_counts(counts, tokens, i32([0, 1, 0, 0, 1]))
    expected = before.clone()
    for r in (0, 2, 3):
        expected[r, tokens[r]] += 1
    assert torch.equal(counts, expected)
    ops.add_token_counts(counts, tokens, None)
    for r in range(rows):
        expected[r, tokens[r]] += 1
    assert torch.equal(counts, expected)


# ---- logits processor ----------------------------------------------------------------------------
ROWS = 5
REP = [1.0, 1.3, 0.7, 2.0, 1.1]
PRES = [0.0, 0.5, -0.3, 1.0, 2.0]
FREQ = [0.0, 0.1, 0.4, -0.2, 1.5]
TEMP = [1.0, 0.5, 2.0, 0.7, 1.3]
MIN_LEN = [0, 5, 1, 3, 100]


def processor_case(vocab: int, dtype: torch.dtype, pad: int = 0):
    """Logits (rows x (vocab + pad)), prompts from a small id range (so tokens repeat), a few
    generated tokens per row, and the matching counts."""
    S, gen = 24, [0, 2, 5, 1, 3]
    lengths = [24, 9, 3, 17, 1]
    stride = S + 8
    ids = torch.randint(0, min(vocab, 20), (ROWS, stride), device=DEV, dtype=I32)
    cur_pos = [lengths[r] - 1 + gen[r] for r in range(ROWS)]
    logits = (torch.randn(ROWS, vocab + pad, device=DEV) * 3).to(dtype)
    if pad:
        logits[:, vocab:] = 1e4  # padding must be ignored
    counts = ops.count_tokens(ids, i32([c + 1 for c in cur_pos]), vocab)
    seqs = [ids[r, : cur_pos[r] + 1].tolist() for r in range(ROWS)]
    return dict(logits=logits, ids=ids, lengths=lengths, cur_pos=cur_pos, counts=counts,
                seqs=seqs, generated=gen)


def bad_word_lists(case, vocab):
    """Per row: a single token, a pair ending the row's sequence (matches), a triple matching
    the end of row 1's sequence (matches in row 1 only), a pair that does not match."""
    seqs = case["seqs"]
    v = lambda t: t % vocab  # noqa: E731
    lists = []
    for r in range(ROWS):
        entries = [[v(3 + r)], [seqs[r][-1], v(5 + r)]]
        entries.append(seqs[1][-2:] + [v(11)] if len(seqs[1]) >= 2 else [v(11)])
        entries.append([v(seqs[r][-1] + 1) if vocab > 1 else 0, v(13)])
        lists.append(entries)
    return lists


OPTIONS = ["repetition", "presence", "frequency", "temperature", "min_length", "min_length_step",
           "bad_words_shared", "bad_words_per_row", "all"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [1, 7, 1000, 50257])
@pytest.mark.parametrize("option", OPTIONS)
def test_process_logits(dtype, vocab, option, seed):
    case = processor_case(vocab, dtype)
    kw, ref = {}, {}
    allopts = option == "all"
    if option == "repetition" or allopts:
        kw.update(token_counts=case["counts"], repetition_penalty=f32(REP))
        ref.update(counts=case["counts"], rep=REP)
    if option == "presence" or allopts:
        kw.update(token_counts=case["counts"], presence_penalty=f32(PRES))
        ref.update(counts=case["counts"], pres=PRES)
    if option == "frequency" or allopts:
        kw.update(token_counts=case["counts"], frequency_penalty=f32(FREQ))
        ref.update(counts=case["counts"], freq=FREQ)
    if option == "temperature" or allopts:
        kw.update(temperature=f32(TEMP))
        ref.update(temp=TEMP)
    end_ids = [0, 1 % vocab, vocab - 1, 3 % vocab, 2 % vocab]
    if option == "min_length" or allopts:
        kw.update(min_length=i32(MIN_LEN), end_ids=i32(end_ids), input_lengths=i32(case["lengths"]),
                  cur_pos=i32(case["cur_pos"]))
        ref.update(min_length=MIN_LEN, end_ids=end_ids, generated=case["generated"])
    if option == "min_length_step":  # generated = step for every row
        kw.update(min_length=i32(MIN_LEN), end_ids=i32(end_ids), step=3)
        ref.update(min_length=MIN_LEN, end_ids=end_ids, generated=[3] * ROWS)
    if option in ("bad_words_shared", "bad_words_per_row") or allopts:
        lists = bad_word_lists(case, vocab)
        if option == "bad_words_shared":
            lists = [lists[0]] * ROWS
            words = ft_words(lists[:1], length=16)[0]  # [2, L]
        else:
            words = ft_words(lists, length=16)  # [rows, 2, L]
        kw.update(bad_words=words, output_ids=case["ids"], cur_pos=i32(case["cur_pos"]))
        ref.update(bad_words=lists, seqs=case["seqs"])
    out = ops.process_logits(case["logits"], **kw)
    assert_processed(out, ref_process(case["logits"], vocab, **ref))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [7, 50257])
def test_process_logits_padded_rows(dtype, vocab, seed):
    """Row stride > vocab: through `vocab=` on the padded tensor and through a sliced view."""
    case = processor_case(vocab, dtype, pad=13)
    lists = bad_word_lists(case, vocab)
    kw = dict(token_counts=case["counts"], repetition_penalty=f32(REP), presence_penalty=f32(PRES),
              frequency_penalty=f32(FREQ), temperature=f32(TEMP), bad_words=ft_words(lists),
              output_ids=case["ids"], cur_pos=i32(case["cur_pos"]))
    expected = ref_process(case["logits"], vocab, counts=case["counts"], rep=REP, pres=PRES,
                           freq=FREQ, temp=TEMP, bad_words=lists, seqs=case["seqs"])
    assert_processed(ops.process_logits(case["logits"], vocab=vocab, **kw), expected)
    view = case["logits"][:, :vocab]
    assert view.stride(0) == vocab + 13
    assert_processed(ops.process_logits(view, **kw), expected)


def test_process_logits_broadcast_options(seed):
    """0-d options apply to every row; the penalties change only seen tokens."""
    case = processor_case(1000, torch.float32)
    out = ops.process_logits(case["logits"], token_counts=case["counts"],
                             repetition_penalty=f32(1.5), temperature=f32(0.8))
    expected = ref_process(case["logits"], 1000, counts=case["counts"], rep=[1.5] * ROWS,
                           temp=[0.8] * ROWS)
    assert_processed(out, expected)
    unseen = case["counts"] == 0
    torch.testing.assert_close(out[unseen], case["logits"][unseen] / 0.8)


# ---- sampler: greedy and log-probs ---------------------------------------------------------------
@pytest.mark.parametrize("vocab", [1, 7, 1000, 50257, 250880])
def test_greedy_matches_argmax(vocab, seed):
    rows = 9
    logits = torch.randint(-3, 4, (rows, vocab), device=DEV).float()  # many ties
    logits[1] = torch.randn(vocab, device=DEV)
    logits[2, : vocab // 2] = NEG_INF
    logits[3, -1] = 10.0  # unique maximum at the last column
    tokens, lp = ops.sample_tokens(logits, i32(1), f32(1.0), torch.tensor(0, device=DEV),
                                   i32(list(range(rows))))
    assert torch.equal(tokens.long(), torch.argmax(logits, dim=-1))
    ref_lp = torch.log_softmax(logits.double(), -1).gather(1, tokens.long()[:, None])[:, 0]
    torch.testing.assert_close(lp.double(), ref_lp, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [1, 7, 4096, 4097, 50257, 250880, 600_000])
@pytest.mark.parametrize("split", [True, False])
def test_greedy_step_matches_argmax(dtype, vocab, split, seed):
    """The engine's greedy-step kernel (warpformer.greedy_tokens) equals torch.argmax with NaN
    never chosen: many ties (lowest index wins, also across the blocks a row is split into),
    -inf prefixes, a unique maximum in the last column, equal maxima in the first and last
    columns, an all -inf row (token 0), NaNs; aligned rows (16-byte loads), unaligned and padded
    rows (a view one column in), broadcast rows (stride 0); vocabularies from 1 entry to more
    than the 256 blocks' cap of 4,096 entries each."""
    rows = 9
    logits = torch.randint(-3, 4, (rows, vocab), device=DEV).to(dtype)  # many ties
    logits[1] = torch.randn(vocab, device=DEV).to(dtype)
    logits[2, : vocab // 2] = NEG_INF
    logits[3, -1] = 10.0  # unique maximum at the last column
    logits[4, 0] = logits[4, -1] = 10.0
    logits[5] = NEG_INF
    logits[6, ::2] = float("nan")

    def ref(x):
        return torch.argmax(torch.nan_to_num(x.float(), nan=NEG_INF), dim=-1)

    assert torch.equal(ops.greedy_tokens(logits, split=split).long(), ref(logits))
    wide = torch.zeros(rows, vocab + 9, device=DEV, dtype=dtype)
    wide[:, 1 : vocab + 1] = logits
    view = wide[:, 1:]  # rows start 2 or 4 bytes past 16-byte alignment, 8 padding columns
    assert torch.equal(ops.greedy_tokens(view, vocab, split=split).long(), ref(logits))
    one = logits[1:2].expand(4, vocab)
    assert torch.equal(ops.greedy_tokens(one, split=split).long(), ref(one))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [8, 40, 4097])
@pytest.mark.parametrize("split", [True, False])
def test_greedy_step_many_rows(dtype, vocab, split, seed):
    """70,000 rows (rows are on the grid's x dimension): torch.argmax for every row, past row
    65,535 too, with ties (rounded rows), NaN, -inf and maxima in the last column at the end of
    the batch, and 4,097 entries split over two blocks a row."""
    rows = MANY_ROWS
    logits = torch.randn(rows, vocab, device=DEV, dtype=dtype)
    logits[::2].round_()  # many ties
    last = rows - 5
    logits[last, ::2] = float("nan")
    logits[last + 1] = NEG_INF
    logits[last + 2, : vocab // 2] = NEG_INF
    logits[last + 3, -1] = 10.0
    logits[last + 4, 0] = logits[last + 4, -1] = 10.0
    logits[65_535, vocab // 2] = 10.0

    def ref(x):  # in slices: an fp32 copy of the whole batch would double the memory
        return torch.cat([torch.argmax(torch.nan_to_num(s.float(), nan=NEG_INF), dim=-1)
                          for s in x.split(8192)])

    assert torch.equal(ops.greedy_tokens(logits, split=split).long(), ref(logits))


@pytest.mark.parametrize("vocab", [7, 1000, 50257, 250880])
@pytest.mark.parametrize("k, p", [(0, 1.0), (50, 1.0), (0, 0.9), (1024, 0.8)])
def test_log_probs_before_filters(vocab, k, p, seed):
    rows = 6
    logits = torch.randn(rows, vocab, device=DEV) * 2
    logits[0, ::3] = NEG_INF
    tokens, lp = ops.sample_tokens(logits, i32(k), f32(p),
                                   torch.arange(rows, device=DEV, dtype=I64), i32(5))
    ref = torch.log_softmax(logits.double(), -1).gather(1, tokens.long()[:, None])[:, 0]
    torch.testing.assert_close(lp.double(), ref, atol=1e-4, rtol=1e-5)
    assert torch.isfinite(lp).all()


def test_degenerate_rows():
    """All -inf: token 0, log-prob -inf. One finite logit: that token (log-prob 0). Vocab 1."""
    logits = torch.full((3, 50), NEG_INF, device=DEV)
    logits[1, 37] = 2.0
    logits[2] = torch.randn(50, device=DEV)
    tokens, lp = ops.sample_tokens(logits, i32([0, 0, 5]), f32([0.9, 0.9, 1.0]),
                                   torch.tensor(3, device=DEV), i32(1))
    assert tokens[0].item() == 0 and lp[0].item() == NEG_INF
    assert tokens[1].item() == 37 and abs(lp[1].item()) < 1e-6
    one = torch.randn(4, 1, device=DEV)
    tokens, lp = ops.sample_tokens(one, i32([0, 1, 5, 0]), f32([1.0, 1.0, 0.5, 0.1]),
                                   torch.tensor(3, device=DEV), i32(9))
    assert tokens.tolist() == [0, 0, 0, 0]
    assert lp.abs().max().item() < 1e-6


def test_nan_and_inf_logits():
    """NaN is never drawn; +inf behaves as the largest value."""
    logits = torch.randn(2, 100, device=DEV)
    logits[0, ::2] = float("nan")
    logits[1, 41] = float("inf")
    tokens, _ = ops.sample_tokens(logits.expand(2, 100), i32([0, 0]), f32([1.0, 1.0]),
                                  torch.tensor(5, device=DEV), i32([0, 0]))
    assert tokens[0].item() % 2 == 1
    assert tokens[1].item() == 41


# ---- sampler: distributions ----------------------------------------------------------------------
# (vocab, logit scale, top_k, top_p, temperature): candidates path (top-k; top-p with a nucleus
# inside the best 1024 tokens) and mass path (larger nuclei; plain sampling of > 1024 tokens).
DIST_CASES = [
    (7, 1.0, 0, 1.0, 1.0),
    (1000, 2.0, 0, 1.0, 1.0),
    (1000, 2.0, 50, 1.0, 1.0),
    (1000, 2.0, 0, 0.9, 1.0),
    (1000, 2.0, 20, 0.7, 1.0),
    (1000, 2.0, 0, 0.95, 0.7),
    (50257, 6.0, 0, 0.9, 1.0),
    (50257, 1.0, 0, 0.9, 1.0),
    (50257, 3.0, 0, 0.95, 1.0),
    (50257, 1.0, 0, 1.0, 1.0),
    (50257, 2.0, 1024, 0.8, 1.0),
    (50257, 2.0, 40, 1.0, 1.3),
    (250880, 1.0, 1024, 1.0, 1.0),
    (250880, 1.0, 40, 0.9, 0.8),
    (250880, 8.0, 0, 0.9, 1.0),
]


@pytest.mark.parametrize("vocab, scale, k, p, temp", DIST_CASES)
def test_sampling_distribution(vocab, scale, k, p, temp, seed):
    raw = torch.randn(1, vocab, device=DEV) * scale
    row = ops.process_logits(raw, temperature=f32(temp)) if temp != 1.0 else raw
    tokens = draw_many(row[0], k, p)
    check_distribution(tokens, ref_filtered_probs(row[0], k, p),
                       f"vocab {vocab} scale {scale} k {k} p {p} temperature {temp}")


@pytest.mark.parametrize("k, p", [(0, 1.0), (30, 1.0), (0, 0.8)])
def test_sampling_distribution_over_seeds(k, p, seed):
    """The same holds when the seed, not the position, changes from draw to draw."""
    row = torch.randn(2000, device=DEV) * 2
    tokens = draw_many(row, k, p, vary="seed")
    check_distribution(tokens, ref_filtered_probs(row, k, p), f"seeds, k {k} p {p}")


@pytest.mark.parametrize("vocab, k", [(100, 10), (100, 40), (5000, 10), (5000, 700)])
def test_top_k_tie_rule(vocab, k, seed):
    """Logits in {0, 1, 2}: the kept set is the k best with the lowest indices among the tokens
    tied at the k-th value."""
    row = torch.randint(0, 3, (vocab,), device=DEV).float()
    probs = ref_filtered_probs(row, k, 1.0)
    assert int((probs > 0).sum()) == k
    tokens = draw_many(row, k, 1.0)
    check_distribution(tokens, probs, f"ties vocab {vocab} k {k}")
    assert set(tokens.unique().tolist()) == set(torch.nonzero(probs).flatten().tolist())


@pytest.mark.parametrize("vocab, p, kept", [(10, 0.35, 4), (5000, 0.3515, 1758)])
def test_top_p_tie_rule(vocab, p, kept):
    """All logits equal: top-p keeps the first `kept` indices (mass above each kept token < p);
    (10, .35) runs on the candidates path, (5000, .3515) on the mass path."""
    row = torch.zeros(vocab, device=DEV)
    probs = ref_filtered_probs(row, 0, p)
    assert torch.nonzero(probs).flatten().tolist() == list(range(kept))
    tokens = draw_many(row, 0, p)
    assert int(tokens.max()) < kept and int(tokens.min()) >= 0
    check_distribution(tokens, probs, f"top-p ties vocab {vocab}")


def test_top_k_ties_inside_top_p(seed):
    """Top-k and top-p together on tied values: the kept set is a prefix of one order."""
    row = torch.randint(0, 4, (3000,), device=DEV).float()
    for k, p in [(100, 0.505), (1024, 0.3)]:
        probs = ref_filtered_probs(row, k, p)
        tokens = draw_many(row, k, p)
        check_distribution(tokens, probs, f"ties k {k} p {p}")


# ---- sampler: reproducibility and independence ---------------------------------------------------
def test_same_seed_same_tokens(seed):
    logits = torch.randn(64, 50257, device=DEV)
    args = (i32(0), f32(0.95), torch.arange(64, device=DEV, dtype=I64) * 3 + 1, i32(11))
    a, la = ops.sample_tokens(logits, *args)
    b, lb = ops.sample_tokens(logits.clone(), *args)
    assert torch.equal(a, b) and torch.equal(la, lb)


def test_different_seeds_differ(seed):
    row = torch.randn(1, 1000, device=DEV)
    logits = row.expand(64, -1)
    tokens, _ = ops.sample_tokens(logits, i32(0), f32(1.0), torch.arange(64, device=DEV), i32(3))
    assert len(set(tokens.tolist())) > 20
    # two seeds over 50 positions: different sequences
    pos = torch.arange(50, device=DEV, dtype=I32)
    s1, _ = ops.sample_tokens(row.expand(50, -1), i32(40), f32(0.9), torch.tensor(1, device=DEV),
                              pos)
    s2, _ = ops.sample_tokens(row.expand(50, -1), i32(40), f32(0.9), torch.tensor(2, device=DEV),
                              pos)
    assert (s1 != s2).sum().item() > 10


@pytest.mark.parametrize("vocab", [7, 50257, 250880])
def test_batch_independence(vocab, seed):
    """Row r's token and log-prob do not depend on the other rows of the batch."""
    rows = 7
    logits = torch.randn(rows, vocab, device=DEV) * torch.tensor(
        [1.0, 3.0, 0.5, 6.0, 2.0, 1.0, 4.0], device=DEV)[:, None]
    k = i32([0, 1, 40, 0, 1024, 3, 0])
    p = f32([1.0, 1.0, 0.9, 0.6, 0.95, 1.0, 0.99])
    seeds = torch.tensor([5, 9, 2**40 + 3, 77, 0, 123456789, 31], device=DEV)
    pos = i32([0, 3, 100, 7, 2048, 1, 55])
    tokens, lp = ops.sample_tokens(logits, k, p, seeds, pos)
    for r in range(rows):
        t, l_ = ops.sample_tokens(logits[r:r + 1], k[r:r + 1], p[r:r + 1], seeds[r:r + 1],
                                  pos[r:r + 1])
        assert t.item() == tokens[r].item(), f"row {r}"
        assert l_.item() == lp[r].item(), f"row {r}"
    # and reversed order
    rev = torch.arange(rows - 1, -1, -1, device=DEV)
    t2, _ = ops.sample_tokens(logits[rev], k[rev], p[rev], seeds[rev], pos[rev])
    assert torch.equal(t2, tokens[rev])


def test_sampler_padded_rows(seed):
    """Columns past `vocab` are never drawn, and padding does not change the draw."""
    vocab = 5003
    big = torch.randn(16, vocab + 61, device=DEV)
    big[:, vocab:] = 1e4
    args = (i32(0), f32(1.0), torch.arange(16, device=DEV), i32(2))
    t1, l1 = ops.sample_tokens(big, *args, vocab=vocab)
    t2, l2 = ops.sample_tokens(big[:, :vocab].contiguous(), *args)
    assert int(t1.max()) < vocab
    assert torch.equal(t1, t2)
    torch.testing.assert_close(l1, l2)


def test_sampling_many_rows(seed):
    """The processor and the sampler with 70,000 rows: each row's own temperature, and
    top_k = 1 gives torch.argmax, past row 65,535 too."""
    rows, vocab = MANY_ROWS, 40
    logits = torch.randn(rows, vocab, device=DEV)
    temp = torch.rand(rows, device=DEV) + 0.5
    out = ops.process_logits(logits, temperature=temp)
    torch.testing.assert_close(out, logits / temp[:, None])
    tokens, lp = ops.sample_tokens(out, i32(1), f32(1.0), torch.tensor(0, device=DEV), i32(0))
    assert torch.equal(tokens.long(), torch.argmax(out, dim=-1))
    ref_lp = torch.log_softmax(out.double(), -1).gather(1, tokens.long()[:, None])[:, 0]
    torch.testing.assert_close(lp.double(), ref_lp, atol=1e-4, rtol=1e-5)


# ---- token update --------------------------------------------------------------------------------
def make_state(prompts: list[list[int]], stride: int):
    rows = len(prompts)
    out = torch.full((rows, stride), -7, dtype=I32)
    for r, pr in enumerate(prompts):
        out[r, : len(pr)] = torch.tensor(pr, dtype=I32)
    lens = [len(pr) for pr in prompts]
    return dict(cur_pos=i32([n - 1 for n in lens]), attn_len=i32(lens),
                finished=i32([0] * rows), output_ids=out.to(DEV), seq_lengths=i32(lens))


def step(st, tokens, end_ids, lp=None, **kw):
    return ops.update_tokens(i32(tokens), None if lp is None else f32(lp), st["cur_pos"],
                             st["attn_len"], st["finished"], st["output_ids"], st["seq_lengths"],
                             i32(end_ids), **kw)


def test_update_appends_and_ends_on_end_id():
    st = make_state([[1, 2, 3], [4, 5], [6]], stride=8)
    nxt = step(st, [10, 99, 12], [99, 99, 99])
    assert nxt.tolist() == [10, 99, 12]
    assert st["cur_pos"].tolist() == [3, 2, 1]
    assert st["attn_len"].tolist() == [4, 3, 2] and st["seq_lengths"].tolist() == [4, 3, 2]
    assert st["finished"].tolist() == [0, 1, 0]
    assert st["output_ids"][:, :4].tolist() == [[1, 2, 3, 10], [4, 5, 99, -7], [6, 12, -7, -7]]
    # the finished row is left alone and feeds its end id
    before = {k: v.clone() for k, v in st.items()}
    nxt = step(st, [11, 55, 13], [99, 99, 99])
    assert nxt.tolist() == [11, 99, 13]
    assert st["output_ids"][1].tolist() == before["output_ids"][1].tolist()
    for key in ("cur_pos", "attn_len", "seq_lengths", "finished"):
        assert st[key][1].item() == before[key][1].item()


def test_update_output_limit():
    st = make_state([[1, 2, 3, 4], [5]], stride=6)
    step(st, [7, 8], [0, 0])
    assert st["finished"].tolist() == [0, 0]
    step(st, [9, 8], [0, 0])  # row 0 writes the last column
    assert st["finished"].tolist() == [1, 0]
    assert st["seq_lengths"].tolist() == [6, 3]
    assert st["output_ids"][0].tolist() == [1, 2, 3, 4, 7, 9]


@pytest.mark.parametrize("per_row", [False, True])
def test_update_stop_words(per_row):
    """Stop words end a row when its output ends with one, including matches that start inside
    the prompt; a partial or misplaced match does not end it."""
    prompts = [[1, 2, 7, 8], [3, 7, 8], [7, 8], [5, 6]]
    entries = [[8, 9], [4, 4, 4], [2, 7, 8, 6]]  # [8, 9] spans the prompt boundary
    st = make_state(prompts, stride=10)
    if per_row:
        lists = [entries, [[4, 4, 4]], entries, [[5, 6, 9]]]
        words = ft_words(lists, length=12)
    else:
        lists = [entries] * 4
        words = ft_words([entries])[0]
    step(st, [9, 9, 6, 9], [0, 0, 0, 0], stop_words=words)
    if per_row:
        # row 0: ...8, 9 matches [8, 9]; row 1 has no [8, 9]; row 2: 7 8 6 misses [2, 7, 8, 6]
        # (no 2 before); row 3: 5 6 9 matches its own [5, 6, 9]
        assert st["finished"].tolist() == [1, 0, 0, 1]
    else:
        assert st["finished"].tolist() == [1, 1, 0, 0]
    step(st, [4, 4, 4, 4], [0, 0, 0, 0], stop_words=words)
    step(st, [4, 4, 4, 4], [0, 0, 0, 0], stop_words=words)
    fin = st["finished"].tolist()
    assert fin[2] == 0  # 7 8 6 4 4: [4, 4, 4] needs three
    step(st, [4, 4, 4, 4], [0, 0, 0, 0], stop_words=words)
    assert st["finished"].tolist()[2] == 1  # 7 8 6 4 4 4
    assert st["seq_lengths"].tolist()[2] == 6


def test_update_log_probs_and_counts():
    st = make_state([[1, 2], [3], [4, 5, 6]], stride=9)
    cum = f32([0.5, 0.0, -1.0])
    olp = torch.zeros(3, 4, device=DEV)
    counts = ops.count_tokens(st["output_ids"], st["seq_lengths"], 20)
    step(st, [7, 8, 2], [0, 8, 0], lp=[-0.25, -1.5, -2.0], cum_log_probs=cum,
         output_log_probs=olp, step=0, token_counts=counts)
    step(st, [7, 9, 2], [0, 8, 0], lp=[-0.5, -3.0, -0.125], cum_log_probs=cum,
         output_log_probs=olp, step=1, token_counts=counts)
    torch.testing.assert_close(cum, f32([-0.25, -1.5, -3.125]))  # row 1 stopped on its end id
    torch.testing.assert_close(olp, torch.tensor([[-0.25, -0.5, 0, 0], [-1.5, 0, 0, 0],
                                                  [-2.0, -0.125, 0, 0]], device=DEV))
    expected = ops.count_tokens(st["output_ids"], st["seq_lengths"], 20)
    assert torch.equal(counts, expected)


def test_update_log_prob_columns_from_input_lengths():
    """With input_lengths, each row writes its log-prob at its own generated index (ragged
    prompts, a row that finished early), whatever `step` says."""
    st = make_state([[1, 2, 3], [4], [5, 6]], stride=8)
    olp = torch.zeros(3, 5, device=DEV)
    lens = i32([3, 1, 2])
    for i, lp in enumerate([[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0]]):
        step(st, [7, 9 if i == 0 else 8, 7], [9, 9, 9], lp=lp, output_log_probs=olp, step=4,
             input_lengths=lens)
    assert st["finished"].tolist() == [0, 1, 0]
    torch.testing.assert_close(olp, torch.tensor([[-1.0, -4.0, 0, 0, 0], [-2.0, 0, 0, 0, 0],
                                                  [-3.0, -6.0, 0, 0, 0]], device=DEV))


def test_sampling_loop_with_penalties(seed):
    """A small generation loop over fixed logits: process -> sample -> update. A large presence
    penalty makes every token distinct; min_length holds back the end id; bad words never
    appear; the end id ends rows after min_length."""
    rows, vocab, prompt, steps = 4, 64, 3, 20
    base = torch.randn(rows, vocab, device=DEV)
    base[:, 0] += 5.0  # the end id is attractive
    st = make_state([[10, 11, 12]] * rows, stride=prompt + steps)
    counts = ops.count_tokens(st["output_ids"], st["seq_lengths"], vocab)
    bad = ft_words([[[5], [6], [12, 13]]])[0]
    end = i32(0)
    for _ in range(steps):
        logits = ops.process_logits(base, token_counts=counts, presence_penalty=f32(100.0),
                                    min_length=i32([0, 5, 10, 30]), end_ids=end,
                                    input_lengths=i32([prompt] * rows), cur_pos=st["cur_pos"],
                                    output_ids=st["output_ids"], bad_words=bad)
        tok, lp = ops.sample_tokens(logits, i32(0), f32(1.0), torch.arange(rows, device=DEV),
                                    st["cur_pos"] + 1)
        ops.update_tokens(tok, lp, st["cur_pos"], st["attn_len"], st["finished"],
                          st["output_ids"], st["seq_lengths"], end, token_counts=counts)
    out = st["output_ids"].tolist()
    lens = st["seq_lengths"].tolist()
    for r in range(rows):
        gen = out[r][prompt:lens[r]]
        assert 5 not in gen and 6 not in gen
        assert not (gen and gen[0] == 13)  # 12 13 is banned right after the prompt
        body = gen[:-1] if gen and gen[-1] == 0 else gen
        assert 0 not in body
        assert len(set(body)) == len(body), f"row {r} repeated a token: {gen}"
        min_len = [0, 5, 10, 30][r]
        if gen and gen[-1] == 0:
            assert len(gen) > min_len


def test_opcheck(seed):
    utils = ("test_schema", "test_faketensor")
    logits = torch.randn(3, 50, device=DEV, dtype=torch.float16)
    torch.library.opcheck(ops.process_logits.default, (logits,),
                          dict(temperature=f32([0.5, 1.0, 2.0])), test_utils=utils)
    torch.library.opcheck(ops.sample_tokens.default,
                          (logits.float(), i32(5), f32(0.9), torch.tensor(1, device=DEV), i32(0)),
                          test_utils=utils)
    ids = torch.randint(0, 50, (3, 6), device=DEV, dtype=I32)
    torch.library.opcheck(ops.count_tokens.default, (ids, i32([6, 2, 0]), 50), test_utils=utils)
