#!/usr/bin/python3
"""The cases of fuzz_python.py, run in a worker process: `--worker N` reads case indices from
stdin and answers each with one JSON line {index, kind, what, outcome, problem, seconds}.
A case's random choices come from (seed, index) alone."""
import argparse
import hashlib
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

import h5py
import numpy as np

# Run as a script (fuzz_python.py's workers): Python puts this folder first on the import path.
from fuzz_inputs import BASES, flip_bytes, golden_mutation
from fuzz_cases_and_rows import malformed_topk_row

import dsv32  # installed (ctest's PYTHONPATH); DSV32_TOOL or the checkout's build for the tool
import dsv32.torch as dt
import torch

HERE = os.path.dirname(os.path.abspath(__file__))

PACKAGE = os.path.dirname(os.path.abspath(dsv32.__file__))
# The package's own errors; anything else escaping it (AttributeError, a bare KeyError, numpy's
# ValueError) is an unclear error.
OURS = (ValueError, TypeError, RuntimeError, FileNotFoundError)


def unclear(e):
    """Why exception `e` is not a clear error of the package's own, or ""."""
    if not isinstance(e, OURS):
        return f"{type(e).__name__}: {e}"
    if not str(e).strip():
        return f"an empty {type(e).__name__}"
    frames = traceback.extract_tb(e.__traceback__)
    if not frames or not os.path.abspath(frames[-1].filename).startswith(PACKAGE):
        where = frames[-1].filename if frames else "?"
        return f"{type(e).__name__} raised in {where}, not by the package: {e}"
    return ""


def digest(path):
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def leftovers(folder):
    names = os.listdir(folder) if os.path.isdir(folder) else []
    return sorted(n for n in names if n.endswith(".tmp"))


class Ctx:
    def __init__(self, a):
        self.fixtures, self.scratch, self.seed = a.fixtures, a.scratch, a.seed
        self.tool = dsv32.verdict.find_tool()
        self.goldens = {}

    def golden(self, base):
        if base not in self.goldens:
            self.goldens[base] = dsv32.read_golden(os.path.join(self.fixtures, base + ".h5"))
        return self.goldens[base]

    def folder(self, index):
        d = os.path.join(self.scratch, f"case{index}")
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        return d


# --- read_golden ------------------------------------------------------------------------------
def case_read(ctx, rng, d):
    base = rng.choice(BASES)
    path = os.path.join(d, "g.h5")
    shutil.copy(os.path.join(ctx.fixtures, base + ".h5"), path)
    if rng.random() < 0.3:
        what = f"{base}: {flip_bytes(rng, path)}"
    else:
        try:
            what = f"{base}: {golden_mutation(rng, path)[0]}"
        except Exception as e:  # noqa: BLE001 a mutation h5py cannot make: the file as it is
            what = f"{base}: unmutated ({type(e).__name__})"
    tool_rc = subprocess.run([ctx.tool, "validate", path], capture_output=True,
                             stdin=subprocess.DEVNULL).returncode
    try:
        dsv32.read_golden(path)
    except dsv32.GoldenFileError as e:
        if tool_rc == 0:
            return what, "refused", f"read_golden refuses a file the tool takes: {e}"
        return what, "refused", unclear(e)
    except BaseException as e:  # noqa: BLE001
        return what, "error", unclear(e) or f"{type(e).__name__} is not GoldenFileError: {e}"
    if tool_rc != 0:
        return what, "read", f"read_golden takes a file the tool refuses (exit {tool_rc})"
    return what, "read", ""


# --- write_candidate --------------------------------------------------------------------------
VALUES = ["f64", "f32", "f16", "int", "int64-huge", "complex", "bool", "object", "0-d", "empty",
          "ragged", "torch-bf16", "torch-int", "nan", "none", "string"]


def value(rng, kind):
    n = rng.randint(1, 6)
    return {
        "f64": lambda: np.random.default_rng(rng.randrange(1 << 30)).standard_normal((n, 3)),
        "f32": lambda: np.ones((n, 2), dtype=np.float32),
        "f16": lambda: np.ones((n,), dtype=np.float16),
        "int": lambda: np.arange(n * 2).reshape(n, 2),
        "int64-huge": lambda: np.full((n, 2), rng.choice([2**31, -2**31 - 1, 2**62])),
        "complex": lambda: np.ones((n, 2)) * 1j,
        "bool": lambda: np.ones((n, 2), dtype=bool),
        "object": lambda: np.array([object()] * n),
        "0-d": lambda: np.float64(3.0),
        "empty": lambda: np.zeros((0, 3)),
        "ragged": lambda: [[1.0], [1.0, 2.0]],
        "torch-bf16": lambda: torch.ones(n, 2, dtype=torch.bfloat16),
        "torch-int": lambda: torch.arange(n),
        "nan": lambda: np.full((n, 2), np.nan),
        "none": lambda: None,
        "string": lambda: "abc",
    }[kind]()


def writable(kind):
    return kind in ("f64", "f32", "f16", "int", "torch-bf16", "torch-int", "nan")


NAMES = ["output", "layer0/q_c", "layer1/topk", "layer12/kv", "layer0/", "../x", "layer0/a/b",
         "steps", "", 7, "layer-1/q", "output/x", "layer0/q c"]
TARGETS = ["fresh", "golden", "golden-link", "golden-hardlink", "own", "foreign", "dir",
           "missing-folder", "empty-file", "fifo", "pathlib", "bytes", "int"]


def target_path(rng, ctx, d, kind):
    g = os.path.join(d, "g.h5")
    shutil.copy(os.path.join(ctx.fixtures, "kv-fp8.h5"), g)
    p = os.path.join(d, "c.h5")
    if kind in ("golden", "golden-hardlink"):
        p = g if kind == "golden" else p
        if kind == "golden-hardlink":
            os.link(g, p)
    elif kind == "golden-link":
        os.symlink(g, p)
    elif kind == "own":
        dsv32.write_candidate(p, [{"output": np.ones((1, 1))}])
    elif kind == "foreign":
        with h5py.File(p, "w") as f:
            f["x"] = 1
    elif kind == "dir":
        os.mkdir(p)
    elif kind == "missing-folder":
        p = os.path.join(d, "nowhere", "c.h5")
    elif kind == "empty-file":
        open(p, "w").close()
    elif kind == "fifo":
        os.mkfifo(p)
    if kind == "pathlib":
        import pathlib
        return pathlib.Path(p), p
    if kind == "bytes":
        return os.fsencode(p), p
    if kind == "int":
        return 3, None
    return p, p


def case_write(ctx, rng, d):
    tkind = rng.choice(TARGETS)
    target, path = target_path(rng, ctx, d, tkind)
    shape = rng.choice(["list"] * 8 + ["tuple", "generator", "dict", "none", "empty"])
    steps, good = [], rng.random() < 0.5  # half of them well-formed
    valid = ("output", "layer0/q_c", "layer1/topk", "layer12/kv")
    all_ok = True
    for _ in range(rng.randint(1, 3)):
        step, kinds = ({"output": value(rng, "f64")}, {"output": "f64"}) if good else ({}, {})
        for _ in range(rng.randint(0 if good else 1, 4)):
            name = rng.choice(NAMES[:4] if good else NAMES)
            kind = rng.choice([v for v in VALUES if writable(v)] if good else VALUES)
            step[name], kinds[name] = value(rng, kind), kind
        if rng.random() < 0.2 and not good:
            step = rng.choice([None, "output", [1, 2], step])
        all_ok &= isinstance(step, dict) and "output" in step and all(
            isinstance(n, str) and n in valid and writable(k) for n, k in kinds.items())
        steps.append(step)
    arg = {"list": steps, "tuple": tuple(steps), "generator": (s for s in steps),
           "dict": {"output": 1}, "none": None, "empty": []}[shape]
    fsize = rng.choice([None] * 4 + [0, 600, 4096, 20000])
    what = f"target {tkind}, steps as {shape}, file-size limit {fsize}"
    before = digest(path) if path and os.path.isfile(path) else None
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    try:
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, hard))
        dsv32.write_candidate(target, arg)
    except BaseException as e:  # noqa: BLE001
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        why = unclear(e)
        if not why and path and os.path.exists(path) and not os.path.isdir(path) and \
                not tkind == "fifo" and digest(path) != before:
            why = "refused, yet the target changed"
        left = leftovers(os.path.dirname(path) if path else d)
        if not why and left:
            why = f"refused, yet temporaries are left: {left}"
        return what, "refused", why
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    if tkind in ("golden", "golden-link", "golden-hardlink", "foreign", "dir", "fifo", "int",
                 "missing-folder"):
        return what, "written", f"wrote over a {tkind} target"
    if shape in ("dict", "none", "empty") or not all_ok:
        return what, "written", "wrote steps it should have refused"
    with open(path, "rb") as f:
        if f.read(16) != b"dsv32-candidate\n":
            return what, "written", "the file lacks the candidate mark"
    with h5py.File(path, "r") as f:
        for s, step in enumerate(steps):
            for name, v in step.items():
                got = f[f"steps/step{s}/expected/{name}"][()]
                want = v.float().numpy() if hasattr(v, "detach") else np.asarray(v)
                if not np.array_equal(got.astype(np.float64), want.astype(np.float64),
                                      equal_nan=True):
                    return what, "written", f"step {s} {name} not written as given"
    return what, "written", ""


# --- judge ------------------------------------------------------------------------------------
def case_judge(ctx, rng, d):
    base = rng.choice(BASES)
    g = ctx.golden(base)
    steps = [dict(s.expected) for s in g.steps]
    path = os.path.join(d, "c.h5")
    how = rng.choice(["perfect", "scaled", "nan", "topk-row", "drop-step"])
    if how in ("scaled", "nan"):
        s = rng.randrange(len(steps))
        name = rng.choice([n for n in steps[s] if not n.endswith("topk")])
        a = np.array(steps[s][name], dtype=np.float64)
        a.flat[rng.randrange(a.size)] = np.nan if how == "nan" else 1e6
        steps[s][name] = a
        how += f" {s} {name}"
    if how == "drop-step":
        steps = steps[:-1] if len(steps) > 1 else steps
    dsv32.write_candidate(path, steps)
    if how == "topk-row":
        with h5py.File(path, "r+") as f:
            how += " " + str(malformed_topk_row(rng, f, g))
    require = rng.choice([(), "pruned>=1", ["pruned>=1"], "nonsense", [3]])
    what = f"{base}: {how}, require {require!r}"
    try:
        v = dsv32.judge(path, os.path.join(ctx.fixtures, base + ".h5"), require=require)
    except BaseException as e:  # noqa: BLE001
        return what, "refused", unclear(e)
    if v.passed and not how.startswith("perfect") and not how.startswith("drop"):
        return what, "pass", "a corrupted candidate passed"
    if how.startswith("drop") and v.passed and len(g.steps) > 1:
        return what, "pass", "a candidate without its last step passed"
    return what, "pass" if v.passed else "fail", ""


# --- dsv32.torch.check ------------------------------------------------------------------------
class Layer:
    def __init__(self, golden, rng):
        self.g, self.rng = golden, rng
        self.how = rng.choice(["good", "scaled", "short", "int", "raise", "none", "nan-stage",
                               "bad-stage", "3d"])

    def __call__(self, batch):
        want = torch.from_numpy(self.g.steps[batch.step].expected["output"])
        out = torch.zeros(batch.num_padded, want.shape[1], dtype=torch.float64)
        out[:want.shape[0]] = want
        h = self.how
        if h == "scaled":
            out = out * 3
        if h == "short":
            out = out[:1]
        if h == "int":
            out = out.long()
        if h == "raise":
            raise KeyError("boom")
        if h == "none":
            return None
        if h == "nan-stage":
            dt.record("layer0/q_c", torch.full((batch.num_padded, 4), float("nan")))
        if h == "bad-stage":
            dt.record(self.rng.choice(["layer0/nope", "x", "layer99/q_c"]), out)
        if h == "3d":
            out = out[None]
        return out


def case_check(ctx, rng, d):
    g = ctx.golden("kv-fp8")
    layer = Layer(g, rng)
    mode = rng.choice(["eager"] * 4 + ["EAGER", "full", "", None, ["eager"]])
    dtype = rng.choice([torch.float64] * 4 + [torch.float32, torch.int64, "float64", None])
    device = rng.choice(["cpu"] * 4 + ["bogus", 3, None, "cuda:7"])
    out = rng.choice([None] * 3 + ["fresh", "golden", "missing", "dir"])
    out_path = {None: None, "fresh": os.path.join(d, "c.h5"), "missing": os.path.join(d, "x", "c.h5"),
                "dir": d, "golden": os.path.join(ctx.fixtures, "kv-fp8.h5")}[out]
    what = f"layer {layer.how}, mode {mode!r}, dtype {dtype}, device {device!r}, out {out}"
    before = digest(os.path.join(ctx.fixtures, "kv-fp8.h5"))
    tmp = os.path.join(d, "tmp")
    os.mkdir(tmp)
    old, tempfile.tempdir = tempfile.tempdir, tmp
    try:
        v = dt.check(layer, g, mode=mode, device=device, dtype=dtype, out=out_path)
    except BaseException as e:  # noqa: BLE001
        why = unclear(e)
        kept = isinstance(e, dt.LayerError) and e.candidate is not None
        if kept and not (os.path.isfile(e.candidate) and e.candidate in str(e)):
            why = "says its candidate is kept, and it is not there (or not named)"
        if not why and os.listdir(tmp) and not kept:
            why = f"refused, yet it left {os.listdir(tmp)} in the temporary folder"
        return what, "refused", why
    finally:
        tempfile.tempdir = old
        if digest(os.path.join(ctx.fixtures, "kv-fp8.h5")) != before:
            return what, "?", "the golden changed"
    if v.passed and layer.how not in ("good", "bad-stage"):
        return what, "pass", f"a {layer.how} layer passed"
    left = os.listdir(tmp)
    if v.passed and left:
        return what, "pass", f"a passing check left {left}"
    return what, "pass" if v.passed else "fail", ""


# --- the pytest plugin ------------------------------------------------------------------------
def case_plugin(ctx, rng, d):
    with open(os.path.join(d, "test_u.py"), "w") as f:
        f.write("def test_u(dsv32_golden):\n    assert dsv32_golden.steps\n")
    args = ["--dsv32-golden", os.path.join(ctx.fixtures, "kv-fp8.h5")] if rng.random() < 0.5 \
        else []
    for _ in range(rng.randint(0, 2)):
        opt = rng.choice(["--dsv32-golden", "--dsv32-mode", "--dsv32-device"])
        val = rng.choice({"--dsv32-golden": [os.path.join(ctx.fixtures, "kv-fp8.h5"), "nope.h5",
                                             ".", "/dev/null", ""],
                          "--dsv32-mode": ["eager", "all", "", ",", "EAGER", "eager,full",
                                           "eager,eager", "x"],
                          "--dsv32-device": ["cpu", "bogus", ""]}[opt])
        args += [opt, val]
    what = " ".join(args) or "(no options)"
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "dsv32.pytest_plugin", "-p",
                        "no:cacheprovider", "test_u.py", *args], capture_output=True, text=True,
                       cwd=d, timeout=100, stdin=subprocess.DEVNULL)
    out = p.stdout + p.stderr
    if "Traceback" in out and "INTERNALERROR" in out:
        return what, f"exit {p.returncode}", "pytest INTERNALERROR: " + out[-300:]
    if p.returncode == 0 and "passed" not in out:
        return what, "exit 0", "exit 0 with no test passed"
    if p.returncode < 0:
        return what, f"signal {-p.returncode}", "pytest died"
    return what, f"exit {p.returncode}", ""


KINDS = [("read", case_read, 30), ("write", case_write, 35), ("judge", case_judge, 15),
         ("check", case_check, 15), ("plugin", case_plugin, 5)]


def run_case(ctx, index):
    rng = random.Random(f"{ctx.seed}-{index}")
    kind, fn = rng.choices([(k, f) for k, f, _ in KINDS], [w for *_, w in KINDS])[0]
    d = ctx.folder(index)
    t0 = time.monotonic()
    try:
        what, outcome, problem = fn(ctx, rng, d)
    except BaseException as e:  # noqa: BLE001 the harness's own failure is a failure too
        what, outcome, problem = "?", "harness", f"harness error: {e!r}"
    shutil.rmtree(d, ignore_errors=True)
    return {"index": index, "kind": kind, "what": what, "outcome": outcome, "problem": problem,
            "seconds": time.monotonic() - t0}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--scratch", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--worker", type=int, required=True)
    a = ap.parse_args()
    a.scratch = os.path.join(a.scratch, f"worker{a.worker}")
    os.makedirs(a.scratch, exist_ok=True)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    ctx = Ctx(a)
    for line in sys.stdin:
        print(json.dumps(run_case(ctx, int(line))), flush=True)


if __name__ == "__main__":
    main()
