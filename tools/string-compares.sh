#!/usr/bin/env bash
# Counts the places where C++/CUDA code outside tests/ compares a string with a string literal
# (issue 50: strings only at parse and print points): `== "x"`, `!= "x"` (either side),
# `.compare(... "x")`, `starts_with("x")`, `ends_with("x")`, and lookups by a literal key,
# `.find("x")`, `.at("x")`, `.count("x")`, `.contains("x")`. Literals inside other literals and
# comments are not code and are skipped. Each site is classed by its literal: a stage, an op, a
# coverage metric or requirement operator, a mutant, a plan, a bisect verdict, or other.
#
#   tools/string-compares.sh              counts per folder and per class
#   tools/string-compares.sh --list       also every site (file:line [class] code)
#   tools/string-compares.sh --rev REV    the same for commit REV (e.g. 00ca970, the baseline)
set -euo pipefail
cd "$(dirname "$0")/.."
list=0
rev=
while (($#)); do
  case "$1" in
    --list) list=1 ;;
    --rev) rev="$2"; shift ;;
    *) echo "usage: $0 [--list] [--rev REV]" >&2; exit 2 ;;
  esac
  shift
done
root=.
if [ -n "$rev" ]; then
  root=$(mktemp -d)
  trap 'rm -rf "$root"' EXIT
  git archive "$rev" oracle boundary judge golden tools gpu | tar -x -C "$root"
fi
LIST=$list ROOT=$root python3 - <<'EOF'
import os, re, collections

root, show = os.environ["ROOT"], os.environ["LIST"] == "1"
folders = ["oracle", "boundary", "judge", "golden", "tools", "gpu"]
classes = {
    "stage": "q_c c kR ql qR qI8 qI_scale kI8 kI_scale omega topk olat lse o y output steps",
    "op": "input_norm qkv_a_proj indexer_wk_proj norm_rope_cache q_b_proj uk_absorb "
          "indexer_wq_b fused_q indexer_topk sparse_mqa uv_proj latent_copy uv_proj_static "
          "o_proj residual_add",
    "metric": "rows padded multi_token over_k scored pruned ties largest_tie largest_bin "
              "max_keys k_edge reused_blocks >= > <= < ==",
    "mutant": "fresh-output capture-host-op baked-short-prefill uv-captured-nocopy "
              "shared-layer-clears no-topk-clear double-rope padded-cache-write stale-positions "
              "unjoined-stream full-for-mixed stale-full-metadata stale-short-prefill "
              "verify-stride topk-bin-overflow topk-edge reused-block-skip int32-offset "
              "fp8-tile-scale topk-long-row",
    "plan": "eager breakable-eager wide narrow narrow-copy full full-and-piecewise "
            "full-and-piecewise:",
    "verdict": "none data eager-segment boundary dispatch",
}
klass = {}
for k, words in classes.items():
    for w in words.split():
        klass.setdefault(w, k)

lit = r'"((?:[^"\\]|\\.)*)"'
patterns = [
    re.compile(r'(?:==|!=)\s*' + lit),
    re.compile(lit + r'\s*(?:==|!=)'),
    re.compile(r'\.compare\([^;]*?' + lit),
    re.compile(r'\b(?:starts_with|ends_with)\(\s*' + lit),
    re.compile(r'\.(?:find|at|count|contains)\(\s*' + lit + r'\s*\)'),
]
string_or_char = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)+\'')


def code_of(line):
    """The line with comments removed and every literal's text kept apart (index -> text)."""
    texts, out, i = [], [], 0
    for m in string_or_char.finditer(line):
        out.append(line[i:m.start()])
        if m.group(0).startswith('"'):
            texts.append(m.group(0)[1:-1])
            out.append('"\x00%d"' % (len(texts) - 1))
        else:
            out.append("'c'")
        i = m.end()
    out.append(line[i:])
    code = "".join(out)
    if "//" in code:
        code = code[: code.index("//")]
    return code, texts


sites = []
for folder in folders:
    base = os.path.join(root, folder)
    for d, _, files in sorted(os.walk(base)):
        for f in sorted(files):
            if not f.endswith((".cpp", ".hpp", ".cu", ".cuh", ".h")):
                continue
            path = os.path.join(d, f)
            with open(path, encoding="utf-8", errors="replace") as fh:
                for n, line in enumerate(fh, 1):
                    code, texts = code_of(line.rstrip("\n"))
                    found = []
                    for p in patterns:
                        for m in p.finditer(code):
                            found.append((m.start(), texts[int(m.group(1)[1:])]))
                    for _, text in sorted(set(found)):
                        sites.append((folder, os.path.relpath(path, root), n, text, line.strip()))

by_folder = collections.Counter(s[0] for s in sites)
by_class = collections.Counter(klass.get(s[3], "other") for s in sites)
if show:
    for folder, path, n, text, line in sites:
        print(f"{path}:{n} [{klass.get(text, 'other')} \"{text}\"] {line}")
    print()
print(f"string-literal compares: {len(sites)}")
print("  per folder: " + ", ".join(f"{f} {by_folder[f]}" for f in folders))
print("  per class:  " + ", ".join(f"{k} {by_class[k]}" for k in list(classes) + ["other"]))
EOF
