"""The conversion cache: a HF checkpoint given where warpformer needs a converted one
(``warpformer demo --model-dir``, ``warpformer generate --model``) is converted once and reused.

Where: ``$WARPFORMER_CACHE``, else ``$XDG_CACHE_HOME/warpformer``, else ``~/.cache/warpformer``.
One folder per (checkpoint's absolute path, the modification times of its ``config.json`` and
``generation_config.json``, on-disk data type, :data:`CONVERTED_LAYOUT`), named ``<checkpoint
folder name>-<data type>-<hash>``, holding one ``<tp>-gpu`` folder per tensor-parallel size. The
converter writes each ``<tp>-gpu`` folder atomically (a temporary folder renamed when complete),
so an interrupted conversion leaves no half-written cache entry.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["cache_root", "cache_dir", "convert_cached"]


def _print(msg: str) -> None:
    print(msg, flush=True)


def cache_root() -> Path:
    """The cache folder (see the module docstring); not created here."""
    return Path(os.environ.get("WARPFORMER_CACHE",
                               Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                               / "warpformer"))


# Bumped when a converter starts writing something the engine reads (2: extra_end_ids), so that
# a folder cached by an older converter is not reused.
CONVERTED_LAYOUT = 2


def cache_dir(model_dir: Path, data_type: str) -> Path:
    """The cache folder of HF checkpoint ``model_dir`` converted to ``data_type``."""
    times = [(model_dir / f).stat().st_mtime_ns if (model_dir / f).exists() else 0
             for f in ("config.json", "generation_config.json")]
    stamp = f"{model_dir.resolve()}:{times[0]}:{data_type}:{times[1]}:{CONVERTED_LAYOUT}"
    key = hashlib.sha1(stamp.encode()).hexdigest()[:12]
    return cache_root() / f"{model_dir.resolve().name}-{data_type}-{key}"


def convert_cached(hf_dir: Path, out: Path, data_type: str, tensor_para_size: int = 1, *,
                   say: Callable[[str], None] = _print) -> Path:
    """``out/<tensor_para_size>-gpu``: reused when it holds a ``config.ini``, else converted from
    ``hf_dir`` now; ``say`` reports which (and the conversion's time)."""
    from warpformer.converters import convert

    final = out / f"{tensor_para_size}-gpu"
    if (final / "config.ini").is_file():
        say(f"using the converted checkpoint cached in {final}")
        return final
    t0 = time.perf_counter()
    convert(hf_dir, out, tensor_para_size=tensor_para_size, data_type=data_type)
    say(f"converted {hf_dir} -> {final} ({data_type}) in {time.perf_counter() - t0:.1f} s")
    return final
