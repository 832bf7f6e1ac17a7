#!/usr/bin/env bash
# The one command to run on a GPU machine: build for the visible GPU with all cores, run the whole
# test suite (GPU tests included), the memory checker on a small run, and the benchmarks; print a
# short summary table last. Logs and JSON go to $OUT (default ./gpu_check_out).
#
#   bash tools/gpu_check.sh            # everything
#   GPU_CHECK_SKIP_BENCH=1 bash tools/gpu_check.sh
#   GPU_CHECK_PYTEST_ARGS="tests/gpu -x" bash tools/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu_check_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
status=0
summary=()
step() { echo; echo "=== $* ==="; }

step "device"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$OUT/device.txt"

step "build"
arch=$($PY -c "import torch; m,n=torch.cuda.get_device_capability(); print(f'{m}{n}')")
t0=$(date +%s)
if MAX_JOBS="$(nproc)" WARPFORMER_CUDA_ARCHS="${WARPFORMER_CUDA_ARCHS:-$arch}" \
   $PY -m pip install --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1; then
  summary+=("build (sm_${arch}, $(nproc) jobs)|ok|$(( $(date +%s) - t0 )) s")
else
  tail -50 "$OUT/build.log"; summary+=("build|FAILED|see build.log"); status=1
fi

if [ $status -eq 0 ]; then
  step "tests"
  # One pytest process per group, so that a crash in one group does not hide the others' results.
  if [ -n "${GPU_CHECK_PYTEST_ARGS:-}" ]; then groups=("${GPU_CHECK_PYTEST_ARGS}")
  else groups=("tests --ignore=tests/gpu" $(ls tests/gpu/test_*.py)); fi
  : >"$OUT/pytest.log"
  for g in "${groups[@]}"; do
    t0=$(date +%s)
    echo "--- pytest $g" | tee -a "$OUT/pytest.log"
    $PY -m pytest $g -q -p no:cacheprovider -rfE ${GPU_CHECK_PYTEST_EXTRA:-} >"$OUT/pytest.part" 2>&1
    rc=$?
    cat "$OUT/pytest.part" >>"$OUT/pytest.log"
    grep -E "^(FAILED|ERROR)|Fatal Python error|^tests/.*Error" "$OUT/pytest.part" | head -20
    line=$(grep -E "passed|failed|error" "$OUT/pytest.part" | tail -1)
    [ -z "$line" ] && line="$(grep -m1 -E 'Fatal Python error' "$OUT/pytest.part") (crashed)"
    summary+=("pytest ${g##*/}|$([ $rc -eq 0 ] && echo ok || echo FAILED)|${line} ($(( $(date +%s) - t0 )) s)")
    [ $rc -ne 0 ] && status=1
  done

  if [ -z "${GPU_CHECK_SKIP_SANITIZER:-}" ] && command -v compute-sanitizer >/dev/null; then
    step "compute-sanitizer memcheck"
    compute-sanitizer --tool memcheck --error-exitcode 9 \
        $PY -m pytest tests/gpu/test_elementwise.py tests/gpu/test_gpt_engine.py -q -p no:cacheprovider \
        -k "test_embedding_bad_ids or memcheck_small" \
        >"$OUT/memcheck.log" 2>&1
    rc=$?
    summary+=("memcheck|$([ $rc -eq 0 ] && echo clean || echo FAILED)|$(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)")
    [ $rc -ne 0 ] && { tail -30 "$OUT/memcheck.log"; status=1; }
  fi

  if [ -z "${GPU_CHECK_SKIP_BENCH:-}" ]; then
    step "benchmarks"
    $PY benchmarks/bench_kernels.py --json "$OUT/bench_kernels.json" 2>&1 | tee "$OUT/bench_kernels.md"
    [ ${PIPESTATUS[0]} -ne 0 ] && { summary+=("bench_kernels|FAILED|"); status=1; } \
                               || summary+=("bench_kernels|ok|bench_kernels.md")
  fi
fi

step "summary ($(head -1 "$OUT/device.txt"))"
printf '| step | result | detail |\n|---|---|---|\n'
for s in "${summary[@]}"; do echo "| ${s//|/ | } |"; done
if [ -f "$OUT/bench_kernels.md" ]; then
  grep -E "^\| (kernel|---|layer_norm|rms_norm|add_layer_norm|bias_act|gated_act|embedding) " \
      "$OUT/bench_kernels.md" | grep -E "kernel|---|float16" | head -9
fi
exit $status
