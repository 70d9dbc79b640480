#!/usr/bin/env bash
# tools/gpu-run.sh must refuse an output folder that already holds files (an earlier run's
# results would mix with its own) before it builds or writes anything.
# Usage: test_gpu_run_refuses.sh GPU_RUN_SCRIPT WORKDIR
set -u
script=$1 dir=$2
rm -rf "$dir" && mkdir -p "$dir" && echo old >"$dir/bench-gpu.log"
err=$(bash "$script" "$dir" 2>&1 >/dev/null)
rc=$?
[ "$rc" -eq 2 ] || { echo "exit code $rc, expected 2"; exit 1; }
case $err in
  *"is not empty"*) ;;
  *) echo "no message naming the problem: '$err'"; exit 1 ;;
esac
[ "$(ls -A "$dir")" = "bench-gpu.log" ] || { echo "the folder changed: $(ls -A "$dir")"; exit 1; }
[ "$(cat "$dir/bench-gpu.log")" = old ] || { echo "the old file changed"; exit 1; }
echo "refused: $err"
