"""torch.ops.warpformer.generation_options: the one place GptModel.decode's options dict is checked
and normalised (GptModel.decode itself, warpformer.GPT on either backend). CPU only."""

from __future__ import annotations

import pytest
import torch

import warpformer  # noqa: F401

B, V, END = 3, 96, 50
PER_ROW = {"end_id": torch.int32, "top_k": torch.int32, "top_p": torch.float32,
           "temperature": torch.float32, "repetition_penalty": torch.float32,
           "presence_penalty": torch.float32, "frequency_penalty": torch.float32,
           "min_length": torch.int32, "seed": torch.int64}
SCALARS = {"beam_width": (torch.int32, 1), "length_penalty": (torch.float32, 1.0),
           "diversity_rate": (torch.float32, 0.0), "return_log_probs": (torch.int32, 0),
           "return_cum_log_probs": (torch.int32, 0), "return_context_embeddings": (torch.int32, 0),
           "return_hidden_states": (torch.int32, 0), "memory_len": (torch.int32, 0),
           "session": (torch.int64, 0)}


def check(options: dict, batch: int = B) -> dict[str, torch.Tensor]:
    return torch.ops.warpformer.generation_options(
        {k: v if isinstance(v, torch.Tensor) else torch.tensor(v) for k, v in options.items()},
        batch, V, END)


def test_schema() -> None:
    schema = torch.ops.warpformer.generation_options.default._schema
    assert str(schema) == ("warpformer::generation_options(Dict(str, Tensor) options, int batch, "
                           "int vocab_size, int end_id) -> Dict(str, Tensor)")


def test_defaults() -> None:
    out = check({})
    assert set(out) == set(PER_ROW) | set(SCALARS)
    for key, dtype in PER_ROW.items():
        assert out[key].dtype == dtype and out[key].shape == (B,) and out[key].device.type == "cpu"
    assert out["end_id"].tolist() == [END] * B and out["top_k"].tolist() == [1] * B
    assert out["temperature"].tolist() == [1.0] * B and out["seed"].tolist() == [0] * B
    for key, (dtype, value) in SCALARS.items():
        assert out[key].dtype == dtype and out[key].dim() == 0 and out[key].item() == value


def test_values_are_normalised() -> None:
    given = {"top_k": torch.tensor([0, 5, 1024]),                     # int64 -> int32
             "top_p": torch.tensor(0.5, dtype=torch.float64),        # 0-d -> [B]
             "temperature": torch.tensor([0.7]),                     # one value -> [B]
             "min_length": torch.tensor([1, 2, 3], dtype=torch.int8),
             "seed": torch.tensor([2**40, 0, 7]),
             "end_id": torch.tensor([0, V - 1, 3], dtype=torch.int32),
             "bad_words": torch.tensor([[5, 6, 7], [2, 3, -1]]),     # shared [2, L]
             "stop_words": torch.tensor([[[5], [1]], [[6], [1]], [[7], [-1]]]),
             "beam_width": torch.tensor([1]), "return_log_probs": torch.tensor(True),
             "return_cum_log_probs": torch.tensor(2), "length_penalty": torch.tensor(0.5),
             "memory_len": torch.tensor(64), "return_context_embeddings": torch.tensor(True),
             "return_hidden_states": torch.tensor([3])}
    out = check(given)
    assert out["top_k"].dtype == torch.int32 and out["top_k"].tolist() == [0, 5, 1024]
    assert out["top_p"].tolist() == [0.5] * B and out["temperature"].dtype == torch.float32
    assert out["min_length"].dtype == torch.int32 and out["min_length"].tolist() == [1, 2, 3]
    assert out["seed"].tolist() == [2**40, 0, 7]
    assert out["bad_words"].dtype == torch.int32 and out["bad_words"].shape == (2, 3)
    assert out["stop_words"].shape == (B, 2, 1)
    assert out["return_log_probs"].item() == 1 and out["return_cum_log_probs"].item() == 2
    assert out["length_penalty"].item() == 0.5 and out["beam_width"].dim() == 0
    assert out["memory_len"].dtype == torch.int32 and out["memory_len"].item() == 64
    for flag in ("return_context_embeddings", "return_hidden_states"):  # flags: 0 or 1
        assert out[flag].dtype == torch.int32 and out[flag].dim() == 0 and out[flag].item() == 1
    # new tensors, never the caller's; and checking the result again changes nothing
    assert out["end_id"].data_ptr() != given["end_id"].data_ptr()
    again = torch.ops.warpformer.generation_options(out, B, V, END)
    assert set(again) == set(out) and all(torch.equal(again[k], out[k]) for k in out)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")
def test_usable_from_torchscript() -> None:
    @torch.jit.script
    def beams(options: dict[str, torch.Tensor]) -> int:
        return int(torch.ops.warpformer.generation_options(options, 2, 96, 0)["beam_width"])

    assert beams({"beam_width": torch.tensor(3)}) == 3


OPT = "GptModel.decode: option "


@pytest.mark.parametrize("options, message", [
    (dict(end_id=[1, V, 2]), f"'end_id' must be in [0, {V}), got {V} (row 1)"),
    (dict(end_id=-1), f"'end_id' must be in [0, {V}), got -1 (row 0)"),
    (dict(top_k=-1), "'top_k' must be in [0, 1024], got -1 (row 0)"),
    (dict(top_k=[1, 1, 1025]), "'top_k' must be in [0, 1024], got 1025 (row 2)"),
    (dict(top_k=2**32 + 1), "'top_k' must be a 32-bit integer, got 4294967297 (row 0)"),
    (dict(top_p=0.0), "'top_p' must be in (0, 1], got 0 (row 0)"),
    (dict(top_p=float("nan")), "'top_p' must be in (0, 1], got nan (row 0)"),
    (dict(temperature=0.0), "'temperature' must be finite and > 0, got 0 (row 0)"),
    (dict(temperature=float("inf")), "'temperature' must be finite and > 0, got inf (row 0)"),
    (dict(repetition_penalty=-1.0), "'repetition_penalty' must be finite and > 0, got -1 (row 0)"),
    (dict(presence_penalty=float("nan")), "'presence_penalty' must be finite, got nan (row 0)"),
    (dict(frequency_penalty=float("-inf")), "'frequency_penalty' must be finite, got -inf (row 0)"),
    (dict(min_length=-2), "'min_length' must be >= 0, got -2 (row 0)"),
    (dict(seed=-1), "'seed' must be >= 0, got -1 (row 0)"),
    (dict(beam_width=0), "'beam_width' (num_beams) must be in [1, 16], got 0"),
    (dict(beam_width=17), "'beam_width' (num_beams) must be in [1, 16], got 17"),
    (dict(beam_width=2, top_k=[1, 0, 1]),
     "'top_k' must be 1 (greedy; do_sample=False) when 'beam_width' (num_beams) > 1, got 0 "
     "(row 1)"),
    (dict(beam_width=2, stop_words=[[5], [1]]),
     "'stop_words' is not supported when 'beam_width' (num_beams) > 1"),
    (dict(length_penalty=float("nan")), "'length_penalty' must be finite, got nan"),
    (dict(diversity_rate=torch.tensor(1e300, dtype=torch.float64)),  # inf as a float
     "'diversity_rate' must be finite, got 1e+300"),
    (dict(return_cum_log_probs=3), "'return_cum_log_probs' must be 0, 1 or 2, got 3"),
    (dict(memory_len=-4), "'memory_len' must be >= 0 (0: no window) and below 2^31, got -4"),
    (dict(memory_len=2**31), "'memory_len' must be >= 0 (0: no window) and below 2^31, got "
                             "2.14748e+09"),
    (dict(memory_len=[1, 2, 3]), "'memory_len' must be a single value, got shape [3]"),
    (dict(beam_width=2, return_hidden_states=1),
     "'return_hidden_states' is not supported when 'beam_width' (num_beams) > 1 (beams are "
     "reordered every step)"),
    (dict(session=3, return_context_embeddings=True),
     "'return_context_embeddings' cannot be combined with 'session' (the prompt pass skips the "
     "positions the session's cache holds)"),
    (dict(return_hidden_states=0.5), "'return_hidden_states' must be an integer tensor, got Float"),
    (dict(return_context_embeddings=[1, 0]),
     "'return_context_embeddings' must be a single value, got shape [2]"),
    # dtypes and shapes
    (dict(top_k=1.0), "'top_k' must be an integer tensor, got Float"),
    (dict(min_length=True), "'min_length' must be an integer tensor, got Bool"),
    (dict(beam_width=2.0), "'beam_width' (num_beams) must be an integer tensor, got Float"),
    (dict(return_log_probs=0.5), "'return_log_probs' must be an integer tensor, got Float"),
    (dict(temperature=True), "'temperature' must be a real tensor, got Bool"),
    (dict(top_p=[0.5, 0.5]), "'top_p' must be a scalar or have one value per row (3), got shape "
                             "[2]"),
    (dict(seed=[[1, 2, 3]]), "'seed' must be a scalar or have one value per row (3), got shape "
                             "[1, 3]"),
    (dict(length_penalty=[1.0, 2.0]), "'length_penalty' must be a single value, got shape [2]"),
    # FT word lists
    (dict(bad_words=[[5.0], [1.0]]), "'bad_words' must be an integer tensor, got Float"),
    (dict(bad_words=[[[5], [1]]] * 2),
     "'bad_words' must have shape [2, L] or [3, 2, L] (FT format: token ids, then end offsets), "
     "got [2, 2, 1]"),
    (dict(stop_words=torch.zeros(2, 0, dtype=torch.int32)), "'stop_words' is empty"),
    (dict(stop_words=[[5, 6], [2, 1]]),
     "'stop_words' offsets must increase and stay <= L (2), got 1 at 1"),
    (dict(bad_words=[[5, 6], [3, -1]]),
     "'bad_words' offsets must increase and stay <= L (2), got 3 at 0"),
    (dict(bad_words=[[5, V], [2, -1]]),
     f"'bad_words' token {V} is outside the vocabulary [0, {V})"),
])
def test_each_rule_names_the_argument(options, message) -> None:
    with pytest.raises(RuntimeError) as exc:
        check(options)
    assert str(exc.value) == OPT + message


def test_unknown_options_and_arguments() -> None:
    with pytest.raises(RuntimeError, match=r"^GptModel.decode: unknown option 'num_beams'; known "
                                           r"options: end_id, top_k, .*, return_cum_log_probs, "
                                           r"return_context_embeddings, return_hidden_states, "
                                           r"memory_len, session, prompt_table$"):
        check({"num_beams": 2})
    with pytest.raises(RuntimeError, match=r"batch and vocab_size must be >= 1, got 0 and 96"):
        check({}, batch=0)
