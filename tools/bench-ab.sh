#!/usr/bin/env bash
# A/B of two source trees on one GPU machine: builds `dsv32` of BASE (another checkout of this
# project, e.g. an earlier commit's `git archive`) and of this tree with the gpu preset, then
# runs the same `bench-gpu` command on each in turn, ROUNDS times, alternating (A B A B ...), so
# that clock and thermal drift fall on both alike. Each run's JSON goes to OUTDIR/{a,b}-N.json;
# tools/bench_ab_summary.py OUTDIR prints the per-op medians side by side with their ratio.
# Usage: tools/bench-ab.sh BASE OUTDIR ROUNDS -- BENCH-GPU-ARGS...
set -euo pipefail
if [ $# -lt 4 ] || [ "$4" != "--" ]; then
  echo "usage: tools/bench-ab.sh BASE OUTDIR ROUNDS -- BENCH-GPU-ARGS..." >&2
  exit 2
fi
base=$(cd "$1" && pwd)
out=$(mkdir -p "$2" && cd "$2" && pwd)
rounds=$3
shift 4
cd "$(dirname "$0")/.."
here=$PWD
# The base tree finds the packages of tools/gpu-deps.sh where its preset looks: its own .deps.
if [ -d .deps/root ] && [ ! -e "$base/.deps" ]; then ln -s "$here/.deps" "$base/.deps"; fi
for tree in "$base" "$here"; do
  (cd "$tree" && cmake --preset gpu >/dev/null && cmake --build --preset gpu -j "$(nproc)" --target dsv32) \
    >>"$out/build.log" 2>&1 || { echo "bench-ab: building $tree failed (see $out/build.log)" >&2; exit 1; }
done
{
  echo "a: $base ($(bash "$here/tools/source-fingerprint.sh" "$base"))"
  echo "b: $here ($(bash tools/source-fingerprint.sh .))"
  echo "command: bench-gpu $*"
} | tee "$out/trees.txt"
for ((i = 1; i <= rounds; ++i)); do
  for side in a b; do
    tree=$base
    [ "$side" = b ] && tree=$here
    echo "== round $i/$rounds, $side"
    "$tree/build/gpu/tools/dsv32" bench-gpu "$@" --json "$out/$side-$i.json" >"$out/$side-$i.log" 2>&1 ||
      { echo "bench-ab: $side round $i failed (see $out/$side-$i.log)" >&2; exit 1; }
  done
done
