"""Build script: setuptools drives CMake, which compiles warpformer._C.

Knobs (environment variables):
  WARPFORMER_CUDA_ARCHS  CMake CUDA architectures, e.g. "90" or "80;90" (default: the visible
                         GPU's compute capability, else 90).
  MAX_JOBS               parallel compile jobs (default: number of CPUs).
  WARPFORMER_DEBUG=1     debug build (-O0 -g, device -lineinfo), also asserts kept.
  WARPFORMER_BUILD_DIR   where CMake builds (default: build/<python tag>).
  WARPFORMER_CMAKE_ARGS  extra CMake arguments (space separated), e.g. -DCMAKE_CXX_FLAGS=-g.

PyTorch is taken from the running interpreter, so build with `pip install --no-build-isolation`
to compile against the torch you will run with (the C++ ABI must match exactly).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def _default_cuda_archs() -> str:
    import torch

    try:
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(0)
            return f"{major}{minor}"
    except Exception:  # a broken driver must not break the build
        pass
    return "90"


def _nvidia_dirs() -> tuple[list[str], list[str]]:
    """Include and library folders of the nvidia-* pip packages that torch's wheel installs."""
    incs, libs = [], []
    for site in sys.path:
        base = Path(site) / "nvidia"
        if not base.is_dir():
            continue
        for sub in sorted(base.iterdir()):
            if (sub / "include").is_dir():
                incs.append(str(sub / "include"))
            if (sub / "lib").is_dir():
                libs.append(str(sub / "lib"))
    return incs, libs


def _torch_cxx_standard() -> str:
    """The C++ standard torch's own extension builder uses: the extension must be compiled with
    the same one, since some torch classes change layout with the language level (seen: a C++20
    build against torch 2.11, itself C++17, crashed reading Tensor::sizes())."""
    from torch.utils import cpp_extension

    text = Path(cpp_extension.__file__).read_text()
    return "20" if "-std=c++20" in text else "17"


def _loaded_libstdcxx() -> str:
    """Path of the libstdc++.so.6 this process (with torch imported) runs on, or ''.

    The extension links it explicitly: some toolchains (seen: a /opt/gcc g++ on the GPU machine)
    link libstdc++ statically by default, and a second, uninitialised copy of the iostream/locale
    machinery inside _C crashed the first time an error message formatted a number."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if "libstdc++.so" in path and os.path.isfile(path):
                    return path
    except OSError:
        pass
    return ""


class CMakeExtension(Extension):
    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        import torch
        from torch.utils import cpp_extension

        out_path = Path(self.get_ext_fullpath(ext.name)).resolve()
        py_tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
        build_dir = Path(os.environ.get("WARPFORMER_BUILD_DIR", ROOT / "build" / py_tag))
        build_dir.mkdir(parents=True, exist_ok=True)
        debug = os.environ.get("WARPFORMER_DEBUG", "0") not in ("", "0")
        archs = os.environ.get("WARPFORMER_CUDA_ARCHS") or _default_cuda_archs()
        jobs = os.environ.get("MAX_JOBS") or str(os.cpu_count() or 1)
        nv_incs, nv_libs = _nvidia_dirs()
        torch_lib = str(Path(torch.__file__).parent / "lib")

        args = [
            f"-S{ROOT}",
            f"-B{build_dir}",
            f"-DCMAKE_BUILD_TYPE={'Debug' if debug else 'Release'}",
            f"-DWARPFORMER_CUDA_ARCHS={archs}",
            f"-DWARPFORMER_TORCH_INCLUDE_DIRS={';'.join(cpp_extension.include_paths())}",
            f"-DWARPFORMER_TORCH_LIB_DIR={torch_lib}",
            f"-DWARPFORMER_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            f"-DWARPFORMER_CXX_STANDARD={_torch_cxx_standard()}",
            f"-DWARPFORMER_PYTHON_INCLUDE_DIR={sysconfig.get_paths()['include']}",
            f"-DWARPFORMER_EXT_SUFFIX={sysconfig.get_config_var('EXT_SUFFIX')}",
            f"-DWARPFORMER_NVIDIA_INCLUDE_DIRS={';'.join(nv_incs)}",
            f"-DWARPFORMER_NVIDIA_LIB_DIRS={';'.join(nv_libs)}",
            f"-DWARPFORMER_OUTPUT_DIR={out_path.parent}",
            f"-DWARPFORMER_LIBSTDCXX={_loaded_libstdcxx()}",
        ]
        if os.environ.get("WARPFORMER_CMAKE_ARGS"):
            args += os.environ["WARPFORMER_CMAKE_ARGS"].split()
        if shutil.which("ninja"):
            args.append("-GNinja")
        print(f"[warpformer] CUDA archs {archs}, {jobs} jobs, {'debug' if debug else 'release'}")
        subprocess.check_call(["cmake", *args])
        subprocess.check_call(["cmake", "--build", str(build_dir), "--parallel", jobs])
        built = glob.glob(str(out_path.parent / ("_C" + sysconfig.get_config_var("EXT_SUFFIX"))))
        if not built:
            raise RuntimeError(f"CMake finished but {out_path} was not produced")
        if Path(built[0]).resolve() != out_path:
            shutil.copyfile(built[0], out_path)


setup(
    packages=["warpformer", "warpformer.models", "warpformer.converters"],
    package_dir={"warpformer": "python/warpformer", "warpformer.converters": "converters"},
    ext_modules=[CMakeExtension("warpformer._C")],
    cmdclass={"build_ext": CMakeBuild},
)
