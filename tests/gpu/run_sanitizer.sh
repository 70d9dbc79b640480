#!/usr/bin/env bash
# Runs a GPU test binary under compute-sanitizer: run_sanitizer.sh TOOL BINARY GTEST_FILTER
# Exit 77 (ctest: skipped) when there is no GPU or no compute-sanitizer.
set -u
tool=$1 bin=$2 filter=$3
cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
[ -n "$cs" ] || { echo "skipped: compute-sanitizer not found"; exit 77; }
nvidia-smi -L >/dev/null 2>&1 || { echo "skipped: no GPU visible"; exit 77; }
exec "$cs" --tool "$tool" --error-exitcode 1 "$bin" --gtest_filter="$filter"
