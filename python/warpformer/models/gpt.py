"""Loading a converted GPT-family checkpoint into the C++ engine.

:func:`load_gpt_model` reads one rank's shards of a converted directory (``<out>/<tp>-gpu``,
see docs/FORMAT.md) straight onto the GPU and returns the TorchScript custom class
``torch.classes.warpformer.GptModel``, which owns the weights, the KV cache and the generation
loop. The class can be stored on a ``torch.jit.script``-ed module and pickled with it.
"""

from __future__ import annotations

import os
import warnings

import torch

from warpformer.config import GptConfig
from warpformer.options import EngineOptions, model_options_json
from warpformer.weights import load_weights, read_config

_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float16`` -> ``"fp16"`` (the engine's spelling); raises ValueError otherwise."""
    if dtype not in _DTYPE_NAMES:
        raise ValueError(
            f"dtype must be torch.float32, torch.float16 or torch.bfloat16, got {dtype}")
    return _DTYPE_NAMES[dtype]


def default_max_seq_len(config: GptConfig) -> int:
    """The position table's length for learned positions, else 2048."""
    return config.max_pos_seq_len if config.has_positional_encoding else 2048


def build_gpt_model(config: GptConfig, weights: dict[str, torch.Tensor], *,
                    dtype: torch.dtype = torch.float16, max_batch: int = 8,
                    max_seq_len: int | None = None, tensor_para_rank: int = 0,
                    pipeline_para_size: int = 1, pipeline_para_rank: int = 0,
                    options: EngineOptions | None = None) -> torch.ScriptObject:
    """Create ``torch.classes.warpformer.GptModel`` from a config and this rank's weights.

    Args:
        config: the model's :class:`~warpformer.config.GptConfig`.
        weights: ``{name: tensor}`` as returned by :func:`warpformer.weights.load_weights`
            (per-rank shapes, e.g. QKV ``[h, 3, h/tp]``), CUDA tensors of any floating dtype
            (converted to ``dtype``); a weight-only quantized config's kernels as stored
            (:func:`warpformer.weights.stored_specs`: int8 / uint8 data and zero points).
        dtype: inference dtype (fp32, fp16 or bf16).
        max_batch: the largest batch a call may use.
        max_seq_len: the largest input + output length (default: :func:`default_max_seq_len`).
        tensor_para_rank, pipeline_para_size, pipeline_para_rank: this rank's place in the
            parallel grid (``weights`` must be that rank's shards).
        options: :class:`~warpformer.options.EngineOptions` (CUDA graphs, prefill group size,
            GEMM tuning file; default: all defaults).

    A quantized config needs ``dtype`` float16 or bfloat16 and an unquantized head
    (``quant_lm_head`` off); the engine refuses others naming the rule.
    """
    limit = max_seq_len if max_seq_len is not None else default_max_seq_len(config)
    text = model_options_json(options or EngineOptions(), max_batch=max_batch, max_seq_len=limit,
                              dtype=dtype_name(dtype), tensor_para_rank=tensor_para_rank,
                              pipeline_para_size=pipeline_para_size,
                              pipeline_para_rank=pipeline_para_rank)
    model = torch.classes.warpformer.GptModel(config.to_json(), weights, text)
    note = model.gemm_tuning_note()
    if note and model.gemm_tuned_shapes() == 0:
        warnings.warn(note, stacklevel=2)
    return model


def load_gpt_model(model_dir: str | os.PathLike[str], *, dtype: torch.dtype = torch.float16,
                   device: str | torch.device = "cuda", max_batch: int = 8,
                   max_seq_len: int | None = None, tensor_para_rank: int = 0,
                   pipeline_para_size: int = 1, pipeline_para_rank: int = 0,
                   options: EngineOptions | None = None) -> torch.ScriptObject:
    """Load a converted directory into ``torch.classes.warpformer.GptModel`` on ``device``.

    The class's methods: ``forward(input_ids int32 [B, S], input_lengths int32 [B]) -> logits
    [B, S, V]`` (in ``dtype``) and ``generate(input_ids, input_lengths, output_len, end_id=-1) ->
    (output_ids int32 [B, 1, S + output_len], sequence_lengths int32 [B, 1])``; the other
    arguments are those of :func:`build_gpt_model`.
    """
    config = read_config(model_dir)
    weights = load_weights(model_dir, tp_rank=tensor_para_rank, pp_rank=pipeline_para_rank,
                           pipeline_para_size=pipeline_para_size, dtype=dtype, device=device)
    return build_gpt_model(config, weights, dtype=dtype, max_batch=max_batch,
                           max_seq_len=max_seq_len, tensor_para_rank=tensor_para_rank,
                           pipeline_para_size=pipeline_para_size,
                           pipeline_para_rank=pipeline_para_rank, options=options)
