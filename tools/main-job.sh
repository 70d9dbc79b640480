#!/usr/bin/env bash
# The main job: set up, build, and print the verdict table for the default scenario.
# Usage: tools/main-job.sh [--json FILE]   (extra arguments go to `dsv32 selfcheck`)
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default --target dsv32
./build/default/tools/dsv32 selfcheck "$@"
