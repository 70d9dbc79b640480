#!/usr/bin/env bash
# The main job: set up, build, and print the verdict table for the default scenario.
# Usage: tools/main-job.sh [--json FILE]   (extra arguments go to `dsv32 selfcheck`)
# On a machine without a GPU only the CPU parts are built (the `cpu` preset): compiling the CUDA
# library there would take most of the job's time for rows that cannot run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install-deps.sh
preset=default
if ! { [ -e /dev/nvidiactl ] || nvidia-smi -L >/dev/null 2>&1; }; then
  preset=cpu
  echo "main-job: no GPU on this machine: building the CPU parts only (preset cpu); the GPU rows" \
       "run on a GPU machine (tools/gpu-run.sh)"
fi
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" --target dsv32
# The default scenario must keep pruning (rows with more candidates than K): a guard on the case.
"./build/$preset/tools/dsv32" selfcheck --require "pruned>=1" "$@"
