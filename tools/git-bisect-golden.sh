#!/usr/bin/env bash
# `git bisect run` with a golden as the predicate: which commit of an engine broke its layer?
# At each commit git checks out, this builds the engine (--build), has it write its candidate
# for GOLDEN (--candidate: a command that writes the file named by $DSV32_CANDIDATE;
# docs/CANDIDATE.md) and judges the candidate with `dsv32 judge`.
#   exit 0    the candidate passes: a good commit
#   exit 1    it fails the golden: a bad commit
#   exit 125  this commit cannot be tested (the build failed, no candidate was written, the judge
#             refused the file): git bisect skips it
# The candidate command's own exit status is not the verdict (a layer that judges itself exits 1
# on a failure); only the judge's is.
#
#   cp tools/git-bisect-golden.sh /tmp/    # keep it and the dsv32 tool outside the bisected tree
#   git bisect start BAD GOOD
#   git bisect run /tmp/git-bisect-golden.sh --golden /abs/golden.h5 --tool /abs/dsv32 \
#     --build 'make -j' --candidate './my_layer --golden /abs/golden.h5 --out "$DSV32_CANDIDATE"'
set -uo pipefail
usage() {
  echo "usage: git-bisect-golden.sh --golden GOLDEN.h5 --candidate CMD [--build CMD] [--tool DSV32]" >&2
  exit 2  # not 125: a usage error must stop `git bisect run`, not skip every commit
}
golden="" candidate="" build="" tool="${DSV32_TOOL:-dsv32}"
while [ $# -gt 0 ]; do
  case "$1" in
    --golden) [ $# -ge 2 ] || usage; golden=$2; shift 2 ;;
    --candidate) [ $# -ge 2 ] || usage; candidate=$2; shift 2 ;;
    --build) [ $# -ge 2 ] || usage; build=$2; shift 2 ;;
    --tool) [ $# -ge 2 ] || usage; tool=$2; shift 2 ;;
    *) echo "git-bisect-golden.sh: unknown argument '$1'" >&2; usage ;;
  esac
done
[ -n "$golden" ] && [ -n "$candidate" ] || usage
if [ ! -f "$golden" ]; then
  echo "git-bisect-golden.sh: no golden file at $golden" >&2
  exit 2
fi
if ! command -v "$tool" > /dev/null 2>&1; then
  echo "git-bisect-golden.sh: no dsv32 tool at '$tool' (--tool or \$DSV32_TOOL)" >&2
  exit 2
fi
export DSV32_TOOL="$tool"  # the candidate's own use of the dsv32 package finds the same tool
commit=$(git rev-parse --short HEAD 2>/dev/null || echo "?")
if [ -n "$build" ] && ! bash -c "$build"; then
  echo "git-bisect-golden.sh: $commit: the build failed: skipped (125)" >&2
  exit 125
fi
work=$(mktemp -d) || exit 125
trap 'rm -rf "$work"' EXIT
export DSV32_CANDIDATE="$work/candidate.h5"
bash -c "$candidate"
if [ ! -s "$DSV32_CANDIDATE" ]; then
  echo "git-bisect-golden.sh: $commit: no candidate was written to \$DSV32_CANDIDATE: skipped (125)" >&2
  exit 125
fi
"$tool" judge "$DSV32_CANDIDATE" --golden "$golden"
verdict=$?
case $verdict in
  0) echo "git-bisect-golden.sh: $commit: passes the golden (good)" >&2; exit 0 ;;
  1) echo "git-bisect-golden.sh: $commit: fails the golden (bad)" >&2; exit 1 ;;
  *) echo "git-bisect-golden.sh: $commit: the judge refused the candidate (exit $verdict): skipped (125)" >&2; exit 125 ;;
esac
