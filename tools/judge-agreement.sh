#!/usr/bin/env bash
# On a GPU machine: `dsv32 judge` of `dsv32 gpu --dump` gives `dsv32 gpu`'s verdict, for every
# committed case under every plan. Prints a line per run and a summary; exit 1 on any
# disagreement (or a run that could not be judged), 0 when all agree.
# Usage: tools/judge-agreement.sh DSV32_TOOL SCRATCH_DIR
set -uo pipefail
tool=$1
scratch=$2
mkdir -p "$scratch"
cd "$(dirname "$0")/.."
plans="eager breakable-eager wide narrow narrow-copy full full-and-piecewise"
runs=0 agree=0 passes=0
for golden in fixtures/*.h5; do
  case=$(basename "$golden" .h5)
  for plan in $plans; do
    dump="$scratch/$case-$plan.h5"
    "$tool" gpu "$golden" --plan "$plan" --dump "$dump" >"$scratch/$case-$plan.gpu.log" 2>&1
    gpu_rc=$?
    "$tool" judge "$dump" --golden "$golden" >"$scratch/$case-$plan.judge.log" 2>&1
    judge_rc=$?
    runs=$((runs + 1))
    verdict=disagree
    if [ "$gpu_rc" = "$judge_rc" ] && [ "$gpu_rc" -le 1 ]; then
      verdict=agree
      agree=$((agree + 1))
      [ "$gpu_rc" = 0 ] && passes=$((passes + 1))
    fi
    printf '%-28s %-16s gpu %s judge %s %s\n' "$case" "$plan" "$gpu_rc" "$judge_rc" "$verdict"
    rm -f "$dump"
  done
done
echo "judge-agreement: $agree of $runs runs agree ($passes pass under both)"
[ "$agree" = "$runs" ]
