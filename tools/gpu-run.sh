#!/usr/bin/env bash
# The whole GPU run from a fresh checkout on a GPU machine: configure the `gpu` preset (sm_90),
# build, run the `gpu` label, the `cpu` label and the main job; logs and JSON go to OUTDIR.
# Usage: tools/gpu-run.sh OUTDIR
set -uo pipefail
out=$(mkdir -p "${1:-out/gpu-run}" && cd "${1:-out/gpu-run}" && pwd)
cd "$(dirname "$0")/.."
jobs=$(nproc)
status=0
# logged LOG CMD...: runs CMD, appends its output to LOG and the terminal, records failure.
logged() {
  local log=$1; shift
  echo "== $*" | tee -a "$log"
  "$@" 2>&1 | tee -a "$log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
}

# Packages a GPU image may lack (RapidCheck, CLI11, fmt, nlohmann-json) come unpacked in
# .deps/root (tools/gpu-deps.sh, run where apt works); the gpu preset searches there first.
{ nvidia-smi; nvcc --version; cmake --version | head -n1; } >"$out/machine.txt" 2>&1
logged "$out/build.log" cmake --preset gpu
logged "$out/build.log" cmake --build --preset gpu -j "$jobs"
logged "$out/ctest-gpu.log" ctest --preset gpu -j 1 --output-junit "$out/ctest-gpu.xml"
logged "$out/ctest-cpu.log" ctest --test-dir build/gpu -L cpu -j "$jobs" --output-on-failure
logged "$out/selfcheck.log" ./build/gpu/tools/dsv32 selfcheck --json "$out/selfcheck.json"
grep -hE "tests passed|tests failed" "$out"/ctest-*.log
exit $status
