#!/usr/bin/python3
"""Fuzzes the Python package (docs/BAD_INPUT.md, "The Python package"): dsv32.read_golden on
byte-flipped and structurally mutated goldens (fuzz_inputs.py's mutations), write_candidate with
random steps, values and target paths (the golden's, links to it, folders, missing folders,
its own earlier candidates) and random file-size limits, judge on perfect and corrupted
candidates, dsv32.torch.check with random arguments and misbehaving layers, and the pytest
plugin's options. Every case must end in a result or one of the package's errors, never a
crash, a hang or another exception (an AttributeError, a bare KeyError); read_golden takes a
file exactly when `dsv32 validate` does; a refused write leaves no file and the target as it
was; a corrupted candidate never passes.

Cases run in worker processes (a case that kills its worker is reported as a crash and the
worker restarted). Seeded: each failure prints `--seed S --only I`, which replays it alone.

usage: fuzz_python.py --fixtures DIR --scratch DIR [--seed S] [--cases N] [--only I]
                      [--json REPORT]
--cases defaults to $DSV32_FUZZ_CASES, else --default-cases (200, ctest's). Nightly:
DSV32_FUZZ_CASES=5000 ctest -L fuzz. DSV32_TOOL names the tool. Exit 77 (a skip) without
numpy, h5py or torch."""
import argparse
import json
import os
import subprocess
import sys
import time

try:
    import h5py  # noqa: F401
    import numpy as np  # noqa: F401
except ImportError as e:
    print(f"skipped: {e} (install python3-h5py and python3-numpy)")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT_S = 120  # any one case


def worker_command(a):
    return [sys.executable, os.path.join(HERE, "fuzz_python_cases.py"), "--fixtures",
            a.fixtures, "--scratch", a.scratch, "--seed", str(a.seed)]


class Worker:
    """A process that runs the cases it is sent, one JSON line each."""

    def __init__(self, a, n):
        self.a, self.n = a, n
        self.start()

    def start(self):
        self.p = subprocess.Popen(worker_command(self.a) + ["--worker", str(self.n)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, bufsize=1)

    def run(self, index):
        """The case's result; a crash or a hang of the worker is the case's problem."""
        self.p.stdin.write(f"{index}\n")
        self.p.stdin.flush()
        import select
        t0 = time.monotonic()
        while True:
            ready, _, _ = select.select([self.p.stdout], [], [], 1.0)
            if ready:
                line = self.p.stdout.readline()
                if line:
                    return json.loads(line)
                break  # the worker ended
            if time.monotonic() - t0 > TIMEOUT_S:
                self.p.kill()
                break
        rc = self.p.wait()
        err = self.p.stderr.read()[-600:]
        self.start()
        what = "hung" if time.monotonic() - t0 > TIMEOUT_S else f"died (exit {rc})"
        return {"index": index, "kind": "?", "what": "?", "outcome": "crash",
                "problem": f"the worker {what} in this case", "stderr": err,
                "seconds": time.monotonic() - t0}

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--scratch", required=True)
    ap.add_argument("--seed", type=int, default=49)
    ap.add_argument("--default-cases", type=int, default=200)
    ap.add_argument("--cases", type=int, default=None)
    ap.add_argument("--only", type=int, default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    a = ap.parse_args()
    try:
        import torch  # noqa: F401
    except ImportError as e:
        print(f"skipped: torch is not importable ({e}); Debian: python3-torch")
        return 77
    if a.cases is None:
        a.cases = int(os.environ.get("DSV32_FUZZ_CASES", a.default_cases))
    os.makedirs(a.scratch, exist_ok=True)
    indices = [a.only] if a.only is not None else list(range(a.cases))
    jobs = max(1, min(a.jobs, len(indices)))
    print(f"fuzz_python: seed {a.seed}, {len(indices)} cases, {jobs} workers (replay one: "
          f"--seed {a.seed} --only I)", flush=True)
    t0 = time.monotonic()
    import concurrent.futures
    import queue
    idle = queue.Queue()
    for n in range(jobs):
        idle.put(Worker(a, n))

    def one(i):
        w = idle.get()
        try:
            return w.run(i)
        finally:
            idle.put(w)
    done = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        for n, r in enumerate(pool.map(one, indices), 1):
            done.append(r)
            if n % 50 == 0 or n == len(indices):
                print(f"  {n}/{len(indices)} cases, {time.monotonic() - t0:.0f} s", flush=True)
    while not idle.empty():
        idle.get().close()
    kinds = sorted({r["kind"] for r in done})
    outcomes = sorted({r["outcome"] for r in done})
    print(f"\n{'kind':<8} {'cases':>6} " + " ".join(f"{o:>10}" for o in outcomes)
          + f" {'problems':>9}")
    for k in kinds:
        rs = [r for r in done if r["kind"] == k]
        print(f"{k:<8} {len(rs):>6} " + " ".join(f"{sum(r['outcome'] == o for r in rs):>10}"
                                                 for o in outcomes)
              + f" {sum(bool(r['problem']) for r in rs):>9}")
    bad = [r for r in done if r["problem"]]
    slowest = max(done, key=lambda r: r["seconds"])
    print(f"\n{len(done)} cases: problems {len(bad)}; crashes "
          f"{sum(r['outcome'] == 'crash' for r in done)}; slowest case {slowest['seconds']:.1f} s "
          f"({slowest['kind']} {slowest['index']}: {slowest['what']})")
    for r in bad:
        print(f"FAIL case {r['index']} (--seed {a.seed} --only {r['index']}): {r['kind']} "
              f"{r['what']}: {r['problem']} {r.get('stderr', '')}")
    if a.json:
        with open(a.json + ".tmp", "w") as f:
            json.dump({"seed": a.seed, "cases": len(done), "problems": len(bad),
                       "seconds": time.monotonic() - t0, "results": done}, f, indent=1)
        os.replace(a.json + ".tmp", a.json)
    print(f"{time.monotonic() - t0:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
