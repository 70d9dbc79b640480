#!/usr/bin/env python3
"""The torch runner's cost per step against the layer's own time, side by side in one run:
the example layer (python/examples/torch_layer.py) over a golden's steps, called directly on each
padded step (its own time), through the runner eagerly, and replayed under full, narrow and wide
graphs. Times are medians over --repeats passes over every step, after one pass that captures;
the judge is not timed. Prints a table and writes --json.

    python3 tools/bench_torch_runner.py fixtures/default.h5 --device cuda --json out.json"""
import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "python"), os.path.join(ROOT, "python", "examples")]
import torch  # noqa: E402

import dsv32  # noqa: E402
import dsv32.torch as dt  # noqa: E402
from torch_layer import Stack  # noqa: E402


def per_step(fn, steps, device, repeats):
    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    for s in steps:  # the first pass captures and warms up
        fn(s)
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for s in steps:
            fn(s)
        sync()
        times.append((time.perf_counter() - t0) / len(steps) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("golden")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.repeats < 1 or a.repeats > 1000:
        sys.exit("--repeats: 1..1000")
    g = dsv32.read_golden(a.golden)
    layer, inputs = Stack(g, a.device), dt.Inputs(g, a.device)
    steps = range(len(g.steps))
    padded = {s: inputs.step(s, inputs.capture_size(s)) for s in steps}
    rows = []
    with torch.no_grad():
        own = per_step(lambda s: layer(padded[s]), steps, a.device, a.repeats)
    rows.append(("the layer itself (padded, eager)", own))
    modes = dt.MODES if a.device.startswith("cuda") else ("eager",)
    for mode in modes:
        r = dt.Runner(mode, a.device)
        batch = (lambda s: inputs.step(s)) if mode == "eager" else (lambda s: padded[s])
        rows.append((f"runner, {mode}", per_step(lambda s: r.run(layer, batch(s), inputs), steps,
                                                 a.device, a.repeats)))
    print(f"{os.path.basename(a.golden)}: {len(g.steps)} steps, {a.device}, median of {a.repeats}")
    print(f"{'what':<36} {'ms/step':>9} {'x own':>7}")
    for what, ms in rows:
        print(f"{what:<36} {ms:>9.3f} {ms / own:>7.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"golden": a.golden, "device": a.device, "repeats": a.repeats,
                       "rows": [{"what": w, "ms_per_step": ms, "x_own": ms / own} for w, ms in rows]},
                      f, indent=1)


if __name__ == "__main__":
    main()
