#!/usr/bin/env python3
"""Per-op medians of a tools/bench-ab.sh run of `bench-gpu --per-op`, tree a and tree b side by
side: us per op (median over the rounds, min-max in brackets) and b's median over a's.
Usage: tools/bench_ab_summary.py OUTDIR [--json FILE]"""
import glob
import json
import statistics
import sys


def load(outdir, side):
    runs = [json.load(open(f)) for f in sorted(glob.glob(f"{outdir}/{side}-*.json"))]
    if not runs:
        sys.exit(f"bench_ab_summary: no {side}-*.json in {outdir}")
    return runs


def cells(run):
    """(preset, row, T) -> ms for every op and the two layer rows of one --per-op JSON."""
    out = {}
    for preset, pj in run.get("presets", {}).items():
        for op, by_t in pj.get("ops", {}).items():
            for t, v in by_t.items():
                out[(preset, op, t)] = v["ms"]
        for row in ("layer", "layer_narrow"):
            for t, v in pj.get(row, {}).items():
                out[(preset, row, t)] = v["ms"]
    return out


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        sys.exit(__doc__)
    outdir = args[0]
    json_out = args[args.index("--json") + 1] if "--json" in args else None
    a, b = load(outdir, "a"), load(outdir, "b")
    ca, cb = [cells(r) for r in a], [cells(r) for r in b]
    keys = [k for k in ca[0] if k in cb[0]]
    print(f"{len(a)} rounds each; a options: {a[0].get('options', 'not recorded')}; "
          f"b options: {b[0].get('options', 'not recorded')}")
    print(f"{'preset':<10} {'op':<16} {'T':>4} {'a us':>22} {'b us':>22} {'b/a':>6}")
    rows = []
    for k in keys:
        va = [c[k] * 1e3 for c in ca if k in c]
        vb = [c[k] * 1e3 for c in cb if k in c]
        ma, mb = statistics.median(va), statistics.median(vb)
        ratio = mb / ma if ma > 0 else float("nan")
        fa = f"{ma:8.1f} [{min(va):6.1f}-{max(va):6.1f}]"
        fb = f"{mb:8.1f} [{min(vb):6.1f}-{max(vb):6.1f}]"
        print(f"{k[0]:<10} {k[1]:<16} {k[2]:>4} {fa:>22} {fb:>22} {ratio:6.3f}")
        rows.append({"preset": k[0], "op": k[1], "T": int(k[2]), "a_us": va, "b_us": vb,
                     "a_median_us": ma, "b_median_us": mb, "ratio": ratio})
    if json_out:
        with open(json_out, "w") as f:
            json.dump({"rounds": len(a), "a_options": a[0].get("options"),
                       "b_options": b[0].get("options"), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
