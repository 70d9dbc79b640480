#!/usr/bin/env bash
# The whole GPU run from a fresh checkout on a GPU machine: configure the `gpu` preset (sm_90),
# build, run the `gpu` label, the main job, the mutants' bisect table and the GPU benchmarks (plans side by side; per op
# against bandwidth floors); logs and JSON go to OUTDIR. DSV32_GPU_RUN_CPU=1 also runs the `cpu`
# label there (CI runs it on every push; on a GPU machine it only costs time).
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
if [ "${DSV32_GPU_RUN_CPU:-0}" = 1 ]; then
  logged "$out/ctest-cpu.log" ctest --test-dir build/gpu -L cpu -j "$jobs" --output-on-failure
fi
logged "$out/selfcheck.log" ./build/gpu/tools/dsv32 selfcheck --json "$out/selfcheck.json"
logged "$out/bisect.log" ./build/gpu/tools/dsv32 bisect --case mutant-bait --plan narrow \
  --all-mutants --json "$out/bisect.json"
logged "$out/bench-gpu.log" ./build/gpu/tools/dsv32 bench-gpu --repeats 10 --json "$out/bench-gpu.json"
logged "$out/bench-gpu-per-op.log" ./build/gpu/tools/dsv32 bench-gpu --per-op --context 8192 \
  --repeats 10 --json "$out/bench-gpu-per-op.json"
grep -hE "tests passed|tests failed" "$out"/ctest-*.log
exit $status
