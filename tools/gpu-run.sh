#!/usr/bin/env bash
# The whole GPU run from a fresh checkout on a GPU machine: configure the `gpu` preset (sm_90),
# build, run the `gpu` label spread over every visible GPU (CTest resource groups; the
# tensor-parallel tests take several), the main job, the mutants' bisect table, `dsv32 judge`'s
# agreement with `dsv32 gpu` on every case and plan (tools/judge-agreement.sh) and the GPU
# benchmarks (plans side by side, at tp 1, 2 and 4 where the GPUs allow; per op against bandwidth
# floors, decode batches also with one stream; each launch's cost to a T = 1 step); logs and JSON
# go to OUTDIR. DSV32_GPU_RUN_CPU=1 also runs the `cpu` label there (CI runs it on every push;
# on a GPU machine it only costs time). NVLink multicast stays off.
# Usage: tools/gpu-run.sh OUTDIR (new or empty)
set -uo pipefail
outdir=${1:-out/gpu-run}
# A run's results must not mix with an earlier run's: refuse a folder that already holds files.
if [ -d "$outdir" ] && [ -n "$(ls -A "$outdir")" ]; then
  echo "gpu-run.sh: $outdir is not empty; give a new or empty folder (its files would mix with this run's)" >&2
  exit 2
fi
out=$(mkdir -p "$outdir" && cd "$outdir" && pwd)
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
# Which tree this run measured: the sources' digest (compare with tools/source-fingerprint.sh on
# the checkout that was sent; a copied tree's git metadata may be stale) and git's view of it.
{
  echo "sources sha256 $(bash tools/source-fingerprint.sh .)"
  echo "git HEAD $(git rev-parse HEAD 2>/dev/null || echo none), $(git status --porcelain 2>/dev/null | wc -l) paths differ from it"
} | tee "$out/source.txt"
logged "$out/build.log" cmake --preset gpu
logged "$out/build.log" cmake --build --preset gpu -j "$jobs"
# Eight single-GPU tests share a GPU at a time, each with its share of the host's cores; a
# tensor-parallel test takes whole GPUs.
export NCCL_NVLS_ENABLE=0
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
logged "$out/build.log" ./build/gpu/tools/dsv32 resource-spec --slots-per-gpu 8
export DSV32_GPU_BINDING_LOG="$out/gpu-binding.log"
: >"$DSV32_GPU_BINDING_LOG"
logged "$out/ctest-gpu.log" ctest --preset gpu -j "$((8 * (gpus > 0 ? gpus : 1)))" \
  --resource-spec-file "$PWD/build/gpu/ctest-resources.json" --output-junit "$out/ctest-gpu.xml"
unset DSV32_GPU_BINDING_LOG
echo "== GPU tests per device (CUDA_VISIBLE_DEVICES each test process got):" | tee -a "$out/ctest-gpu.log"
awk '{print $1}' "$out/gpu-binding.log" | sort | uniq -c | tee -a "$out/ctest-gpu.log"
if [ "${DSV32_GPU_RUN_CPU:-0}" = 1 ]; then
  logged "$out/ctest-cpu.log" ctest --test-dir build/gpu -L cpu -j "$jobs" --output-on-failure
fi
logged "$out/selfcheck.log" ./build/gpu/tools/dsv32 selfcheck --json "$out/selfcheck.json"
logged "$out/bisect.log" ./build/gpu/tools/dsv32 bisect --plan narrow \
  --all-mutants --json "$out/bisect.json"
# `dsv32 judge` of the GPU's own dump must give `dsv32 gpu`'s verdict (every case, every plan).
logged "$out/judge-agreement.log" bash tools/judge-agreement.sh ./build/gpu/tools/dsv32 \
  "$out/judge-agreement"
logged "$out/bench-gpu.log" ./build/gpu/tools/dsv32 bench-gpu --repeats 10 --json "$out/bench-gpu.json"
if [ "$gpus" -ge 2 ]; then
  logged "$out/bench-gpu-tp.log" ./build/gpu/tools/dsv32 bench-gpu --preset dsv32 --layers 2 \
    --tp 1 2 4 --repeats 10 --json "$out/bench-gpu-tp.json"
fi
logged "$out/bench-gpu-per-op.log" ./build/gpu/tools/dsv32 bench-gpu --per-op --context 8192 \
  --repeats 10 --json "$out/bench-gpu-per-op.json"
logged "$out/bench-gpu-per-op-decode.log" ./build/gpu/tools/dsv32 bench-gpu --per-op \
  --per-op-presets dsv32 --per-op-tokens 1 2 4 8 --context 8192 --repeats 10 \
  --json "$out/bench-gpu-per-op-decode.json"
# The same decode table with each layer's indexer on the main stream (docs/GPU.md, "Two
# streams"): what the second stream saves, in the same run.
logged "$out/bench-gpu-per-op-decode-one-stream.log" ./build/gpu/tools/dsv32 bench-gpu --per-op \
  --overlap off --per-op-presets dsv32 --per-op-tokens 1 2 4 8 --context 8192 --repeats 10 \
  --json "$out/bench-gpu-per-op-decode-one-stream.json"
# Device memory per plan and dispatch mode (docs/GPU.md, "Device memory per plan").
logged "$out/bench-gpu-memory.log" ./build/gpu/tools/dsv32 bench-gpu --memory \
  --json "$out/bench-gpu-memory.json"
logged "$out/bench-gpu-ablate.log" ./build/gpu/tools/dsv32 bench-gpu --ablate --preset dsv32 \
  --decode 1 --context 8192 --repeats 10 --json "$out/bench-gpu-ablate.json"
# The what-if benchmark (docs/PERFORMANCE.md, "What a boundary costs a framework"): every plan
# at 16 layers, the host spending each cost before every eager op (and, in the second sweep,
# 10 us before every graph launch too).
logged "$out/bench-gpu-whatif.log" ./build/gpu/tools/dsv32 bench-gpu \
  --dispatch-us 0 5 10 15 20 30 40 60 80 --repeats 5 --json "$out/bench-gpu-whatif.json"
logged "$out/bench-gpu-whatif-graph10.log" ./build/gpu/tools/dsv32 bench-gpu \
  --dispatch-us 0 5 10 15 20 30 40 60 80 --graph-launch-us 10 --repeats 5 \
  --json "$out/bench-gpu-whatif-graph10.json"
# The figures (PNG) from this run's JSON, where python3-matplotlib can be had.
logged "$out/plots.log" bash tools/plots.sh "$out"
grep -hE "tests passed|tests failed" "$out"/ctest-*.log
exit $status
