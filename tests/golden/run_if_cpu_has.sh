#!/usr/bin/env bash
# Runs a command built for an instruction set where the CPU has it; skips (77) where it does not.
# Usage: run_if_cpu_has.sh "CPU_FLAG ..." COMMAND [ARGS...]
set -euo pipefail
flags=$1; shift
for flag in $flags; do
  if ! grep -qw "$flag" /proc/cpuinfo; then
    echo "skipped: this CPU has no $flag, which $(basename "$1") was built for"
    exit 77
  fi
done
exec "$@"
