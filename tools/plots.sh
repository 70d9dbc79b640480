#!/usr/bin/env bash
# The figures of docs/ from a GPU run's JSON: installs python3-matplotlib when missing (apt), then
# runs tools/plot_bench.py on whichever of bench-gpu-whatif.json, bench-gpu-per-op-decode.json
# and bench-gpu-memory.json RUNDIR holds; the PNGs go to FIGDIR (default RUNDIR).
# Usage: tools/plots.sh RUNDIR [FIGDIR]   (exit 0 with a note when matplotlib cannot be had)
set -euo pipefail
run=$1
figs=${2:-$1}
cd "$(dirname "$0")/.."
py=/usr/bin/python3
if ! "$py" -c "import matplotlib" 2>/dev/null; then
  if ! bash tools/install-deps.sh >/dev/null 2>&1 || ! "$py" -c "import matplotlib" 2>/dev/null; then
    echo "plots: python3-matplotlib is not installed and cannot be installed here; run" \
      "tools/plots.sh on a machine with apt" >&2
    exit 0
  fi
fi
args=()
[ -f "$run/bench-gpu-whatif.json" ] && args+=(--whatif "$run/bench-gpu-whatif.json")
[ -f "$run/bench-gpu-per-op-decode.json" ] && args+=(--per-op "$run/bench-gpu-per-op-decode.json" --preset dsv32)
[ -f "$run/bench-gpu-memory.json" ] && args+=(--memory "$run/bench-gpu-memory.json")
if ((${#args[@]} == 0)); then
  echo "plots: $run holds none of bench-gpu-whatif.json, bench-gpu-per-op-decode.json, bench-gpu-memory.json" >&2
  exit 2
fi
"$py" tools/plot_bench.py --out "$figs" "${args[@]}"
