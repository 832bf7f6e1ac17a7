"""Properties of the built extension that keep it loadable beside stock PyTorch wheels."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import warpformer


def _ext_path() -> Path:
    return Path(warpformer._C.__file__)


@pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf not installed")
def test_libstdcxx_is_shared_not_embedded() -> None:
    """_C must use the process's libstdc++.so.6, not carry a static copy (a private copy of the
    locale state crashed on the first formatted error message on one toolchain)."""
    dyn = subprocess.run(["readelf", "-d", str(_ext_path())], capture_output=True, text=True,
                         check=True).stdout
    assert "libstdc++.so.6" in dyn, dyn
    syms = subprocess.run(["readelf", "--dyn-syms", "-W", str(_ext_path())], capture_output=True,
                          text=True, check=True).stdout
    defined_ostream = [ln for ln in syms.splitlines()
                       if "_ZNSo9_M_insert" in ln and " UND " not in ln]
    assert not defined_ostream, defined_ostream[:3]


def test_error_message_with_numbers_formats() -> None:
    """Formatting an integer into an error message is the path that crashed with a private
    libstdc++ copy."""
    import torch

    with pytest.raises(RuntimeError, match=r"num_heads must be in \[1, 65535\], got 0"):
        torch.ops.warpformer.alibi_slopes(0)


_IMPORT_EACH_FIRST = """
import importlib, pathlib, sys
import warpformer
root = pathlib.Path(warpformer.__file__).parent
names = sorted(".".join(("warpformer", *p.relative_to(root).with_suffix("").parts))
               for p in root.rglob("*.py") if p.stem not in ("__init__", "__main__"))
names += ["warpformer.converters", "warpformer.converters.writer"]
base = set(sys.modules)
failed = []
for name in names:
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed.append(f"{name}: {type(exc).__name__}: {exc}")
    for loaded in set(sys.modules) - base:  # the next module starts from the package alone
        del sys.modules[loaded]
print(len(names), "modules")
sys.exit("\\n".join(failed) or None)
"""


def test_every_module_imports_first() -> None:
    """Each module imports right after the package, before any other warpformer module: an
    import cycle (weight_quant -> converters -> writer -> weight_quant) broke ``import
    warpformer.models.gpt`` while the suite, which imported the modules in another order, passed."""
    import sys

    run = subprocess.run([sys.executable, "-c", _IMPORT_EACH_FIRST], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert int(run.stdout.split()[0]) > 20, run.stdout
