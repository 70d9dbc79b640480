#!/usr/bin/env bash
# Runs a golden_regen build on 1 and 2 threads; skips (77) where the CPU lacks its instructions.
# Usage: test_golden_portability.sh GOLDEN_REGEN FIXTURES_DIR OUT_DIR "CPU_FLAG ..."
set -euo pipefail
bin=$1 fixtures=$2 out=$3
for flag in $4; do
  if ! grep -qw "$flag" /proc/cpuinfo; then
    echo "skipped: this CPU has no $flag, which $(basename "$bin") was built for"
    exit 77
  fi
done
rm -rf "$out"
for threads in 1 2; do
  OMP_NUM_THREADS=$threads "$bin" "$fixtures" "$out/threads-$threads"
done
rm -rf "$out"
