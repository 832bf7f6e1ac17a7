"""CPU checks of beam search.

1. The plain-PyTorch twin of the kernels (tests/_beam_reference.py), driven by a tiny random HF
   GPT-2 in fp32, equals HF transformers' `generate(num_beams=4, length_penalty=...)` token for
   token with equal sequence scores: this pins the kernels' semantics to HF 5.x (candidate count,
   end-token hypotheses, length penalty, the early-stop rule, the final selection).
2. The reference keeps the cache-indirection invariant the decode attention relies on.
3. The beam ops: registration, mutation annotations, fake shapes and argument messages (dtype and
   shape are checked before the device, so CPU tensors reach them).
"""

from __future__ import annotations

import pytest
import torch

from tests import _beam_reference as ref

I32, F32 = torch.int32, torch.float32
W, N_NEW, VOCAB = 4, 10, 64


# ---- 1. reference vs HF -------------------------------------------------------------------------
def hf_beam(model, prompts: torch.Tensor, eos: int | None, lp: float):
    kw = dict(eos_token_id=eos, pad_token_id=eos) if eos is not None else {}
    with torch.no_grad():
        out = model.generate(prompts, attention_mask=torch.ones_like(prompts), num_beams=W,
                             num_return_sequences=W, do_sample=False, length_penalty=lp,
                             early_stopping=False, max_new_tokens=N_NEW, output_scores=True,
                             return_dict_in_generate=True, **kw)
    return out.sequences, out.sequences_scores


def _gpt2(transformers):
    torch.manual_seed(0)
    # initializer_range 0.2: peaked logits (top-2 gaps far above the fp32 noise between HF's
    # cached forward and the reference's full recompute) that still vary with the context.
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2,
                                  n_positions=64, n_inner=64, bos_token_id=1, eos_token_id=2,
                                  initializer_range=0.2, attn_implementation="eager")
    model = transformers.GPT2LMHeadModel(cfg).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


@pytest.fixture(scope="module")
def setup():
    """(model, prompts, eos): a tiny random GPT-2 whose end token (a frequently generated one,
    its tied embedding row scaled up) makes some entries finish early enough for HF's early-stop
    rule to fire while others run to the length limit, so that finished hypotheses, the store,
    the done rule and the final selection all matter."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(1)
    prompts = torch.randint(3, VOCAB, (3, 5))
    seqs, _ = hf_beam(_gpt2(transformers), prompts, None, 1.0)
    counts = torch.bincount(seqs[:, 5:].flatten(), minlength=VOCAB)
    for eos in counts.argsort(descending=True)[:8].tolist():
        for factor in (1.5, 2.0, 3.0):
            model = _gpt2(transformers)
            with torch.no_grad():
                model.transformer.wte.weight[eos] *= factor
            st = _run_state(ref.hf_log_prob_fn(model), prompts.tolist(), eos, 1.0)
            if st.done.any() and not st.done.all():
                return model, prompts, eos
    pytest.fail("no end token makes some but not all entries finish early; change the seed")


def compare_with_hf(model, prompts: torch.Tensor, eos: int, lp: float) -> dict:
    seqs, scores = hf_beam(model, prompts, eos, lp)
    out = ref.beam_generate(ref.hf_log_prob_fn(model), prompts.tolist(), W, N_NEW, eos, lp)
    length = seqs.shape[1]
    mine = out["output_ids"].reshape(-1, out["output_ids"].shape[-1])
    assert torch.equal(mine[:, :length].long(), seqs), f"lp={lp}\nHF:\n{seqs}\nreference:\n{mine}"
    assert (mine[:, length:] == eos).all()
    torch.testing.assert_close(out["scores"].flatten(), scores, rtol=1e-5, atol=1e-5)
    # sequence_lengths: HF's sequence up to and including its first end token after the prompt
    p = prompts.shape[1]
    for i in range(seqs.shape[0]):
        gen = seqs[i, p:]
        hits = (gen == eos).nonzero()
        n = int(hits[0]) + 1 if len(hits) else N_NEW
        assert out["sequence_lengths"].flatten()[i] == p + n
    return out


@pytest.mark.parametrize("lp", [1.0, 0.7])
def test_reference_equals_hf(setup, lp: float) -> None:
    hf_model, prompts, eos = setup
    out = compare_with_hf(hf_model, prompts, eos, lp)
    # Log probs: the per-token values sum to the cum log prob (no diversity penalty here).
    gen = out["sequence_lengths"] - prompts.shape[1]
    for b in range(prompts.shape[0]):
        for i in range(W):
            total = out["output_log_probs"][b, i, :gen[b, i]].sum()
            torch.testing.assert_close(total, out["cum_log_probs"][b, i], rtol=1e-4, atol=1e-4)


def test_reference_equals_hf_other_penalties(setup) -> None:
    hf_model, prompts, eos = setup
    for lp in (0.0, 2.0, -0.5):
        compare_with_hf(hf_model, prompts, eos, lp)


def test_reference_ragged_equals_hf_per_row(setup) -> None:
    hf_model, _, eos = setup
    torch.manual_seed(2)
    prompts = [torch.randint(3, VOCAB, (n,)).tolist() for n in (3, 7, 1)]
    out = ref.beam_generate(ref.hf_log_prob_fn(hf_model), prompts, W, N_NEW, eos, 1.0)
    for b, p in enumerate(prompts):
        seqs, scores = hf_beam(hf_model, torch.tensor([p]), eos, 1.0)
        length = seqs.shape[1]
        assert torch.equal(out["output_ids"][b, :, :length].long(), seqs)
        torch.testing.assert_close(out["scores"][b], scores, rtol=1e-5, atol=1e-5)


def test_reference_done_entries_are_frozen(setup) -> None:
    """Running on after an entry is done (as the device loop does) changes nothing."""
    hf_model, prompts, eos = setup
    fn = ref.hf_log_prob_fn(hf_model)
    a = ref.beam_generate(fn, prompts.tolist(), W, N_NEW, eos, 0.7, stop_when_done=True)
    b = ref.beam_generate(fn, prompts.tolist(), W, N_NEW, eos, 0.7, stop_when_done=False)
    for key in a:
        assert torch.equal(a[key], b[key]), key


def _run_state(fn, prompts, eos, lp, diversity=0.0, shared=False):
    seq = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), seq, dtype=I32)
    for b, p in enumerate(prompts):
        ids[b, :len(p)] = torch.tensor(p, dtype=I32)
    lengths = torch.tensor([len(p) for p in prompts], dtype=I32)
    st = ref.init_state(ids, lengths, torch.full((len(prompts),), eos, dtype=I32), W, N_NEW,
                        seq + N_NEW + 2, shared_prompt_slot=shared)
    kv = ref.TokenKvCache(st, ids, shared)
    for _ in range(N_NEW):
        rows = [st.output_ids[r, :int(st.cur_pos[r]) + 1].tolist() for r in range(len(prompts) * W)]
        ref.step(st, fn(rows), lp, diversity)
        ref.update(st)
        kv.write_and_check(st.output_ids, st.cache_indir, st.cur_pos, st.attn_len)
    return st


@pytest.mark.parametrize("shared", [False, True])
def test_reference_cache_indirection_invariant(setup, shared: bool) -> None:
    hf_model, _, eos = setup
    torch.manual_seed(3)
    prompts = [torch.randint(3, VOCAB, (n,)).tolist() for n in (4, 2)]
    _run_state(ref.hf_log_prob_fn(hf_model), prompts, eos, 1.0, diversity=0.3, shared=shared)


def test_reference_diversity_rule() -> None:
    """One step by hand: W=2, V=4, diversity 1: a candidate's score drops by its rank in its
    own row, and the penalised score is what the beam carries."""

    def run(diversity: float):
        st = ref.init_state(torch.tensor([[1]], dtype=I32), torch.tensor([1], dtype=I32),
                            torch.tensor([99], dtype=I32), 2, 3, 8)
        st.cum_log_probs[0] = torch.tensor([0.0, -0.1])
        parents, tokens, _ = ref.step(st, lp, 1.0, diversity_rate=diversity)
        return st, parents.tolist(), tokens.tolist()

    lp = torch.log(torch.tensor([[0.6, 0.39, 0.005, 0.005], [0.3, 0.3, 0.2, 0.2]]))
    # Without diversity row 0 supplies both beams (-0.51, -0.94 beat row 1's -1.30).
    _, parents, tokens = run(0.0)
    assert parents == [[0, 0]] and tokens == [[0, 1]]
    # With diversity 1 row 0's second token (rank 1) drops to -1.94, below row 1's first.
    st, parents, tokens = run(1.0)
    assert parents == [[0, 1]] and tokens == [[0, 0]]
    assert st.cum_log_probs[0, 1] == torch.tensor(-0.1, dtype=F32) + lp[1, 0]


# ---- 3. ops ------------------------------------------------------------------------------------
def _ops():
    import warpformer  # noqa: F401

    return torch.ops.warpformer


OP_NAMES = ["beam_log_softmax", "beam_search_init", "beam_search_step", "beam_search_update",
            "beam_search_finalize"]


@pytest.mark.parametrize("name", OP_NAMES)
def test_registered(name: str) -> None:
    assert getattr(_ops(), name).default._schema.name == f"warpformer::{name}"


def test_mutation_annotations() -> None:
    ops = _ops()

    def writes(name):
        return {a.name for a in getattr(ops, name).default._schema.arguments
                if a.alias_info is not None and a.alias_info.is_write}

    assert writes("beam_search_step") == {"cum_log_probs", "done", "hyp_count", "hyp_score",
                                          "hyp_cum", "hyp_len", "hyp_ids", "hyp_log_probs"}
    assert writes("beam_search_update") == {"gen_len", "output_ids", "cache_indir",
                                            "run_log_probs", "cur_pos", "attn_len"}
    for name in ("beam_log_softmax", "beam_search_init", "beam_search_finalize"):
        assert not writes(name)


def state(B=2, Wd=4, S=5, out=6, max_seq=16, device="cpu") -> dict[str, torch.Tensor]:
    """A state with the ops' layout (values irrelevant for the argument checks)."""
    R, stride = B * Wd, S + out
    z = dict(device=device)
    return dict(
        input_ids=torch.ones(B, S, dtype=I32, **z),
        input_lengths=torch.full((B,), S, dtype=I32, **z),
        end_ids=torch.zeros(B, dtype=I32, **z), output_ids=torch.zeros(R, stride, dtype=I32, **z),
        cache_indir=torch.zeros(R, max_seq, dtype=I32, **z),
        cum_log_probs=torch.zeros(B, Wd, **z), cur_pos=torch.zeros(R, dtype=I32, **z),
        attn_len=torch.zeros(R, dtype=I32, **z), gen_len=torch.zeros(B, dtype=I32, **z),
        done=torch.zeros(B, dtype=I32, **z), hyp_count=torch.zeros(B, dtype=I32, **z),
        hyp_score=torch.zeros(B, Wd, **z), hyp_cum=torch.zeros(B, Wd, **z),
        hyp_len=torch.zeros(B, Wd, dtype=I32, **z),
        hyp_ids=torch.zeros(B, Wd, stride, dtype=I32, **z),
        run_log_probs=torch.zeros(R, out, **z), hyp_log_probs=torch.zeros(B, Wd, out, **z),
        parents=torch.zeros(B, Wd, dtype=I32, **z), tokens=torch.zeros(B, Wd, dtype=I32, **z),
        token_log_probs=torch.zeros(B, Wd, **z), log_probs=torch.zeros(B * Wd, 11, **z))


STEP_ARGS = ["log_probs", "input_lengths", "end_ids", "output_ids", "run_log_probs", "gen_len",
             "cum_log_probs", "done", "hyp_count", "hyp_score", "hyp_cum", "hyp_len", "hyp_ids",
             "hyp_log_probs"]
UPDATE_ARGS = ["parents", "tokens", "token_log_probs", "input_lengths", "gen_len", "output_ids",
               "cache_indir", "run_log_probs", "cur_pos", "attn_len"]
FINALIZE_ARGS = ["input_lengths", "end_ids", "output_ids", "run_log_probs", "cum_log_probs",
                 "gen_len", "done", "hyp_count", "hyp_score", "hyp_cum", "hyp_len", "hyp_ids",
                 "hyp_log_probs"]


def call(name: str, s: dict, *extra):
    ops = _ops()
    args = {"beam_search_step": STEP_ARGS, "beam_search_update": UPDATE_ARGS,
            "beam_search_finalize": FINALIZE_ARGS}[name]
    return getattr(ops, name)(*[s[a] for a in args], *extra)


def test_fake_shapes() -> None:
    ops = _ops()
    s = {k: v.to("meta") for k, v in state().items()}
    init = ops.beam_search_init(s["input_ids"], s["input_lengths"], s["end_ids"], 4, 6, 16)
    assert [tuple(t.shape) for t in init] == [
        (8, 11), (8, 16), (2, 4), (8,), (8,), (2,), (2,), (2,), (2, 4), (2, 4), (2, 4),
        (2, 4, 11), (8, 6), (2, 4, 6)]
    parents, tokens, tlp = call("beam_search_step", s, 1.0, 0.0)
    assert parents.shape == tokens.shape == tlp.shape == (2, 4)
    assert parents.dtype == torch.int32 and tlp.dtype == torch.float32
    ids, lens, cum, scores, lps = call("beam_search_finalize", s, 1.0, 9)
    assert ids.shape == (2, 4, 9) and lens.shape == (2, 4) and lps.shape == (2, 4, 6)
    assert ops.beam_log_softmax(torch.empty(3, 7, dtype=torch.half, device="meta")).dtype == F32


def test_init_messages() -> None:
    ops = _ops()
    s = state()
    ids, lens, ends = s["input_ids"], s["input_lengths"], s["end_ids"]
    with pytest.raises(RuntimeError, match=r"beam_width must be in \[1, 16\], got 17"):
        ops.beam_search_init(ids, lens, ends, 17, 6, 16)
    with pytest.raises(RuntimeError, match="input_ids must have dtype Int"):
        ops.beam_search_init(ids.long(), lens, ends, 4, 6, 16)
    with pytest.raises(RuntimeError, match="max_seq .* must be >= input_ids.shape\\[1\\] \\+ "
                                           "output_len = 11"):
        ops.beam_search_init(ids, lens, ends, 4, 6, 10)
    with pytest.raises(RuntimeError, match="output_len must be in"):
        ops.beam_search_init(ids, lens, ends, 4, 0, 16)
    with pytest.raises(RuntimeError, match=r"end_ids must have shape \[B\]"):
        ops.beam_search_init(ids, lens, ends[:1], 4, 6, 16)
    with pytest.raises(RuntimeError, match="input_ids must be a CUDA tensor"):
        ops.beam_search_init(ids, lens, ends, 4, 6, 16)


def test_step_messages() -> None:
    s = state()
    with pytest.raises(RuntimeError, match="log_probs must have dtype Float"):
        call("beam_search_step", {**s, "log_probs": s["log_probs"].half()}, 1.0, 0.0)
    with pytest.raises(RuntimeError, match=r"log_probs must have B \* W = 8 rows \(or B = 2"):
        call("beam_search_step", {**s, "log_probs": torch.zeros(5, 11)}, 1.0, 0.0)
    with pytest.raises(RuntimeError, match="vocabulary\\) must be >= 2"):
        call("beam_search_step", {**s, "log_probs": torch.zeros(8, 1)}, 1.0, 0.0)
    with pytest.raises(RuntimeError, match=r"the beam width\) must be in \[1, 16\], got 17"):
        call("beam_search_step", {**s, "cum_log_probs": torch.zeros(2, 17)}, 1.0, 0.0)
    with pytest.raises(RuntimeError, match=r"hyp_ids must have shape \[B, W, ids_stride\]"):
        call("beam_search_step", {**s, "hyp_ids": torch.zeros(2, 4, 3, dtype=I32)}, 1.0, 0.0)
    with pytest.raises(RuntimeError, match="hyp_score must be contiguous"):
        call("beam_search_step", {**s, "hyp_score": torch.zeros(4, 2).t()}, 1.0, 0.0)
    with pytest.raises(RuntimeError, match="length_penalty must be finite"):
        call("beam_search_step", s, float("nan"), 0.0)
    with pytest.raises(RuntimeError, match="diversity_rate must be finite"):
        call("beam_search_step", s, 1.0, float("inf"))
    with pytest.raises(RuntimeError, match="log_probs must be a CUDA tensor"):
        call("beam_search_step", s, 1.0, 0.0)
    # a one-row-per-entry first step is accepted up to the device check
    with pytest.raises(RuntimeError, match="must be a CUDA tensor"):
        call("beam_search_step", {**s, "log_probs": torch.zeros(2, 11)}, 1.0, 0.0)


def test_update_and_finalize_messages() -> None:
    s = state()
    with pytest.raises(RuntimeError, match=r"tokens must have shape \[B, W\]"):
        call("beam_search_update", {**s, "tokens": torch.zeros(2, 3, dtype=I32)})
    with pytest.raises(RuntimeError, match=r"cache_indir must have shape \[B \* W, max_seq\]"):
        call("beam_search_update", {**s, "cache_indir": torch.zeros(7, 16, dtype=I32)})
    with pytest.raises(RuntimeError, match="parents must be a CUDA tensor"):
        call("beam_search_update", s)
    with pytest.raises(RuntimeError, match=r"hyp_log_probs must have shape \[B, W, output_len\]"):
        call("beam_search_finalize", {**s, "hyp_log_probs": torch.zeros(2, 4, 5)}, 1.0, -1)
    with pytest.raises(RuntimeError, match="out_stride must be -1"):
        call("beam_search_finalize", s, 1.0, 0)
    with pytest.raises(RuntimeError, match="input_lengths must be a CUDA tensor"):
        call("beam_search_finalize", s, 1.0, -1)
    with pytest.raises(RuntimeError, match="logits must be float32, float16 or bfloat16"):
        _ops().beam_log_softmax(torch.zeros(2, 3, dtype=I32))
