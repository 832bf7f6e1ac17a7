#!/usr/bin/env bash
# The README's test command (CI runs exactly this through .ci/run): on a fresh machine it creates
# .venv, installs the pinned dependencies from PyPI, builds the extension with nvcc for one CUDA
# architecture, lints, and runs the test suite. GPU tests skip with a reason when no GPU is
# visible. Extra arguments go to pytest. Knobs (WARPFORMER_TORCH, WARPFORMER_NO_APT, ...):
# tools/setup_env.sh.
#
#   bash tools/run_tests.sh                 # everything
#   bash tools/run_tests.sh -k embedding    # a subset
set -euo pipefail
cd "$(dirname "$0")/.."
WF_WHO=run_tests
# shellcheck source=tools/setup_env.sh
source tools/setup_env.sh

wf_need_nvcc
wf_system_packages "cmake and g++ build the extension, mpirun runs the multi-process tests" \
  cmake:cmake g++:g++ "mpirun:openmpi-bin libopenmpi-dev"
wf_python_deps
wf_build
PY="$WF_PY"

"$PY" -c "import warpformer, torch; print('run_tests: loaded', torch.ops.warpformer.layer_norm)"
echo "run_tests: ruff and clang-format (lint; fix C++ with: source tools/setup_env.sh;"\
     "$WF_VENV/bin/clang-format -i \$(wf_cxx_sources))"
"$PY" -m ruff check .
# shellcheck disable=SC2046  # one argument per file name (no spaces in the tree's names)
"$WF_VENV/bin/clang-format" --dry-run -Werror $(wf_cxx_sources)

set +e
"$PY" -m pytest tests -q -p no:cacheprovider "$@"
rc=$?
set -e
if [ $rc -eq 5 ]; then
  echo "run_tests: pytest collected no tests — the suite is missing or the filter matched nothing" >&2
  exit 1
fi
exit $rc
