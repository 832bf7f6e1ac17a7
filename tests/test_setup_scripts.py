"""The README commands' set-up steps (tools/setup_env.sh, sourced by tools/main.sh and
tools/run_tests.sh): pip's reason on a failed install, the build's progress lines, and the
announced, switchable Debian installs. Each test runs the shell functions against fake
``python``/``apt-get`` programs, so nothing is installed or built."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SETUP = ROOT / "tools" / "setup_env.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _run(call: str, env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f"set -euo pipefail; source {SETUP}; {call}"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARPFORMER_")}
    env.update(WARPFORMER_VENV=str(tmp_path / "venv"), WF_WHO="t", **extra)
    return env


def test_pip_failure_prints_pips_reason_and_how_to_choose_torch(tmp_path):
    # A pip that refuses the pin the way a constraint file makes it (the words are pip's own).
    _script(tmp_path / "venv" / "bin" / "python", """
case "$*" in
  *"--upgrade pip"*) exit 0 ;;
esac
echo "WARNING: Location 'file:///opt/pypi/simple/torch/' is ignored: it is neither a file nor a \
directory."
echo "ERROR: Cannot install torch==9.9.9 because these package versions have conflicting \
dependencies."
echo "The conflict is caused by:"
echo "    The user requested torch==9.9.9"
echo "    The user requested (constraint) torch<=2.14.1"
exit 1
""")
    res = _run("wf_python_deps", _env(tmp_path, WARPFORMER_TORCH="torch==9.9.9"))
    assert res.returncode != 0
    assert "The user requested (constraint) torch<=2.14.1" in res.stderr
    assert "WARPFORMER_TORCH" in res.stderr and "'torch==9.9.9'" in res.stderr
    assert "is ignored" not in res.stderr  # pip's index noise is left out
    assert not list((tmp_path / "venv").glob(".deps-*"))  # no stamp: the next run retries


def test_pip_success_writes_the_stamp_once(tmp_path):
    calls = tmp_path / "calls"
    _script(tmp_path / "venv" / "bin" / "python", f'echo "$*" >> {calls}\n')
    env = _env(tmp_path, WARPFORMER_TORCH="torch==1.2.3")
    assert _run("wf_python_deps", env).returncode == 0
    assert "torch==1.2.3" in calls.read_text()
    calls.unlink()
    assert _run("wf_python_deps", env).returncode == 0
    assert not calls.exists()  # stamped: nothing reinstalled


def test_build_shows_ninja_progress_and_the_log_on_failure(tmp_path):
    _script(tmp_path / "venv" / "bin" / "python", """
echo "Running command pip subprocess"
echo "  [warpformer] CUDA archs 90, 2 jobs, release"
echo "  [1/3] Building CUDA object CMakeFiles/_C.dir/kernels/gemv.cu.o"
echo "  [2/3] Building CXX object CMakeFiles/_C.dir/csrc/core/gemm.cpp.o"
echo "  -- some cmake chatter"
if [ -n "${FAIL_BUILD:-}" ]; then echo "kernels/norms.cu(12): error: boom"; exit 1; fi
echo "  [3/3] Linking CXX shared module python/warpformer/_C.so"
""")
    ok = _run("wf_build", _env(tmp_path))
    assert ok.returncode == 0, ok.stderr
    lines = ok.stdout.splitlines()
    assert "  [1/3] gemv.cu.o" in lines and "  [3/3] _C.so" in lines
    assert any("[warpformer] CUDA archs" in line for line in lines)
    assert "cmake chatter" not in ok.stdout
    bad = _run("wf_build", _env(tmp_path, FAIL_BUILD="1"))
    assert bad.returncode != 0
    assert "build failed" in bad.stderr and "error: boom" in bad.stderr


def _bin_without(tmp_path: Path, *missing: str) -> str:
    """A PATH holding the tools the set-up needs, stand-ins for cmake, g++ and mpirun (only their
    presence is asked), minus ``missing``, plus a fake apt-get that logs its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "tail", "mkdir", "grep", "cat", "env"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    _script(bin_dir / "id", "echo 0\n")  # root: the install path runs whoever runs the test
    for tool in ("cmake", "g++", "mpirun"):
        if tool not in missing:
            _script(bin_dir / tool, "exit 0\n")
    _script(bin_dir / "apt-get", f'echo "apt-get $*" >> {tmp_path / "apt.log"}\n')
    return str(bin_dir)


def test_debian_install_is_announced_with_its_reason_before_it_runs(tmp_path):
    env = _env(tmp_path, PATH=_bin_without(tmp_path, "cmake", "mpirun"))
    res = _run('wf_system_packages "to build" cmake:cmake g++:g++ '
               '"mpirun:openmpi-bin libopenmpi-dev"', env)
    assert res.returncode == 0, res.stderr
    assert "missing cmake mpirun (to build)" in res.stdout
    assert "cmake openmpi-bin libopenmpi-dev" in res.stdout
    assert "WARPFORMER_NO_APT=1" in res.stdout
    log = (tmp_path / "apt.log").read_text()
    assert "install -y -qq cmake openmpi-bin libopenmpi-dev" in log


def test_debian_install_can_be_turned_off(tmp_path):
    env = _env(tmp_path, PATH=_bin_without(tmp_path, "cmake"), WARPFORMER_NO_APT="1")
    res = _run('wf_system_packages "to build" cmake:cmake g++:g++', env)
    assert res.returncode == 0
    assert not (tmp_path / "apt.log").exists()
    assert "missing cmake" in res.stderr and "WARPFORMER_NO_APT=1" in res.stderr


def test_nothing_missing_installs_nothing(tmp_path):
    env = _env(tmp_path, PATH=_bin_without(tmp_path))
    res = _run('wf_system_packages "to build" cmake:cmake g++:g++', env)
    assert res.returncode == 0 and res.stdout == "" and res.stderr == ""
    assert not (tmp_path / "apt.log").exists()


@pytest.mark.parametrize("script", ["tools/main.sh", "tools/run_tests.sh"])
def test_readme_commands_use_the_shared_setup(script):
    text = (ROOT / script).read_text()
    assert "source tools/setup_env.sh" in text
    assert "pip install -q \"$TORCH_SPEC\"" not in text  # the hidden-reason install is gone
