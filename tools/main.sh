#!/usr/bin/env bash
# The README's main command: on a fresh machine, set up .venv exactly like tools/run_tests.sh
# (pinned torch from PyPI, build the extension with nvcc), then run `warpformer demo`: a small
# random-weight GPT-2-shaped model is built locally, converted, used to generate from a prompt,
# and evaluated on the bundled LAMBADA sample against HF transformers (accuracy, agreement,
# speedup). With no GPU visible the demo runs the plain-PyTorch reference backend on CPU.
# Extra arguments go to `warpformer demo` (e.g. --model-dir HF_CHECKPOINT for a real model).
#
#   bash tools/main.sh
#   bash tools/main.sh --model-dir /models/gpt2 --max-samples 500
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${WARPFORMER_VENV:-.venv}"
TORCH_SPEC="${WARPFORMER_TORCH:-torch==2.15.0}"   # PyPI's default CUDA build (cu132)

[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY="$VENV/bin/python"
# Same dependency set and stamp as tools/run_tests.sh, so the two scripts share one venv.
stamp="$VENV/.deps-$(echo "$TORCH_SPEC" | tr -c 'a-zA-Z0-9.' '_')-4"
if [ ! -f "$stamp" ]; then
  echo "main: installing dependencies into $VENV"
  "$PY" -m pip install -q --upgrade pip setuptools wheel
  "$PY" -m pip install -q "$TORCH_SPEC" numpy "pytest>=7" ninja "cmake>=3.24" \
      "transformers>=4.40" "safetensors>=0.4" tqdm ruff
  touch "$stamp"
fi

# Build the extension unless an importable build is already there (WARPFORMER_REBUILD=1 forces).
if [ "${WARPFORMER_REBUILD:-0}" = 1 ] || ! "$PY" -c "import warpformer" >/dev/null 2>&1; then
  if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
    echo "main: nvcc not found. Install a CUDA toolkit (12.4+; 13.x tested) so the extension" \
         "can be compiled; a GPU is not needed to build or to run the demo." >&2
    exit 2
  fi
  export PATH="$PATH:/usr/local/cuda/bin"
  if ! command -v cmake >/dev/null || ! command -v g++ >/dev/null; then
    echo "main: installing build tools from Debian (cmake, g++)"
    apt-get update -qq && apt-get install -y -qq cmake g++ >/dev/null
  fi
  echo "main: building warpformer (MAX_JOBS=${MAX_JOBS:-2}, archs ${WARPFORMER_CUDA_ARCHS:-90})"
  MAX_JOBS="${MAX_JOBS:-2}" WARPFORMER_CUDA_ARCHS="${WARPFORMER_CUDA_ARCHS:-90}" \
    "$PY" -m pip install -q --no-build-isolation --no-deps -e . \
    || { echo "main: build failed" >&2; exit 1; }
fi

exec "$PY" -m warpformer demo "$@"
