# Set-up shared by the README's two commands (tools/main.sh, tools/run_tests.sh), sourced by them:
# Debian build tools, the .venv with the pinned dependencies, and the extension's build. Each step
# says what it does before doing it, and on failure prints the tool's own reason.
#
# Knobs: WARPFORMER_VENV (.venv), WARPFORMER_TORCH (the torch requirement, default torch==2.15.0,
# PyPI's default CUDA build), WARPFORMER_NO_APT=1 (never install Debian packages), MAX_JOBS (2),
# WARPFORMER_CUDA_ARCHS (90). Callers set WF_WHO to the name their messages start with.

WF_WHO="${WF_WHO:-setup}"
WF_VENV="${WARPFORMER_VENV:-.venv}"
WF_TORCH_SPEC="${WARPFORMER_TORCH:-torch==2.15.0}"
WF_PY="$WF_VENV/bin/python"
WF_LOG_DIR="${WF_LOG_DIR:-$WF_VENV/logs}"

wf_say() { echo "$WF_WHO: $*"; }
wf_err() { echo "$WF_WHO: $*" >&2; }

# nvcc compiles the extension (no GPU is needed to build); CUDA's default folder joins PATH.
wf_need_nvcc() {
  if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
    wf_err "nvcc not found. Install a CUDA toolkit (12.4+; 13.x tested) so the extension can" \
           "be compiled; a GPU is not needed to build."
    return 2
  fi
  export PATH="$PATH:/usr/local/cuda/bin"
}

# wf_system_packages WHY CMD:PKG... — install from Debian the packages of each missing command,
# announcing which, why and how to opt out first. Not root, or WARPFORMER_NO_APT=1: say what is
# missing and go on (what needs it then fails or skips with its own message).
wf_system_packages() {
  local why="$1"
  shift
  local missing=() pkgs=() item
  for item in "$@"; do
    if ! command -v "${item%%:*}" >/dev/null; then
      missing+=("${item%%:*}")
      # shellcheck disable=SC2206  # a command may need several packages, space separated
      pkgs+=(${item#*:})
    fi
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "${WARPFORMER_NO_APT:-0}" = 1 ]; then
    wf_err "missing ${missing[*]} ($why); WARPFORMER_NO_APT=1, so not installing the Debian" \
           "packages ${pkgs[*]}: install them yourself, or the steps needing them fail or skip."
    return 0
  fi
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    wf_err "missing ${missing[*]} ($why); not root or no apt-get, so not installing the Debian" \
           "packages ${pkgs[*]}: install them yourself, or the steps needing them fail or skip."
    return 0
  fi
  wf_say "missing ${missing[*]} ($why): installing the Debian packages ${pkgs[*]} with" \
         "apt-get (WARPFORMER_NO_APT=1 to skip this)"
  mkdir -p "$WF_LOG_DIR" 2>/dev/null || WF_LOG_DIR=/tmp
  local log="$WF_LOG_DIR/apt.log"
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}"; } \
      >"$log" 2>&1; then
    wf_err "apt-get could not install ${pkgs[*]}; its output ($log) ends:"
    tail -n 20 "$log" >&2
    return 1
  fi
}

# The venv and the pinned Python dependencies, once per torch requirement (a stamp file records
# it). pip's whole output goes to a log; on failure its reason is printed, with how to choose
# another torch build.
wf_python_deps() {
  [ -x "$WF_PY" ] || python3 -m venv "$WF_VENV" || { wf_err "python3 -m venv $WF_VENV failed"; return 1; }
  local stamp
  stamp="$WF_VENV/.deps-$(echo "$WF_TORCH_SPEC" | tr -c 'a-zA-Z0-9.' '_')-5"
  [ -f "$stamp" ] && return 0
  mkdir -p "$WF_LOG_DIR"
  local log="$WF_LOG_DIR/pip-install.log"
  wf_say "installing $WF_TORCH_SPEC and the test/build dependencies into $WF_VENV (log: $log)"
  if ! { "$WF_PY" -m pip install -q --upgrade pip setuptools wheel &&
         "$WF_PY" -m pip install "$WF_TORCH_SPEC" numpy "pytest>=7" ninja "cmake>=3.24" \
           "transformers>=4.40" "safetensors>=0.4" tqdm ruff "clang-format==23.1.5"; } \
      >"$log" 2>&1; then
    wf_err "pip could not install the dependencies. pip said:"
    # pip's reason without its per-index 'Location ... is ignored' noise.
    grep -v "^WARNING: Location '.*' is ignored" "$log" | tail -n 25 >&2
    wf_err "The torch requirement was '$WF_TORCH_SPEC'. To use another build, set" \
           "WARPFORMER_TORCH, e.g. WARPFORMER_TORCH='torch==2.14.1' (a pinned release) or" \
           "WARPFORMER_TORCH='torch>=2.11' (any release pip may install here), and run again."
    return 1
  fi
  if command -v mpicc >/dev/null; then "$WF_PY" -m pip install -q mpi4py >>"$log" 2>&1 || true; fi
  touch "$stamp"
}

# The C++/CUDA sources clang-format checks (.clang-format), for the lint step and for fixing.
wf_cxx_sources() {
  find csrc kernels -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) |
    LC_ALL=C sort
}

# Build the extension into the venv (editable install). The compile takes minutes: ninja's
# '[n/N] file' lines are shown as it goes, the whole output is logged, and a failure prints the
# log's end.
wf_build() {
  mkdir -p "$WF_LOG_DIR"
  local log="$WF_LOG_DIR/build.log" rc
  wf_say "building warpformer (MAX_JOBS=${MAX_JOBS:-2}, archs ${WARPFORMER_CUDA_ARCHS:-90};" \
         "a few minutes; log: $log)"
  set +e
  MAX_JOBS="${MAX_JOBS:-2}" WARPFORMER_CUDA_ARCHS="${WARPFORMER_CUDA_ARCHS:-90}" \
    "$WF_PY" -m pip install -v --no-build-isolation --no-deps -e . 2>&1 | tee "$log" |
    wf_build_progress
  rc=${PIPESTATUS[0]}
  set -e
  if [ "$rc" -ne 0 ]; then
    wf_err "build failed (pip exit $rc); the compiler's first errors, then the end of $log:"
    grep -m 20 -E ': (fatal )?error|Error [0-9]+|CMake Error' "$log" >&2
    grep -v "^WARNING: Location '.*' is ignored" "$log" | tail -n 15 >&2
    return 1
  fi
}

# Filter of the build's output: ninja's progress lines, shortened to '[n/N] file', and the build
# script's own '[warpformer]' lines.
wf_build_progress() {
  sed -u -n -E \
    -e 's#^[[:space:]]*(\[[0-9]+/[0-9]+\]).*[ /]([^ /]+)$#  \1 \2#p' \
    -e 's#^[[:space:]]*(\[warpformer\].*)#  \1#p'
}
