"""Shared writer: runs a :class:`~.mapping.Plan` into ``<out>/<tp>-gpu/``.

Each task reads its source tensors lazily, builds the full tensor, checks its shape against the
weight table, casts it and writes one file per rank (split tensors) or one file (replicated).
Everything goes to a temporary folder next to the output, which is renamed into place only after
every expected tensor has been written and checked, so an interrupted or failed run never leaves a
folder that looks valid. ``processes > 1`` runs tasks in a spawn-started process pool whose workers
each open the checkpoint themselves. A weight-only quantized plan (``plan.stored``) quantizes each
layer kernel whole, in the output dtype, before splitting its data and scales
(:func:`warpformer.weight_quant.quantize_kernel`).

The temporary folder's name carries the host and pid (``.<N>-gpu.tmp-<host>-<pid>-<random>``):
SIGTERM is turned into an exception so the cleanup runs, and a folder left by a killed run
(SIGKILL) is removed by the next conversion into the same folder once that pid provably no longer
runs on this host (:func:`remove_stale`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

# A module import, not a name import: weight_quant imports this package, so either may load first.
from warpformer import weight_quant
from warpformer.weights import DTYPES, STORAGE_DTYPES, WeightSpec, file_name, quantized_kernels

from .checks import describe_sources
from .errors import ConversionError
from .mapping import Plan, Task

__all__ = ["Summary", "remove_stale", "write_plan", "write_tensor"]


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
                 data_type: str, prefix: str = "model.") -> tuple[int, int]:
    """Write ``tensor`` (CPU, full shape ``spec.shape``) as ``spec.dtype`` (a quantized kernel's
    int8/uint8 files) or else ``data_type`` (``"fp32"``/``"fp16"``/``"bf16"``) into
    ``directory``, split for ``tp`` ranks.

    Returns ``(files, bytes)`` written.
    """
    if tuple(tensor.shape) != spec.shape:
        raise ConversionError(f"tensor {name}: built shape {list(tensor.shape)}, the format "
                              f"expects {list(spec.shape)}")
    tensor = tensor.to(STORAGE_DTYPES[spec.dtype or data_type])
    if spec.split_axis is None:
        pieces = [tensor] * (tp if spec.per_rank else 1)
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
            directory / file_name(name, spec, rank, prefix))
        total += array.nbytes
    return len(pieces), total


# --------------------------------------------------------------------------- workers
_STATE: dict[str, Any] = {}


def _init_worker(plan: Plan, directory: Path, tp: int, data_type: str,
                 pool_worker: bool = True) -> None:
    if pool_worker:  # P workers share the cores; the caller's own process keeps its threads
        torch.set_num_threads(1)
    kernels = {} if plan.stored is None else quantized_kernels(plan.config)
    _STATE.update(reader=plan.source.reader(), plan=plan, dir=directory, tp=tp, dtype=data_type,
                  kernels=kernels)


def _run_task(task: Task) -> list[tuple[str, int, int]]:
    plan: Plan = _STATE["plan"]
    reader = _STATE["reader"]
    spec = plan.specs.get(task.target)
    if spec is None:
        raise ConversionError(f"internal: no format entry for target {task.target}")
    names = [_resolve(reader, s) for s in task.sources]
    where = getattr(reader, "where", lambda name: "the checkpoint")
    tensors = []
    for name in names:
        try:
            tensors.append(reader.get(name))
        except ConversionError:
            raise
        except Exception as exc:  # e.g. merging Megatron shards of an unexpected shape
            raise ConversionError(f"tensor {task.target}: cannot read source {name!r} (in "
                                  f"{where(name)}): {type(exc).__name__}: {exc}") from None
    # Sources the pre-write check could not compare (Megatron, names HF does not know) fail
    # here; name them with their files and shapes rather than leave a reshape traceback.
    try:
        full = task.transform(plan.config, *tensors)
        problem = (None if tuple(full.shape) == spec.shape else
                   f"built shape {list(full.shape)}, the format expects {list(spec.shape)}")
    except ConversionError:
        raise
    except Exception as exc:
        problem = f"cannot build it: {type(exc).__name__}: {exc}"
    if problem is not None:
        raise ConversionError(f"tensor {task.target}: {problem}; built from "
                              f"{describe_sources(names, [t.shape for t in tensors], where)}")
    tensors = {task.target: full}
    axis = _STATE["kernels"].get(task.target)
    if axis is not None:  # quantize what an unquantized conversion would have written
        tensors = weight_quant.quantize_kernel(plan.config, task.target,
                                               full.to(DTYPES[_STATE["dtype"]]), axis)
    table = plan.stored or plan.specs
    return [(name, *write_tensor(_STATE["dir"], name, tensor, table[name], _STATE["tp"],
                                 _STATE["dtype"], plan.file_prefix))
            for name, tensor in tensors.items()]


def _resolve(reader: Any, source: str) -> str:
    """The name to read for ``source``: ``"a|b"`` names alternatives, the first present one."""
    names = source.split("|")
    return next((name for name in names[:-1] if name in reader), names[-1])


def _verify(plan: Plan, directory: Path, written: set[str], tp: int, data_type: str) -> None:
    table = plan.stored or plan.specs
    for name, spec in table.items():
        if name not in written:
            if spec.optional:
                continue
            raise ConversionError(f"internal: tensor {name} expected by the format was not "
                                  "written")
        ranks = range(tp) if spec.ranked else [0]
        expected = int(np.prod(spec.shard_shape(tp))) * STORAGE_DTYPES[spec.dtype or
                                                                        data_type].itemsize
        for rank in ranks:
            path = directory / file_name(name, spec, rank, plan.file_prefix)
            if not path.is_file() or path.stat().st_size != expected:
                raise ConversionError(f"{path}: written file is missing or not {expected} bytes")
    unknown = written - set(table)
    if unknown:
        raise ConversionError(f"internal: wrote tensors outside the format: {sorted(unknown)}")


def write_plan(plan: Plan, output_dir: str | os.PathLike[str], data_type: str = "fp32",
               processes: int = 1, force: bool = False, progress: bool = True) -> Summary:
    """Run ``plan`` and atomically create ``output_dir/<tp>-gpu``.

    Raises :class:`ConversionError` if that folder exists and ``force`` is false, or if
    ``output_dir`` is not a folder. On any failure, SIGTERM included, the temporary folder and
    the folders this call created are removed and nothing is left at the final path. Temporary
    folders of killed conversions into ``output_dir`` are removed first (:func:`remove_stale`).
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
    if out.exists() and not out.is_dir():
        raise ConversionError(f"--output-dir {out} exists and is not a directory")
    if final.exists() and not force:
        raise ConversionError(f"output directory {final} exists; pass --force to replace it")
    start = time.time()
    written: dict[str, tuple[int, int]] = {}
    created: list[Path] = []
    tmp: Path | None = None
    with _StopOnSigterm(f"conversion into {final}") as guard:
        try:
            _make_dirs(out, created)
            remove_stale(out)
            tmp = _make_temp(out, f".{tp}-gpu.tmp-")
            bar = _progress(len(plan.tasks), progress, plan.description)
            if processes == 1:
                _init_worker(plan, tmp, tp, data_type, pool_worker=False)
                for results in map(_run_task, plan.tasks):
                    written.update((name, (files, nbytes)) for name, files, nbytes in results)
                    bar.update(1)
            else:
                import multiprocessing as mp

                ctx = mp.get_context("spawn")
                # Leaving the block (SIGTERM's exception too) terminates and joins the workers
                # before the cleanup below removes the folder they write into.
                with ctx.Pool(processes, _init_worker, (plan, tmp, tp, data_type)) as pool:
                    for results in pool.imap_unordered(_run_task, plan.tasks):
                        written.update((name, (files, nbytes)) for name, files, nbytes in results)
                        bar.update(1)
            bar.close()
            _STATE.clear()
            _verify(plan, tmp, set(written), tp, data_type)
            plan.config.weight_data_type = data_type
            plan.config.to_ini(tmp / "config.ini")
            with guard.deferred():  # no SIGTERM between the renames: the old output would be lost
                if final.exists():
                    trash = _make_temp(out, f".{tp}-gpu.old-")
                    final.rename(trash / "old")
                    tmp.rename(final)
                    shutil.rmtree(trash, ignore_errors=True)
                else:
                    tmp.rename(final)
        except BaseException:
            guard.hold()  # a second SIGTERM must not cut the cleanup short
            _STATE.clear()
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            for folder in reversed(created):  # only if still empty: never what others put there
                try:
                    folder.rmdir()
                except OSError:
                    break
            raise
    return Summary(final, len(written), sum(f for f, _ in written.values()),
                   sum(b for _, b in written.values()), time.time() - start)


# --------------------------------------------------------------------------- folders, signals
_TEMP_NAME = re.compile(r"\.(\d+)-gpu\.(tmp|old)-(.+)-(\d+)-[a-z0-9_]+")


def _host() -> str:
    """This host's name as it appears in temporary folder names."""
    return re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "localhost"


def _umask() -> int:
    """The process umask, read without changing it where Linux reports it (/proc, 4.7+)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # elsewhere: set and restore (a brief, sane value meanwhile)
    os.umask(mask)
    return mask


def _make_dirs(out: Path, created: list[Path]) -> None:
    """Create ``out`` and its missing parents, appending each folder made here to ``created``."""
    missing = []
    folder = out
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for folder in reversed(missing):
        try:
            folder.mkdir()
        except FileExistsError:
            continue  # made by someone else meanwhile: not ours to remove
        except OSError as exc:
            raise ConversionError(f"cannot create output directory {folder}: "
                                  f"{exc.strerror or exc}") from None
        created.append(folder)


def _make_temp(out: Path, prefix: str) -> Path:
    """A new hidden folder ``out/<prefix><host>-<pid>-<random>`` with the umask's permissions
    (mkdtemp makes it 0700, and the rename into place would keep that)."""
    try:
        path = Path(tempfile.mkdtemp(prefix=f"{prefix}{_host()}-{os.getpid()}-", dir=out))
        os.chmod(path, 0o777 & ~_umask())
    except OSError as exc:
        raise ConversionError(f"cannot create a temporary folder in {out}: "
                              f"{exc.strerror or exc}") from None
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, as another user's process
        return True
    return True


def remove_stale(out: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporary (``.tmp-``) and ``--force`` trash (``.old-``) folders in ``out`` that
    killed conversions left, warning with each folder's name and size; returns those removed.

    A folder counts as dead only if its name carries this host and a pid that no longer exists
    (a live pid may be a conversion in progress, another host's may share the file system); any
    other name is not ours. A dead ``.old-`` folder is kept while ``<N>-gpu`` is missing: the kill
    fell between the two renames of ``--force``, and its ``old`` holds the previous output.
    """
    out = Path(out)
    try:
        entries = sorted(out.iterdir())
    except OSError:
        return []
    removed = []
    for path in entries:
        m = _TEMP_NAME.fullmatch(path.name)
        if m is None or m.group(3) != _host() or path.is_symlink() or not path.is_dir():
            continue
        pid = int(m.group(4))
        if pid <= 0 or pid == os.getpid() or _alive(pid):
            continue
        if m.group(2) == "old" and (path / "old").exists() and not (out / f"{m.group(1)}-gpu"
                                                                     ).exists():
            warnings.warn(f"{path} holds the previous {m.group(1)}-gpu output of a --force "
                          f"conversion (pid {pid}) killed while swapping it; kept", UserWarning,
                          stacklevel=2)
            continue
        size = sum(f.lstat().st_size for f in path.rglob("*") if not f.is_dir())
        shutil.rmtree(path, ignore_errors=True)
        warnings.warn(f"removed {path} ({size / 2**20:.1f} MiB), left by a conversion (pid {pid} "
                      "on this host) that no longer runs", UserWarning, stacklevel=2)
        removed.append(path)
    return removed


class _StopOnSigterm:
    """While active, SIGTERM raises :class:`ConversionError` in the main thread, so that
    :func:`write_plan`'s cleanup runs; the previous handler is restored on exit.

    Installed only in the main thread and only over the default action: SIG_IGN is respected,
    and a caller's own handler that raises gets the same cleanup from the ``except`` clause.
    """

    def __init__(self, what: str) -> None:
        self.what = what
        self.previous: Any = None
        self.holding = False
        self.pending = False

    def __enter__(self) -> _StopOnSigterm:
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL):
            self.previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.holding:
            self.pending = True
            return
        self.holding = True  # one exception only
        raise ConversionError(f"{self.what} stopped by SIGTERM")

    def hold(self) -> None:
        """From now on a SIGTERM only marks itself pending."""
        self.holding = True

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """A SIGTERM arriving inside the block raises once the block is done."""
        self.holding = True
        yield
        self.holding = False
        if self.pending:
            self.holding = True
            raise ConversionError(f"{self.what} stopped by SIGTERM (after the output was "
                                  "complete)")


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
