"""Checkpoint converters (installed as ``warpformer.converters``).

``convert(input_dir, output_dir, tensor_para_size)`` detects the source (HF ``config.json``
``architectures``, or Megatron ``mp_rank_*`` folders), builds that family's declarative plan and
writes ``output_dir/<tp>-gpu/``. :data:`REGISTRY` maps an architecture name to the module that
converts it; a module provides ``build_plan``. New families (T5, BART) register with
:func:`register`. ``weight_quant`` (GPT family) writes weight-only int8/int4 kernels with their
scales (:mod:`.quantize`, ``docs/FORMAT.md``).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from types import ModuleType
from typing import Any

from warpformer.config import ConfigError, GptConfig, QuantScheme
from warpformer.weights import stored_specs

from .checks import check_sources
from .errors import ConversionError
from .mapping import Plan, read_hf_config
from .writer import Summary, write_plan

__all__ = ["REGISTRY", "ConversionError", "Summary", "convert", "detect", "register",
           "supported_architectures", "MEGATRON"]

MEGATRON = "Megatron-LM GPT"
REGISTRY: dict[str, ModuleType] = {}

# HF model_type -> architecture, for config.json files without "architectures".
_MODEL_TYPES = {"gpt2": "GPT2LMHeadModel", "opt": "OPTForCausalLM", "bloom": "BloomForCausalLM",
                "gptj": "GPTJForCausalLM", "gpt_neox": "GPTNeoXForCausalLM",
                "t5": "T5ForConditionalGeneration", "mt5": "MT5ForConditionalGeneration",
                "bart": "BartForConditionalGeneration", "mbart": "MBartForConditionalGeneration",
                "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                "qwen2": "Qwen2ForCausalLM"}


def register(module: ModuleType) -> None:
    """Register ``module`` for each name in its ``ARCHITECTURES``."""
    for name in module.ARCHITECTURES:
        REGISTRY[name] = module


def supported_architectures() -> list[str]:
    """Registered architecture names, sorted."""
    return sorted(REGISTRY)


def detect(input_dir: str | os.PathLike[str]) -> tuple[str, dict[str, Any] | None]:
    """``(architecture, hf_config or None)`` of the checkpoint in ``input_dir``.

    Raises :class:`ConversionError` naming the architecture and the supported ones if it is not
    registered.
    """
    from . import megatron

    root = Path(input_dir)
    if not root.is_dir():
        raise ConversionError(f"input directory {root} does not exist")
    if (root / "config.json").is_file():
        hf = read_hf_config(root)
        archs = hf.get("architectures") or [_MODEL_TYPES.get(hf.get("model_type", ""), "")]
        arch = archs[0] or f"model_type={hf.get('model_type')!r}"
    elif megatron.checkpoint_dir(root) is not None:
        arch, hf = MEGATRON, None
    else:
        raise ConversionError(f"{root}: neither a HF checkpoint (config.json) nor a Megatron "
                              "checkpoint (mp_rank_* folders)")
    if arch not in REGISTRY:
        raise ConversionError(f"unsupported architecture {arch!r} in {root}; supported: "
                              f"{', '.join(supported_architectures())}")
    return arch, hf


def build_plan(input_dir: str | os.PathLike[str], tensor_para_size: int,
               data_type: str = "fp32", allow_unsafe_pickle: bool = False,
               weight_quant: QuantScheme | None = None) -> Plan:
    """The conversion plan (config, expected tensors, tasks) for ``input_dir``, its source
    tensors checked (:func:`~.checks.check_sources`) so that a bad one fails before any writing.
    ``weight_quant``: quantize the layers' linear kernels (and the head if the scheme says so)."""
    arch, hf = detect(input_dir)
    module = REGISTRY[arch]
    if tensor_para_size < 1:
        raise ConversionError(f"--tensor-para-size must be >= 1, got {tensor_para_size}")
    if hf is None:
        plan = module.build_plan(Path(input_dir), tensor_para_size, data_type,
                                 allow_unsafe_pickle=allow_unsafe_pickle)
    else:
        plan = module.build_plan(Path(input_dir), hf, tensor_para_size, data_type)
    if weight_quant is not None:
        _quantize_plan(plan, arch, weight_quant, data_type)
    check_sources(plan)
    return plan


def _quantize_plan(plan: Plan, arch: str, scheme: QuantScheme, data_type: str) -> None:
    """Make ``plan`` write ``scheme``'s files; a tied head asked for becomes its own task."""
    if not isinstance(plan.config, GptConfig):
        raise ConversionError(f"--weight-quant is implemented for the GPT family only; {arch} "
                              "converts unquantized")
    if data_type not in ("fp16", "bf16"):
        raise ConversionError(f"--weight-quant {scheme.mode} needs --data-type fp16 or bf16 (the "
                              f"compute dtype, which the scales are stored in), got {data_type}: "
                              "quantizing into an fp32 model is not supported")
    try:
        plan.config = plan.config.with_quant(scheme)
        plan.stored = stored_specs(plan.config)
    except ConfigError as exc:
        raise ConversionError(f"--weight-quant {scheme.mode}: {exc}") from None
    targets = {task.target for task in plan.tasks}
    if scheme.lm_head and "lm_head.weight" not in targets:
        wte = next(task for task in plan.tasks if task.target == "wte")
        plan.tasks.append(dataclasses.replace(wte, target="lm_head.weight"))


def convert(input_dir: str | os.PathLike[str], output_dir: str | os.PathLike[str],
            tensor_para_size: int = 1, data_type: str = "fp32", processes: int = 1,
            force: bool = False, progress: bool = False,
            allow_unsafe_pickle: bool = False,
            weight_quant: QuantScheme | str | None = None) -> Summary:
    """Convert ``input_dir`` into ``output_dir/<tensor_para_size>-gpu/``; returns a summary.

    ``weight_quant``: ``"int8"``, ``"int4"`` or a :class:`~warpformer.config.QuantScheme` (group
    size, zero points, head) to write weight-only quantized kernels (``data_type`` fp16/bf16)."""
    try:
        scheme = QuantScheme.parse(weight_quant)
    except ConfigError as exc:
        raise ConversionError(f"--weight-quant: {exc}") from None
    plan = build_plan(input_dir, tensor_para_size, data_type, allow_unsafe_pickle, scheme)
    return write_plan(plan, output_dir, data_type, processes, force, progress)


def _register_builtin() -> None:
    from . import hf_bart, hf_bloom, hf_gpt2, hf_gptj, hf_gptneox, hf_llama, hf_opt, hf_t5, megatron

    for module in (hf_gpt2, hf_opt, hf_bloom, hf_gptj, hf_gptneox, hf_llama, hf_t5, hf_bart,
                   megatron):
        register(module)


_register_builtin()
