"""Shared writer: runs a :class:`~.mapping.Plan` into ``<out>/<tp>-gpu/``.

Each task reads its source tensors lazily, builds the full tensor, checks its shape against the
weight table, casts it and writes one file per rank (split tensors) or one file (replicated).
Everything goes to a temporary folder next to the output, which is renamed into place only after
every expected tensor has been written and checked, so an interrupted or failed run never leaves a
folder that looks valid. ``processes > 1`` runs tasks in a spawn-started process pool whose workers
each open the checkpoint themselves.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from warpformer.weights import DTYPES, WeightSpec, file_name

from .errors import ConversionError
from .mapping import Plan, Task

__all__ = ["Summary", "write_plan", "write_tensor"]


@dataclass
class Summary:
    """What a conversion wrote."""

    output_dir: Path
    tensors: int
    files: int
    bytes: int
    seconds: float

    def __str__(self) -> str:
        return (f"wrote {self.tensors} tensors ({self.files} files, {self.bytes / 2**20:.1f} MiB) "
                f"to {self.output_dir} in {self.seconds:.1f} s")


def write_tensor(directory: Path, name: str, tensor: torch.Tensor, spec: WeightSpec, tp: int,
                 data_type: str) -> tuple[int, int]:
    """Write ``tensor`` (CPU, full shape ``spec.shape``, any floating dtype) as ``data_type``
    (``"fp32"``/``"fp16"``/``"bf16"``) into ``directory``, split for ``tp`` ranks.

    Returns ``(files, bytes)`` written.
    """
    if tuple(tensor.shape) != spec.shape:
        raise ConversionError(f"tensor {name}: built shape {list(tensor.shape)}, the format "
                              f"expects {list(spec.shape)}")
    tensor = tensor.to(DTYPES[data_type])
    if spec.split_axis is None:
        pieces = [tensor]
    else:
        if tensor.shape[spec.split_axis] % tp:
            raise ConversionError(f"tensor {name}: axis {spec.split_axis} of shape "
                                  f"{list(tensor.shape)} is not divisible by tp={tp}")
        pieces = list(torch.chunk(tensor, tp, dim=spec.split_axis))
    total = 0
    for rank, piece in enumerate(pieces):
        piece = piece.contiguous()
        if piece.dtype == torch.bfloat16:
            array = piece.view(torch.int16).numpy()
        else:
            array = piece.numpy()
        array.astype(array.dtype.newbyteorder("<"), copy=False).tofile(
            directory / file_name(name, spec, rank))
        total += array.nbytes
    return len(pieces), total


# --------------------------------------------------------------------------- workers
_STATE: dict[str, Any] = {}


def _init_worker(plan: Plan, directory: Path, tp: int, data_type: str) -> None:
    torch.set_num_threads(1)
    _STATE.update(reader=plan.source.reader(), plan=plan, dir=directory, tp=tp, dtype=data_type)


def _run_task(task: Task) -> tuple[str, int, int]:
    plan: Plan = _STATE["plan"]
    reader = _STATE["reader"]
    spec = plan.specs.get(task.target)
    if spec is None:
        raise ConversionError(f"internal: no format entry for target {task.target}")
    tensors = [_get(reader, s) for s in task.sources]
    full = task.transform(plan.config, *tensors)
    files, nbytes = write_tensor(_STATE["dir"], task.target, full, spec, _STATE["tp"],
                                 _STATE["dtype"])
    return task.target, files, nbytes


def _get(reader: Any, source: str) -> torch.Tensor:
    """``reader.get(source)``; ``"a|b"`` names alternatives, the first present one is read."""
    names = source.split("|")
    for name in names[:-1]:
        if name in reader:
            return reader.get(name)
    return reader.get(names[-1])


def _verify(plan: Plan, directory: Path, written: set[str], tp: int, data_type: str) -> None:
    itemsize = torch.empty((), dtype=DTYPES[data_type]).element_size()
    for name, spec in plan.specs.items():
        if name not in written:
            if spec.optional:
                continue
            raise ConversionError(f"internal: tensor {name} expected by the format was not "
                                  "written")
        ranks = range(tp) if spec.split_axis is not None else [0]
        expected = int(np.prod(spec.shard_shape(tp))) * itemsize
        for rank in ranks:
            path = directory / file_name(name, spec, rank)
            if not path.is_file() or path.stat().st_size != expected:
                raise ConversionError(f"{path}: written file is missing or not {expected} bytes")
    unknown = written - set(plan.specs)
    if unknown:
        raise ConversionError(f"internal: wrote tensors outside the format: {sorted(unknown)}")


def write_plan(plan: Plan, output_dir: str | os.PathLike[str], data_type: str = "fp32",
               processes: int = 1, force: bool = False, progress: bool = True) -> Summary:
    """Run ``plan`` and atomically create ``output_dir/<tp>-gpu``.

    Raises :class:`ConversionError` if that folder exists and ``force`` is false; on any failure
    the temporary folder is removed and nothing is left at the final path.
    """
    if sys.byteorder != "little":
        raise ConversionError("the on-disk format is little-endian; big-endian hosts unsupported")
    if data_type not in DTYPES:
        raise ConversionError(f"--data-type must be one of {', '.join(DTYPES)}, got {data_type!r}")
    if processes < 1:
        raise ConversionError(f"--processes must be >= 1, got {processes}")
    tp = plan.config.tensor_para_size
    out = Path(output_dir)
    final = out / f"{tp}-gpu"
    if final.exists() and not force:
        raise ConversionError(f"output directory {final} exists; pass --force to replace it")
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{tp}-gpu.tmp-", dir=out))
    start = time.time()
    try:
        written: dict[str, tuple[int, int]] = {}
        bar = _progress(len(plan.tasks), progress, plan.description)
        if processes == 1:
            _init_worker(plan, tmp, tp, data_type)
            results = map(_run_task, plan.tasks)
            for name, files, nbytes in results:
                written[name] = (files, nbytes)
                bar.update(1)
        else:
            import multiprocessing as mp

            ctx = mp.get_context("spawn")
            with ctx.Pool(processes, _init_worker, (plan, tmp, tp, data_type)) as pool:
                for name, files, nbytes in pool.imap_unordered(_run_task, plan.tasks):
                    written[name] = (files, nbytes)
                    bar.update(1)
        bar.close()
        _STATE.clear()
        _verify(plan, tmp, set(written), tp, data_type)
        plan.config.weight_data_type = data_type
        plan.config.to_ini(tmp / "config.ini")
        if final.exists():
            trash = Path(tempfile.mkdtemp(prefix=f".{tp}-gpu.old-", dir=out))
            final.rename(trash / "old")
            tmp.rename(final)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            tmp.rename(final)
    except BaseException:
        _STATE.clear()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Summary(final, len(written), sum(f for f, _ in written.values()),
                   sum(b for _, b in written.values()), time.time() - start)


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(total: int, enabled: bool, desc: str) -> Any:
    if not enabled:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is optional: no bar
        return _NoBar()
    return tqdm(total=total, desc=desc or "converting", unit="tensor", file=sys.stderr)
