"""CPU-side checks of the sampling ops: registration, mutation annotations, fake shapes, and the
argument validation messages. Dtype, shape and value checks come before the device check, so CPU
tensors reach them; arguments that are valid apart from their device get the "needs a GPU"
message."""

from __future__ import annotations

import pytest
import torch

import warpformer  # noqa: F401
import warpformer._ops_sampling  # noqa: E402,F401  (fake implementations)

ops = torch.ops.warpformer
I32, F32, I64 = torch.int32, torch.float32, torch.int64
NAMES = ["count_tokens", "add_token_counts", "process_logits", "sample_tokens", "update_tokens",
         "greedy_tokens"]
CUDA_MSG = "must be a CUDA tensor"


def words(entries: list[list[int]], length: int | None = None) -> torch.Tensor:
    """FT word list [2, L] of the given entries."""
    flat = [t for e in entries for t in e]
    L = length or max(1, len(flat))
    out = torch.full((2, L), -1, dtype=I32)
    out[0] = 0
    out[0, : len(flat)] = torch.tensor(flat, dtype=I32)
    end = 0
    for i, e in enumerate(entries):
        end += len(e)
        out[1, i] = end
    return out


@pytest.mark.parametrize("name", NAMES)
def test_registered(name: str) -> None:
    assert getattr(ops, name).default._schema.name == f"warpformer::{name}"


def test_mutation_annotations() -> None:
    def writes(name):
        schema = getattr(ops, name).default._schema
        return {a.name for a in schema.arguments
                if a.alias_info is not None and a.alias_info.is_write}

    assert writes("update_tokens") == {"cur_pos", "attn_len", "finished", "output_ids",
                                       "seq_lengths", "cum_log_probs", "output_log_probs",
                                       "token_counts"}
    assert writes("add_token_counts") == {"counts"}
    for name in ("count_tokens", "process_logits", "sample_tokens", "greedy_tokens"):
        assert writes(name) == set()


def test_fake_shapes() -> None:
    def meta(*shape, dtype=F32):
        return torch.empty(*shape, dtype=dtype, device="meta")

    out = ops.process_logits(meta(3, 64, dtype=torch.float16), vocab=50)
    assert out.shape == (3, 50) and out.dtype == F32
    assert ops.process_logits(meta(3, 64, dtype=torch.bfloat16)).shape == (3, 64)
    tok, lp = ops.sample_tokens(meta(4, 10), meta(4, dtype=I32), meta(4), meta(4, dtype=I64),
                                meta(4, dtype=I32))
    assert tok.shape == (4,) and tok.dtype == I32 and lp.shape == (4,) and lp.dtype == F32
    counts = ops.count_tokens(meta(2, 7, dtype=I32), meta(2, dtype=I32), 11)
    assert counts.shape == (2, 11) and counts.dtype == I32
    s = meta(3, dtype=I32)
    nxt = ops.update_tokens(s, None, s, s, s, meta(3, 9, dtype=I32), s, s)
    assert nxt.shape == (3,) and nxt.dtype == I32
    best = ops.greedy_tokens(meta(5, 100, dtype=torch.float16), 90)
    assert best.shape == (5,) and best.dtype == I32


# ---- process_logits ---------------------------------------------------------------------------
def logits(rows=3, vocab=10, dtype=F32):
    return torch.randn(rows, vocab).to(dtype)


def test_process_logits_cpu_needs_gpu() -> None:
    with pytest.raises(RuntimeError, match=CUDA_MSG):
        ops.process_logits(logits(), temperature=torch.tensor(0.7))


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=torch.tensor([1.0, 0.0, 1.0])),
     r"temperature\[1\] = 0 breaks the rule: finite and > 0"),
    (dict(temperature=torch.tensor([1.0, 1.0])),
     r"temperature must have shape \[3\] \(one value per row\) or \[\]"),
    (dict(temperature=torch.tensor(0.5, dtype=torch.float64)), "temperature must have dtype Float"),
    (dict(repetition_penalty=torch.tensor(1.2)), "token_counts is required when"),
    (dict(repetition_penalty=torch.tensor(-1.0), token_counts=torch.zeros(3, 10, dtype=I32)),
     r"repetition_penalty\[0\] = -1 breaks the rule"),
    (dict(presence_penalty=torch.tensor(0.5), token_counts=torch.zeros(3, 9, dtype=I32)),
     r"token_counts must have shape \[3, 10\]"),
    (dict(frequency_penalty=torch.tensor(float("nan")), token_counts=torch.zeros(3, 10, dtype=I32)),
     r"frequency_penalty\[0\] = nan breaks the rule: finite"),
    (dict(min_length=torch.tensor(3, dtype=I32)), "end_ids is required when min_length"),
    (dict(min_length=torch.tensor(-1, dtype=I32), end_ids=torch.tensor(2, dtype=I32)),
     r"min_length\[0\] = -1 breaks the rule: >= 0"),
    (dict(min_length=torch.tensor(3, dtype=I32), end_ids=torch.tensor(2, dtype=I32),
          cur_pos=torch.tensor(4, dtype=I32)), "min_length needs both input_lengths and cur_pos"),
    (dict(bad_words=torch.zeros(3, 4, dtype=I32)), r"bad_words must have shape \[2, L\]"),
    (dict(bad_words=words([[3], [4, 5]]).float()), "bad_words must have dtype Int"),
    (dict(bad_words=words([[3], [12]])), "token id 12 at position 1 is outside"),
    (dict(bad_words=torch.tensor([[1, 2, 3], [2, 1, -1]], dtype=I32)),
     "offsets must be increasing"),
    (dict(bad_words=torch.tensor([[1, 2, 3], [1, -1, 3]], dtype=I32)),
     "follows a -1; the -1 padding must come after every entry"),
    (dict(bad_words=words([[3], [4, 5]])), "they need output_ids and cur_pos"),
    (dict(bad_words=words([[3], [4, 5]]), output_ids=torch.zeros(3, 6, dtype=I32),
          cur_pos=torch.tensor([0, 6, 1], dtype=I32)),
     r"cur_pos\[1\] = 6 breaks the rule: 0 <= cur_pos < output_ids.shape\[1\]"),
    (dict(output_ids=torch.zeros(2, 6, dtype=I32)), r"output_ids.shape\[0\] must be 3"),
    (dict(vocab=11), r"vocab must be -1 \(all columns\) or in \[1, logits.shape\[1\] = 10\]"),
])
def test_process_logits_messages(kwargs, message) -> None:
    with pytest.raises(RuntimeError, match=message):
        ops.process_logits(logits(), **kwargs)


def test_process_logits_logits_rules() -> None:
    with pytest.raises(RuntimeError, match="logits must be float32, float16 or bfloat16"):
        ops.process_logits(torch.zeros(2, 5, dtype=I32))
    with pytest.raises(RuntimeError, match="logits must be 2-dimensional"):
        ops.process_logits(torch.zeros(5))


def test_process_logits_valid_word_lists_reach_device_check() -> None:
    per_row = torch.stack([words([[1], [2, 3]], 4), words([[4, 5, 6]], 4), words([], 4)])
    with pytest.raises(RuntimeError, match=CUDA_MSG):
        ops.process_logits(logits(), bad_words=per_row, output_ids=torch.zeros(3, 8, dtype=I32),
                           cur_pos=torch.tensor([1, 2, 3], dtype=I32))


# ---- greedy_tokens ------------------------------------------------------------------------------
def test_greedy_tokens_cpu_needs_gpu() -> None:
    with pytest.raises(RuntimeError, match=CUDA_MSG):
        ops.greedy_tokens(torch.randn(2, 10).half())


@pytest.mark.parametrize("args, message", [
    ((torch.zeros(2, 10, dtype=I32),), "logits must be float32, float16 or bfloat16, got Int"),
    ((torch.randn(2, 3, 10),), "logits must be 2-dimensional"),
    ((torch.randn(2, 10), 11), r"vocab must be -1 \(all columns\) or in \[1, logits.shape\[1\]"),
    ((torch.randn(2, 10), 0), r"vocab must be -1 \(all columns\) or in \[1, "),
])
def test_greedy_tokens_messages(args, message) -> None:
    with pytest.raises(RuntimeError, match=message):
        ops.greedy_tokens(*args)


# ---- sample_tokens ------------------------------------------------------------------------------
def sample_args(rows=4, vocab=10, **over):
    args = dict(logits=torch.randn(rows, vocab), top_k=torch.tensor(0, dtype=I32),
                top_p=torch.tensor(0.9), seeds=torch.tensor(7, dtype=I64),
                positions=torch.arange(rows, dtype=I32))
    args.update(over)
    return args


def test_sample_tokens_cpu_needs_gpu() -> None:
    with pytest.raises(RuntimeError, match=CUDA_MSG):
        ops.sample_tokens(**sample_args())


@pytest.mark.parametrize("over, message", [
    (dict(logits=torch.randn(4, 10).half()), r"logits must have dtype Float \(the processed"),
    (dict(top_k=torch.tensor([0, 1, 1025, 3], dtype=I32)),
     r"top_k\[2\] = 1025 breaks the rule: 0 <= top_k <= 1024"),
    (dict(top_k=torch.tensor([-1, 1, 5, 3], dtype=I32)), r"top_k\[0\] = -1 breaks the rule"),
    (dict(top_k=torch.tensor(1, dtype=I64)), "top_k must have dtype Int"),
    (dict(top_p=torch.tensor([0.5, 0.0, 1.0, 1.0])), r"top_p\[1\] = 0 breaks the rule: 0 < top_p"),
    (dict(top_p=torch.tensor(1.5)), r"top_p\[0\] = 1.5 breaks the rule"),
    (dict(seeds=torch.tensor(3, dtype=I32)), "seeds must have dtype Long"),
    (dict(positions=torch.arange(3, dtype=I32)), r"positions must have shape \[4\]"),
    (dict(positions=torch.tensor(-2, dtype=I32)), r"positions\[0\] = -2 breaks the rule: >= 0"),
])
def test_sample_tokens_messages(over, message) -> None:
    with pytest.raises(RuntimeError, match=message):
        ops.sample_tokens(**sample_args(**over))


def test_sample_tokens_vocab_rule() -> None:
    with pytest.raises(RuntimeError, match="vocab must be -1"):
        ops.sample_tokens(**sample_args(), vocab=0)


# ---- count_tokens / add_token_counts ------------------------------------------------------------
def test_count_tokens_messages() -> None:
    ids = torch.zeros(2, 5, dtype=I32)
    with pytest.raises(RuntimeError, match="ids must have dtype Int"):
        ops.count_tokens(ids.long(), torch.tensor([1, 2], dtype=I32), 10)
    with pytest.raises(RuntimeError, match=r"lengths\[1\] = 6 breaks the rule: 0 <= length"):
        ops.count_tokens(ids, torch.tensor([1, 6], dtype=I32), 10)
    with pytest.raises(RuntimeError, match=r"vocab must be in \[1, 2\^31\)"):
        ops.count_tokens(ids, torch.tensor([1, 2], dtype=I32), 0)
    with pytest.raises(RuntimeError, match=r"lengths.shape\[0\] must be 2"):
        ops.count_tokens(ids, torch.tensor([1], dtype=I32), 10)
    with pytest.raises(RuntimeError, match=CUDA_MSG):
        ops.count_tokens(ids, torch.tensor([1, 2], dtype=I32), 10)


def test_add_token_counts_messages() -> None:
    counts = torch.zeros(3, 10, dtype=I32)
    with pytest.raises(RuntimeError, match="counts must have dtype Int"):
        ops.add_token_counts(counts.float(), torch.zeros(3, dtype=I32))
    with pytest.raises(RuntimeError, match=r"tokens.shape\[0\] must be 3"):
        ops.add_token_counts(counts, torch.zeros(2, dtype=I32))
    with pytest.raises(RuntimeError, match=r"finished must have shape \[3\]"):
        ops.add_token_counts(counts, torch.zeros(3, dtype=I32), torch.zeros(2, dtype=I32))
    with pytest.raises(RuntimeError, match=CUDA_MSG):
        ops.add_token_counts(counts, torch.zeros(3, dtype=I32), None)


# ---- update_tokens ------------------------------------------------------------------------------
def state(rows=3, stride=8):
    return dict(tokens=torch.zeros(rows, dtype=I32), log_probs=None,
                cur_pos=torch.zeros(rows, dtype=I32), attn_len=torch.ones(rows, dtype=I32),
                finished=torch.zeros(rows, dtype=I32),
                output_ids=torch.zeros(rows, stride, dtype=I32),
                seq_lengths=torch.ones(rows, dtype=I32), end_ids=torch.tensor(2, dtype=I32))


def test_update_tokens_cpu_needs_gpu() -> None:
    with pytest.raises(RuntimeError, match=CUDA_MSG):
        ops.update_tokens(**state(), stop_words=words([[1, 2]]))


@pytest.mark.parametrize("over, message", [
    (dict(cur_pos=torch.zeros(3)), "cur_pos must have dtype Int"),
    (dict(finished=torch.zeros(4, dtype=I32)), r"finished.shape\[0\] must be 3"),
    (dict(attn_len=torch.zeros(3, 2, dtype=I32)[:, 0]), "attn_len must be contiguous"),
    (dict(output_ids=torch.zeros(3, dtype=I32)), "output_ids must be 2-dimensional"),
    (dict(end_ids=torch.zeros(2, dtype=I32)), r"end_ids must have shape \[3\]"),
    (dict(cum_log_probs=torch.zeros(3)), "log_probs is required when cum_log_probs"),
    (dict(cum_log_probs=torch.zeros(3, dtype=I32), log_probs=torch.zeros(3)),
     "cum_log_probs must have dtype Float"),
    (dict(output_log_probs=torch.zeros(3, 4), log_probs=torch.zeros(3), step=4),
     r"step must be in \[0, output_log_probs.shape\[1\] = 4\)"),
    (dict(stop_words=torch.zeros(2, 2, 3, dtype=I32)), r"stop_words must have shape \[2, L\]"),
    (dict(cur_pos=torch.tensor([0, -2, 0], dtype=I32)), r"cur_pos\[1\] = -2 breaks the rule"),
    (dict(input_lengths=torch.tensor([1, 9, 1], dtype=I32)),
     r"input_lengths\[1\] = 9 breaks the rule: 0 <= input_lengths <= output_ids.shape\[1\]"),
    (dict(input_lengths=torch.tensor([1, 2], dtype=I32)), r"input_lengths must have shape \[3\]"),
    (dict(cur_pos=torch.tensor([0, 8, 0], dtype=I32)), r"cur_pos\[1\] = 8 breaks the rule"),
    (dict(token_counts=torch.zeros(3, 5, dtype=I32), stop_words=words([[7]])),
     r"stop_words list 0: token id 7 at position 0 is outside \[0, 5\)"),
])
def test_update_tokens_messages(over, message) -> None:
    args = state()
    args.update(over)
    with pytest.raises(RuntimeError, match=message):
        ops.update_tokens(**args)
