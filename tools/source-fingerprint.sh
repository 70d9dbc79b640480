#!/usr/bin/env bash
# The sources a GPU run built, as one SHA-256: every file under the build's inputs (CMake files,
# cmake/, oracle/, golden/, boundary/, judge/, gpu/, fixtures/, tests/, tools/), path and content, in byte order of their
# paths. tools/gpu-run.sh writes it to OUTDIR/source.txt; run it on the checkout you sent to
# tell which tree a run measured (a copied tree's git metadata may be stale, so HEAD alone does
# not say). Usage: tools/source-fingerprint.sh [ROOT] (default: the repository root)
set -euo pipefail
root=${1:-"$(dirname "$0")/.."}
cd "$root" 2>/dev/null || { echo "source-fingerprint.sh: no folder $root" >&2; exit 2; }
parts=()
for p in CMakeLists.txt CMakePresets.json cmake oracle golden boundary judge gpu fixtures tests tools; do
  [ -e "$p" ] && parts+=("$p")
done
[ ${#parts[@]} -gt 0 ] || { echo "source-fingerprint.sh: no sources under $PWD" >&2; exit 2; }
find "${parts[@]}" -type f -not -path '*/__pycache__/*' -print0 | LC_ALL=C sort -z |
  xargs -0 sha256sum | sha256sum | cut -d' ' -f1
