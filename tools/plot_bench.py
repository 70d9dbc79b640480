#!/usr/bin/python3
"""PNG figures from `dsv32 bench-gpu` JSON (matplotlib; tools/plots.sh installs it):

    plot_bench.py --out DIR [--whatif F] [--per-op F] [--memory F] [--preset NAME]

--whatif F  (bench-gpu --dispatch-us --json F)  -> DIR/whatif.png: ms a step per plan against
            the host cost of an eager op, one panel per batch.
--per-op F  (bench-gpu --per-op --json F)       -> DIR/per-op.png: each op's time over its
            bandwidth floor against T, for --preset (default: the file's first preset).
--memory F  (bench-gpu --memory --json F)       -> DIR/memory.png: each plan's graph memory
            summed over vLLM's capture sizes up to each size (the largest layer count run).
Each figure reads only its JSON; a missing key is an error naming it."""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FormatStrFormatter  # noqa: E402

plt.rcParams["axes.prop_cycle"] = plt.cycler(color=plt.get_cmap("tab20").colors)

MIB = 1024.0 * 1024.0


def load(path, what):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"plot_bench: cannot read {what} JSON {path}: {e}")


def need(obj, key, where):
    if key not in obj:
        sys.exit(f"plot_bench: {where} has no '{key}' (not a bench-gpu JSON of that mode?)")
    return obj[key]


def whatif(path, out):
    j = load(path, "--dispatch-us")
    cases = need(j, "cases", path)
    cols = min(3, len(cases))
    rows_n = (len(cases) + cols - 1) // cols
    fig, axes = plt.subplots(rows_n, cols, figsize=(4.4 * cols, 3.9 * rows_n), squeeze=False)
    spare = list(axes.flat[len(cases):])
    for ax in spare:
        ax.axis("off")
    for ax, case in zip(axes.flat, cases):
        rows = need(case, "rows", path)
        xs = [r["dispatch_us"] for r in rows]
        plans = j.get("plans", list(rows[0]["ms"]))
        for plan in plans:
            ax.plot(xs, [r["ms"][plan] for r in rows], marker="o", ms=3, label=plan)
        ax.set_title(case["case"])
        ax.set_xlabel("host cost of an eager op (us)")
        times = [t for r in rows for t in r["ms"].values()]
        if max(times) > 3 * min(times):  # log where the plans differ by multiples
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
            ax.yaxis.set_minor_formatter(FormatStrFormatter("%g"))
            ax.tick_params(axis="y", which="minor", labelsize=7)
            ax.set_ylabel("ms a step (log)")
        else:
            ax.set_ylabel("ms a step")
        ax.grid(alpha=0.3)
    if spare:  # the legend in the first empty panel, clear of the curves
        spare[0].legend(*axes[0][0].get_legend_handles_labels(), loc="center", fontsize=9)
    else:
        axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{j['preset']}, {j['layers']} layers, context {j['context']}: step time per "
                 f"plan against a framework's dispatch cost (graph launch {j['graph_launch_us']} us)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "whatif.png"), dpi=110)


def per_op(path, out, preset):
    j = load(path, "--per-op")
    presets = need(j, "presets", path)
    name = preset or next(iter(presets))
    if name not in presets:
        sys.exit(f"plot_bench: {path} has no preset {name} (has {', '.join(presets)})")
    ops = need(presets[name], "ops", path)
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for op, cells in ops.items():
        ts = sorted(cells, key=int)
        ax.plot([int(t) for t in ts], [cells[t]["ms"] / cells[t]["floor_ms"] for t in ts],
                marker="o", ms=3, label=op)
    for key, label in (("layer", "layer (eager)"), ("layer_narrow", "layer (narrow)"),
                       ("layer_full", "layer (full)")):
        cells = presets[name].get(key)
        if cells:
            ts = sorted(cells, key=int)
            ax.plot([int(t) for t in ts], [cells[t]["ms"] / cells[t]["floor_ms"] for t in ts],
                    lw=2.5, color="black", ls={"layer": "-", "layer_narrow": "--"}.get(key, ":"),
                    label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("T (tokens)")
    ax.set_ylabel("time / bandwidth floor")
    ax.set_title(f"{name}: each op against its floor, context {j.get('context')}", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "per-op.png"), dpi=110)


def memory(path, out):
    j = load(path, "--memory")
    runs = need(j, "runs", path)
    run = max(runs, key=lambda r: r["layers"])
    sizes = need(run, "capture_sizes", path)
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for row in need(run, "rows", path):
        total, ys = 0.0, []
        for b in row["graph_bytes_per_size"]:
            total += b
            ys.append(total / MIB)
        ax.step(sizes, ys, where="post",
                label=f"{row['plan']} (+{row['needed_static_bytes'] / (1024 * MIB):.2f} GiB static)")
    ax.set_xlabel("largest capture size")
    ax.set_ylabel("graph memory (MiB), sizes up to it")
    ax.set_title(f"{j['preset']}, {run['layers']} layers: graph memory per plan over vLLM's "
                 "capture sizes", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "memory.png"), dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--whatif")
    ap.add_argument("--per-op")
    ap.add_argument("--memory")
    ap.add_argument("--preset")
    a = ap.parse_args()
    if not (a.whatif or a.per_op or a.memory):
        ap.error("give at least one of --whatif, --per-op, --memory")
    os.makedirs(a.out, exist_ok=True)
    if a.whatif:
        whatif(a.whatif, a.out)
    if a.per_op:
        per_op(a.per_op, a.out, a.preset)
    if a.memory:
        memory(a.memory, a.out)
    print(f"plot_bench: figures in {a.out}")


if __name__ == "__main__":
    main()
