#!/usr/bin/env bash
# The README's main command: on a fresh machine, set up .venv exactly like tools/run_tests.sh
# (pinned torch from PyPI, build the extension with nvcc; tools/setup_env.sh), then run
# `warpformer demo`: a small random-weight GPT-2-shaped model is built locally, converted, used to
# generate from a prompt, and evaluated on the bundled LAMBADA sample against HF transformers
# (accuracy, agreement, speedup). With no GPU visible the demo runs the plain-PyTorch reference
# backend on CPU. Extra arguments go to `warpformer demo` (e.g. --model-dir HF_CHECKPOINT).
#
#   bash tools/main.sh
#   bash tools/main.sh --model-dir /models/gpt2 --max-samples 500
set -euo pipefail
cd "$(dirname "$0")/.."
WF_WHO=main
# shellcheck source=tools/setup_env.sh
source tools/setup_env.sh

wf_python_deps
# Build the extension unless an importable build is already there (WARPFORMER_REBUILD=1 forces).
if [ "${WARPFORMER_REBUILD:-0}" = 1 ] || ! "$WF_PY" -c "import warpformer" >/dev/null 2>&1; then
  wf_need_nvcc
  wf_system_packages "cmake and g++ build the extension" cmake:cmake g++:g++
  wf_build
fi

exec "$WF_PY" -m warpformer demo "$@"
