"""TorchScript: the scripted generator survives save and load in a new process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torchscript_generate.py"


def test_scripted_generator_saved_and_loaded_in_new_process():
    res = subprocess.run([sys.executable, str(EXAMPLE), "--self-test"], capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "self-test passed" in res.stdout
