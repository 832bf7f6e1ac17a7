"""Lazy readers of HuggingFace checkpoint folders.

A :class:`HfCheckpoint` lists the tensors of ``model.safetensors`` / ``pytorch_model.bin``, single
or sharded with an index json, and reads one tensor at a time. For safetensors the header is
parsed and checked here and each tensor is read on demand with one positioned read of exactly its
bytes; that keeps a worker's resident memory near the tensor it is converting (a memory map would
instead keep every page it touched resident, inflating RSS to the file size). ``.bin`` files are
loaded with ``mmap=True`` (lazy too, but their touched pages count as resident). Headers and sizes
are validated up front so truncated or corrupt files fail with a message naming the file.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .errors import ConversionError

__all__ = ["HfCheckpoint", "read_safetensors_header"]

_SAFE_NAMES = ("model.safetensors",)
_BIN_NAMES = ("pytorch_model.bin",)
_ST_DTYPE_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2,
                   "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
_ST_TORCH = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
             "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
             "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """Parse and check a safetensors header: ``{name: {"dtype", "shape", "data_offsets"}}``.

    Raises :class:`ConversionError` naming ``path`` if the header does not parse or the file is
    shorter than the data it declares (truncated).
    """
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ConversionError(f"{path}: safetensors header does not parse (file has "
                                  f"{size} bytes, too short for the 8-byte header length)")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8 or n > 100 * 2**20:
            raise ConversionError(f"{path}: safetensors header does not parse (declared header "
                                  f"length {n} bytes, file has {size} bytes)")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
    except (UnicodeDecodeError, ValueError) as exc:
        raise ConversionError(f"{path}: safetensors header does not parse: {exc}") from None
    header.pop("__metadata__", None)
    end = 0
    base = 8 + n
    for name, info in header.items():
        try:
            begin, stop = (int(x) for x in info["data_offsets"])
            count = 1
            for d in info["shape"]:
                count *= int(d)
            itemsize = _ST_DTYPE_SIZES[info["dtype"]]
        except (KeyError, TypeError, ValueError):
            raise ConversionError(f"{path}: safetensors header does not parse: bad entry for "
                                  f"tensor {name!r}: {info!r}") from None
        if stop - begin != count * itemsize:
            raise ConversionError(f"{path}: safetensors header does not parse: tensor {name!r} "
                                  f"spans {stop - begin} bytes, shape needs {count * itemsize}")
        info["data_start"] = base + begin
        end = max(end, stop)
    if 8 + n + end > size:
        raise ConversionError(f"{path}: truncated: the header declares {8 + n + end} bytes, "
                              f"the file has {size}")
    return header


@dataclass(frozen=True)
class HfCheckpoint:
    """A HuggingFace checkpoint folder; picklable so worker processes can reopen it.

    ``files`` maps each tensor name to the file holding it; ``entries`` its safetensors header
    entry (for ``.bin``: only ``{"shape"}``); built by :meth:`open`.
    """

    root: Path
    files: dict[str, str]
    fmt: str  # "safetensors" or "bin"
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)  # safetensors headers

    @classmethod
    def open(cls, root: str | os.PathLike[str]) -> HfCheckpoint:
        """Index the checkpoint under ``root`` (validating headers/shards; reads no tensor data).

        safetensors is preferred when both formats are present.
        """
        root = Path(root)
        for fmt, names in (("safetensors", _SAFE_NAMES), ("bin", _BIN_NAMES)):
            for name in names:
                index = root / f"{name}.index.json"
                if index.is_file():
                    return cls._from_index(root, index, fmt)
                if (root / name).is_file():
                    entries = cls._scan(root / name, fmt)
                    return cls(root, dict.fromkeys(entries, name), fmt, entries)
        raise ConversionError(
            f"{root}: no model.safetensors, pytorch_model.bin or their sharded index json found"
        )

    @classmethod
    def _from_index(cls, root: Path, index: Path, fmt: str) -> HfCheckpoint:
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ConversionError(f"{index}: not a valid index json ({exc})") from None
        files: dict[str, str] = {}
        entries: dict[str, dict[str, Any]] = {}
        for shard in sorted(set(weight_map.values())):
            path = root / shard
            if not path.is_file():
                raise ConversionError(f"missing checkpoint shard {path} (listed in {index.name})")
            found = cls._scan(path, fmt)
            entries.update(found)
            files.update(dict.fromkeys(found, shard))
        for tensor, shard in weight_map.items():
            if tensor not in files:
                raise ConversionError(f"{root / shard}: tensor {tensor!r} listed in {index.name} "
                                      "is not in the shard (truncated or wrong file?)")
        return cls(root, files, fmt, entries)

    @staticmethod
    def _scan(path: Path, fmt: str) -> dict[str, dict[str, Any]]:
        if fmt == "safetensors":
            return read_safetensors_header(path)
        # The mmap'd tensors know their shapes without reading data; keep only those.
        return {k: {"shape": list(getattr(t, "shape", ()))} for k, t in _load_bin(path).items()}

    def keys(self) -> list[str]:
        """Every tensor name in the checkpoint."""
        return list(self.files)

    def shape(self, name: str) -> tuple[int, ...] | None:
        """Stored shape of tensor ``name`` (from the header; no data read), ``None`` if absent."""
        info = self.entries.get(name)
        return None if info is None else tuple(int(d) for d in info["shape"])

    def where(self, name: str) -> str:
        """The file holding tensor ``name`` (for messages)."""
        return str(self.root / self.files[name]) if name in self.files else str(self.root)

    def reader(self) -> TensorReader:
        """A reader that opens files lazily (one per process)."""
        return TensorReader(self)


def _load_bin(path: Path) -> dict[str, torch.Tensor]:
    try:
        try:
            sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise
            sd = torch.load(path, map_location="cpu", weights_only=True)  # legacy, non-zip
    except Exception as exc:  # torch raises RuntimeError / UnpicklingError / EOFError ...
        raise ConversionError(f"{path}: cannot read PyTorch checkpoint (truncated or corrupt?): "
                              f"{type(exc).__name__}: {exc}") from None
    if not isinstance(sd, dict):
        raise ConversionError(f"{path}: expected a state dict, got {type(sd).__name__}")
    return sd


class TensorReader:
    """Reads tensors of a :class:`HfCheckpoint`, keeping files open."""

    def __init__(self, ckpt: HfCheckpoint) -> None:
        self.ckpt = ckpt
        self._open: dict[str, Any] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.ckpt.files

    def where(self, name: str) -> str:
        """The file holding tensor ``name`` (for messages)."""
        return self.ckpt.where(name)

    def get(self, name: str) -> torch.Tensor:
        """The tensor ``name`` on CPU with its stored shape and dtype (for ``.bin``, a view of the
        mapped file: do not modify)."""
        shard = self.ckpt.files.get(name)
        if shard is None:
            raise ConversionError(f"{self.ckpt.root}: checkpoint lacks tensor {name!r}")
        handle = self._open.get(shard)
        if handle is None:
            path = self.ckpt.root / shard
            handle = open(path, "rb") if self.ckpt.fmt == "safetensors" else _load_bin(path)
            self._open[shard] = handle
        if self.ckpt.fmt == "bin":
            return handle[name]
        info = self.ckpt.entries[name]
        dtype = _ST_TORCH.get(info["dtype"])
        if dtype is None:
            raise ConversionError(f"{handle.name}: tensor {name!r} has unsupported dtype "
                                  f"{info['dtype']}")
        begin, stop = info["data_offsets"]
        buf = bytearray(stop - begin)
        view, done = memoryview(buf), 0
        while done < len(buf):  # one read returns at most ~2 GiB on Linux
            got = os.preadv(handle.fileno(), [view[done:]], info["data_start"] + done)
            if got <= 0:
                raise ConversionError(f"{handle.name}: truncated while reading tensor {name!r}")
            done += got
        if not buf:
            return torch.empty(info["shape"], dtype=dtype)
        return torch.frombuffer(buf, dtype=dtype).reshape(info["shape"])
