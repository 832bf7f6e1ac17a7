"""Checks of a plan's source tensors, run before anything is written.

:func:`check_sources` compares the shape of every tensor a plan reads (from the safetensors header
or the mmap'd ``.bin``: no data is read) with the shape HF's own model class has for the same
``config.json``, built on the ``meta`` device (no memory, no weights); names HF does not know
(transformers 5 renames NeoX ``embed_out`` in memory) or sources without cheap shapes (Megatron,
whose shards are merged while reading) are not compared. It then runs each transform on ``meta``
tensors of the found shapes and compares the result with the format's shape, so a mis-shaped
tensor HF could not check still fails before the first file is written. The writer names the
sources the same way (:func:`describe_sources`) when a transform fails on real tensors.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from .errors import ConversionError
from .mapping import Plan

__all__ = ["check_sources", "describe_sources", "hf_parameter_shapes"]


def describe_sources(names: Sequence[str], shapes: Sequence[Sequence[int]],
                     where: Callable[[str], str]) -> str:
    """``'a' (shape [..], in FILE), ...`` for messages."""
    return ", ".join(f"{n!r} (shape {list(s)}, in {where(n)})"
                     for n, s in zip(names, shapes, strict=True))


def hf_parameter_shapes(root: Path) -> tuple[dict[str, tuple[int, ...]], str, str]:
    """``(shapes by state-dict name, base_model_prefix, class name)`` of the HF causal-LM model
    ``root/config.json`` describes, built on the ``meta`` device.

    Empty when transformers is not installed or cannot build the model from that config (remote
    code, an unknown model_type): the comparison is then skipped, the other checks still run.
    """
    try:
        import transformers
    except ImportError:
        return {}, "", ""
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # e.g. its bos/eos range warnings: we warn too
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = transformers.AutoConfig.from_pretrained(root)
            with torch.device("meta"):
                model = transformers.AutoModelForCausalLM.from_config(config)
    except Exception:  # anything HF refuses is left to our own checks, which name the problem
        return {}, "", ""
    finally:
        transformers.logging.set_verbosity(verbosity)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    return shapes, model.base_model_prefix, type(model).__name__


def check_sources(plan: Plan) -> None:
    """Raise :class:`ConversionError` if a source tensor of ``plan`` is missing or mis-shaped.

    Only for sources with ``shape(name)`` and ``where(name)`` (HF checkpoints); messages name the
    tensor, its file, the expected and the found shape.
    """
    source = plan.source
    if not hasattr(source, "shape"):
        return
    resolved: list[list[str]] = []
    for task in plan.tasks:
        names = []
        for alternatives in task.sources:
            options = alternatives.split("|")
            name = next((n for n in options if source.shape(n) is not None), None)
            if name is None:
                raise ConversionError(f"{source.root}: checkpoint lacks tensor {options[-1]!r} "
                                      f"(needed for {task.target})")
            names.append(name)
        resolved.append(names)

    expected, base, arch = hf_parameter_shapes(source.root)
    wrong = []
    for name in dict.fromkeys(n for names in resolved for n in names):
        want = expected.get(name) or expected.get(f"{base}.{name}")
        found = source.shape(name)
        if want is not None and want != found:
            wrong.append(f"{source.where(name)}: tensor {name!r} has shape {list(found)}, {arch} "
                         f"with this config.json expects {list(want)}")
    if wrong:
        more = f"\n(and {len(wrong) - 4} more)" if len(wrong) > 4 else ""
        raise ConversionError("\n".join(wrong[:4]) + more)

    for task, names in zip(plan.tasks, resolved, strict=True):
        spec = plan.specs.get(task.target)
        shapes = [source.shape(n) for n in names]
        try:
            built = task.transform(plan.config, *(torch.empty(s, device="meta") for s in shapes))
        except Exception:  # a transform meta tensors cannot run is checked on the real ones
            continue
        if spec is not None and tuple(built.shape) != spec.shape:
            raise ConversionError(
                f"tensor {task.target}: would be built with shape {list(built.shape)}, the "
                f"format expects {list(spec.shape)}; built from "
                f"{describe_sources(names, shapes, source.where)}")
