#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite (GPU tests skip without a GPU).
# Usage: tools/test.sh [preset]   preset: default (the default), ci, asan
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-default}
bash tools/install-deps.sh
cmake --preset "$preset"
cmake --build --preset "$preset"
ctest --preset "$preset"
