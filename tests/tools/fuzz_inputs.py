#!/usr/bin/python3
"""Fuzzes the dsv32 tool with bad files (docs/BAD_INPUT.md): byte-flipped, truncated and
structurally mutated copies of committed goldens and of a candidate, fed to `dsv32 diff`,
`dsv32 golden --check --bitwise` and `dsv32 judge`; and mutated case files and Hugging Face
configs, fed to `dsv32 golden --spec` (fuzz_cases_and_rows.py). Every run must end with exit 0,
1 or 2, by no signal, within the time and memory bounds, without a bare allocation failure; a
structural mutation that changes what is judged must not pass (a malformed top-k row, in an F
or an S layer, is one); a byte flip that passes --check --bitwise must have left the judged
content as it was; a refused case file leaves no golden and no temporary file. Each case has its own seed, printed with any
failure, and is replayed alone with --seed S --only I.

usage: fuzz_inputs.py --tool DSV32 --fixtures DIR --scratch DIR [--seed S] [--cases N]
                      [--only I] [--json REPORT]
--cases defaults to $DSV32_FUZZ_CASES, else --default-cases (300; ctest's is 300, 60 under
sanitizers). Nightly: DSV32_FUZZ_CASES=5000 ctest -L fuzz.
Exit 77 (a ctest skip) without numpy or h5py."""
import argparse
import concurrent.futures
import functools
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import time

try:
    import h5py
    import numpy as np
except ImportError as e:
    print(f"skipped: {e} (install python3-h5py and python3-numpy)")
    sys.exit(77)

import dsv32  # noqa: E402 (installed: ctest's PYTHONPATH)
from fuzz_cases_and_rows import case_file_mutation, malformed_topk_row, refused_or_whole  # noqa: E402,E501

# The small committed goldens the mutations start from (one of each layout family).
BASES = ["kv-fp8", "hadamard-on", "precision-fp32", "padded", "mixed"]
TIMEOUT_S = 60          # any one run
MEMORY_BYTES = 2 << 30  # address space of any one run


NO_MEMORY_LIMIT = bool(os.environ.get("DSV32_NO_MEMORY_LIMIT"))  # sanitizer builds


def limit_memory():
    if not NO_MEMORY_LIMIT:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def run_measured(tool, args):
    """(exit code, -signal or "timeout", seconds, peak RSS KiB, stderr tail) of one run."""
    t0 = time.monotonic()
    with open(os.devnull, "wb") as null, \
            open(f"/tmp/dsv32-fuzz-err-{os.getpid()}-{random.getrandbits(48)}", "w+b") as err:
        os.unlink(err.name)
        p = subprocess.Popen([tool] + args, stdout=null, stderr=err, stdin=subprocess.DEVNULL,
                             preexec_fn=limit_memory)
        status, usage = 0, None
        while True:  # os.wait4: the child's own peak RSS
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - t0 > TIMEOUT_S:
                p.kill()
                _, status, usage = os.wait4(p.pid, 0)
                status = None
                break
            time.sleep(0.01)
        p.returncode = 0  # reaped here; keep Popen from waiting again
        err.seek(0)
        text = err.read().decode(errors="replace")
        if len(text) > 700:  # the message's start names the tool; its end, what was refused
            text = text[:300] + " ... " + text[-400:]
    secs = time.monotonic() - t0
    if status is None:
        rc = "timeout"
    elif os.WIFSIGNALED(status):
        rc = -os.WTERMSIG(status)
    else:
        rc = os.WEXITSTATUS(status)
    return rc, secs, usage.ru_maxrss if usage else 0, text


# ---------------------------------------------------------------------------------------------
# Mutations. Each returns a short description; structural ones also say whether the mutated
# file may still pass (True: the change is to an optional extra or to nothing judged).

def flip_bytes(rng, path):
    data = bytearray(open(path, "rb").read())
    kind = rng.choice(["flip", "flip-meta", "truncate", "zero-run", "random-run"])
    if kind == "truncate":
        n = rng.randrange(0, len(data))
        del data[n:]
        desc = f"truncate to {n}"
    elif kind in ("zero-run", "random-run"):
        start = rng.randrange(0, len(data))
        n = rng.randint(1, 256)
        for i in range(start, min(len(data), start + n)):
            data[i] = 0 if kind == "zero-run" else rng.randrange(256)
        desc = f"{kind} {n} at {start}"
    else:
        # Metadata (superblock, object headers, heaps) sits mostly in the first KiBs.
        span = min(len(data), 8192) if kind == "flip-meta" else len(data)
        k = rng.randint(1, 8)
        where = sorted(rng.randrange(0, span) for _ in range(k))
        for i in where:
            data[i] ^= 1 << rng.randrange(8)
        desc = f"{kind} bits at {where}"
    open(path, "wb").write(bytes(data))
    return desc


def datasets(f):
    out = []
    f.visititems(lambda n, o: out.append(n) if isinstance(o, h5py.Dataset) else None)
    return out


def groups(f):
    out = []
    f.visititems(lambda n, o: out.append(n) if isinstance(o, h5py.Group) else None)
    return out


def set_config(f, fn):
    cfg = json.loads(f.attrs["config"])
    text = fn(cfg)
    f.attrs["config"] = text if isinstance(text, str) else json.dumps(cfg)


def golden_mutation(rng, path):
    """Applies one structural mutation to a golden; returns (description, may_pass)."""
    with h5py.File(path, "r+") as f:
        names = datasets(f)
        steps = sorted(f["steps"].keys(), key=lambda k: int(k[4:]))
        st = rng.choice(steps)
        ins = f[f"steps/{st}/inputs"]
        kind = rng.randrange(20)
        if kind == 0:
            n = rng.choice(names)
            del f[n]
            return f"delete dataset {n}", n.endswith("request_id")
        if kind == 1:
            g = rng.choice(groups(f))
            del f[g]
            # Without its last step a golden is a shorter golden, valid as such.
            return f"delete group {g}", g == f"steps/{steps[-1]}" and len(steps) > 1
        if kind == 2:
            a = rng.choice(["schema", "schema_version", "config", "case_id", "seed",
                            "tolerance_profile", "generator"])
            del f.attrs[a]
            return f"delete root attribute {a}", False
        if kind == 3:
            a = rng.choice(["schema_version", "seed", "num_blocks"])
            v = rng.choice([2**40, -1, 0, "1", 1.5, 2**32 + 64, 2**31 - 1])
            f.attrs[a] = v
            ok = a == "seed" and isinstance(v, int)
            return f"root attribute {a} = {v!r}", ok
        if kind == 4:
            key = rng.choice(["num_layers", "hidden_size", "num_heads", "kv_lora_rank",
                              "index_topk", "block_size", "qk_rope_head_dim", "rope_theta",
                              "rms_norm_eps", "index_topk_pattern", "precision", "rope_scaling"])
            val = rng.choice([2**32 + 64, 64.9, True, -1, 0, "64", None, 1e300, [], {},
                              2**31 - 1, float("inf")])

            def edit(cfg):
                cfg[key] = val
                return json.dumps(cfg, allow_nan=True)
            set_config(f, edit)
            return f"config {key} = {val!r}", False
        if kind == 5:
            choice = rng.choice(["array", "truncated", "missing-key", "number"])

            def edit(cfg):
                if choice == "array":
                    return json.dumps([cfg])
                if choice == "truncated":
                    return json.dumps(cfg)[: rng.randrange(1, 40)]
                if choice == "number":
                    return "42"
                del cfg[rng.choice(sorted(cfg))]
                return json.dumps(cfg)
            set_config(f, edit)
            return f"config JSON {choice}", False
        if kind == 6:
            floats = [n for n in names if f[n].dtype.kind == "f" or f[n].attrs.get("dtype") in
                      ("bfloat16",)]
            n = rng.choice(floats)
            d = f[n]
            arr = d[()]
            v = rng.choice([np.inf, -np.inf, np.nan])
            flat = arr.reshape(-1)
            i = rng.randrange(flat.size)
            if d.attrs.get("dtype") == "bfloat16":
                flat[i] = {np.inf: 0x7F80, -np.inf: 0xFF80}.get(v, 0x7FC0)
            elif d.attrs.get("dtype") == "float8_e4m3fn":
                flat[i] = 0x7F
            else:
                flat[i] = v
            d[...] = arr
            return f"{v} at {n}[{i}]", False
        if kind == 7:
            if len(steps) < 2:
                return golden_mutation(rng, path)
            victim = rng.choice(steps[:-1])
            del f[f"steps/{victim}"]
            return f"delete {victim} of {len(steps)}", False
        if kind == 8:
            f.move(f"steps/{st}", f"steps/{st}x" if rng.random() < 0.5 else "steps/step99")
            return f"rename {st}", False
        if kind == 9:
            v = rng.choice([2**31 - 1, 20000000, 2**32 + 16, -5, 0, 10**18])
            ins.attrs["capture_size"] = v
            return f"{st} capture_size = {v}", False
        if kind == 10:
            bt = ins["block_table"][()]
            how = rng.choice(["minus2", "hole", "past", "dup", "huge-lazy", "float"])
            if how == "huge-lazy":
                del ins["block_table"]
                d = ins.create_dataset("block_table", shape=(bt.shape[0], 400_000_000),
                                       dtype="int32", chunks=(1, 1 << 20), fillvalue=-1)
                d.attrs["dtype"] = "int32"
                return f"{st} block_table lazily (R, 4e8)", False
            if how == "float":
                del ins["block_table"]
                d = ins.create_dataset("block_table", data=bt.astype(np.float64) + 0.5)
                d.attrs["dtype"] = "int32"
                return f"{st} block_table as non-integral floats", False
            r = rng.randrange(bt.shape[0])
            used = int((bt[r] >= 0).sum())
            if how == "minus2":
                bt[r, rng.randrange(bt.shape[1])] = -2
            elif how == "hole":
                if used < 2:
                    return golden_mutation(rng, path)
                bt[r, 0] = -1
            elif how == "past":
                bt[r, rng.randrange(max(used, 1))] = 1 << 20
            else:
                if bt.size < 2 or (bt >= 0).sum() < 2:
                    return golden_mutation(rng, path)
                ids = np.argwhere(bt >= 0)
                a, b = ids[0], ids[-1]
                bt[tuple(b)] = bt[tuple(a)]
            ins["block_table"][...] = bt
            return f"{st} block_table {how}", False
        if kind == 11:
            c = ins["ctx_len"][()]
            c[rng.randrange(c.size)] = rng.choice([2**31 - 1, -1, 10**9, 2**31 - 2])
            ins["ctx_len"][...] = c
            return f"{st} ctx_len {c.tolist()}", False
        if kind == 12:
            q = ins["q_len"][()]
            q[rng.randrange(q.size)] = rng.choice([0, -1, 10**6, 2**31 - 1])
            ins["q_len"][...] = q
            return f"{st} q_len {q.tolist()}", False
        if kind == 13:
            n = rng.choice(names)
            d = f[n]
            arr = d[()]
            dt = d.attrs.get("dtype")
            del f[n]
            how = rng.choice(["row", "dim", "scalar", "string"])
            if how == "row":
                new = f.create_dataset(n, data=np.concatenate([arr, arr[:1]]) if arr.ndim else arr)
            elif how == "dim":
                new = f.create_dataset(n, data=arr.reshape(-1))
            elif how == "scalar":
                new = f.create_dataset(n, data=np.float64(1.0))
            else:
                new = f.create_dataset(n, data=np.array([b"not a tensor"] * 3))
            if dt is not None:
                new.attrs["dtype"] = dt
            may = how == "dim" and arr.ndim <= 1
            return f"{n} reshaped ({how})", may
        if kind == 14:
            n = rng.choice(names)
            f[n].attrs["dtype"] = rng.choice(["float16", "", "bfloat17", "int64", "float64"])
            return f"{n} dtype attribute {f[n].attrs['dtype']!r}", f[n].attrs["dtype"] == "float64" and f[n].dtype.kind == "f"
        if kind == 15:
            del ins["hidden"]
            D = json.loads(f.attrs["config"])["hidden_size"]
            d = ins.create_dataset("hidden", shape=(10**7, D), dtype="uint16",
                                   chunks=(1024, D), fillvalue=0)
            d.attrs["dtype"] = "bfloat16"
            return f"{st} hidden lazily (1e7, D)", False
        if kind == 16:
            a = rng.choice(["schema_version", "seed", "num_blocks", "schema"])
            f.attrs[a] = np.arange(1000) if a != "schema" else np.array([b"dsv32-golden"] * 9)
            return f"root attribute {a} as an array", False
        if kind == 17:
            g = f"steps/{st}/inputs"
            del f[g]
            f.create_dataset(g, data=np.zeros(4))
            return f"{g} as a dataset", False
        if kind == 18:
            target = rng.choice(["weights", f"steps/{st}/expected"])
            del f[target]
            if rng.random() < 0.5:
                f[target] = h5py.ExternalLink("/nonexistent/elsewhere.h5", "/weights")
                return f"{target} an external link to a missing file", False
            f[target] = h5py.SoftLink("/" + target)
            return f"{target} a soft link to itself", False
        g = f"steps/{st}/expected"
        f.create_dataset(g + "/intruder", data=np.zeros(3))
        return f"an unknown dataset in {g}", True


def candidate_mutation(rng, path):
    """One structural mutation of a candidate; returns (description, may_pass)."""
    with h5py.File(path, "r+") as f:
        names = datasets(f)
        kind = rng.randrange(9)
        n = rng.choice(names)
        if kind == 0:
            del f[n]
            return f"delete {n}", not n.endswith("output")
        if kind == 1:
            d = f[n]
            arr = d[()].astype(np.float64)
            flat = arr.reshape(-1)
            v = rng.choice([np.inf, -np.inf, np.nan])
            if n.endswith("topk"):
                v = rng.choice([-5, 10**9, -(2**31)])
            flat[rng.randrange(flat.size)] = v
            del f[n]
            new = f.create_dataset(n, data=arr)
            new.attrs["dtype"] = "float64" if not n.endswith("topk") else "int32"
            return f"{v} in {n}", False
        if kind == 2:
            arr = f[n][()]
            del f[n]
            f.create_dataset(n, data=np.concatenate([arr, arr[:1]]))
            return f"{n} one row more", False
        if kind == 3:
            steps = sorted(f["steps"].keys(), key=lambda k: int(k[4:]))
            del f[f"steps/{steps[0]}"]
            return "no step0", False
        if kind == 4:
            steps = sorted(f["steps"].keys(), key=lambda k: int(k[4:]))
            f.move(f"steps/{steps[-1]}", "steps/step77")
            return "a step past the golden's", False
        if kind == 5:
            f.create_dataset("steps/step0/expected/layer0/bogus", data=np.zeros(2))
            return "an unknown stage", False
        if kind == 6:
            del f[n]
            f.create_dataset(n, shape=(2**20, 2**12), dtype="float32", chunks=(64, 4096))
            return f"{n} lazily (2^20, 2^12)", False
        if kind == 7:
            f[n].attrs["dtype"] = rng.choice(["float16", "", "int8"])
            return f"{n} dtype attribute", False
        del f[n]
        f.create_dataset(n, data=np.array([b"text"] * 2))
        return f"{n} as strings", False


# Content that judging reads, for the silent-pass check of byte flips.
# The attributes the reader reads: a flip that renames any other (or `num_blocks`, which only
# sizes the cache; unused slots are poisoned, so no result depends on it) changes nothing judged.
JUDGED_ATTRS = {"schema", "schema_version", "config", "dtype", "capture_size"}


def package_content(path):
    """What dsv32.read_golden reads of a golden: for a file whose objects h5py cannot visit (a
    flipped bit in metadata the tool does not read), compared with the fixture read the same
    way. The tool has read the file already (--check --bitwise passed), so the package's own
    reading is what is compared, without running the tool again."""
    g = dsv32.read_golden(path, validate_with_tool=False)
    out = {f"@{k}": repr(v) for k, v in g.attrs.items() if k in JUDGED_ATTRS}
    for l, w in enumerate(g.weights):
        out.update({f"weights/layer{l}/{k}": v.tobytes() for k, v in w.items()})
    for s, st in enumerate(g.steps):
        for group, tensors in (("inputs", st.inputs), ("expected", st.expected),
                               ("emulated", st.emulated)):
            out.update({f"steps/step{s}/{group}/{k}": v.tobytes()
                        for k, v in tensors.items() if k != "request_id"})
        out[f"steps/step{s}/inputs@capture_size"] = st.capture_size
    return out


@functools.lru_cache(maxsize=None)
def golden_of(path):
    """A committed golden, read once (each read runs the tool's reader first)."""
    return dsv32.read_golden(path)


def h5py_content(path):
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            for k, v in obj.attrs.items():
                if k in JUDGED_ATTRS:
                    out[f"{name}@{k}"] = repr(v)
            if isinstance(obj, h5py.Dataset) and not name.endswith("request_id"):
                out[name] = obj[()].tobytes()
        visit("", f)
        f.visititems(visit)
    return out


# ---------------------------------------------------------------------------------------------

def make_candidate(golden_path, out):
    g = dsv32.read_golden(golden_path)
    dsv32.write_candidate(out, [{k: v.copy() for k, v in s.expected.items()} for s in g.steps])


def case_file_case(tool, fixtures, scratch, seed, index, rng):
    """A mutated case file (or its Hugging Face config) given to `golden --spec`: exit 0, 1 or
    2 within the bounds, and a refusal leaves nothing, a success whole files."""
    hf_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "hf")
    path, desc = case_file_mutation(rng, fixtures, hf_dir, scratch, index)
    out = os.path.join(scratch, f"case{index}.out")
    rc, secs, rss, err = run_measured(tool, ["golden", "--spec", path, "--out", out,
                                             "--max-gib", "1"])
    problem = run_problem(rc, err) or refused_or_whole(rc, out)
    if not problem:
        shutil.rmtree(out, ignore_errors=True)
        for p in (path, path[:-len(".json")] + ".hf.json"):
            if os.path.exists(p):
                os.unlink(p)
    return {"index": index, "seed": seed, "base": "case file", "target": "case",
            "family": "structure", "mutation": desc,
            "runs": [{"run": "golden --spec", "rc": rc if rc != "timeout" else -999,
                      "seconds": secs, "rss_kib": rss, "problem": problem,
                      "stderr": err.strip()[-200:]}]}


def run_problem(rc, err):
    """What is wrong with any run's ending, or "": a signal, a hang, an exit other than 0, 1 or
    2, a bare allocation failure, a refusal without a message."""
    if rc == "timeout":
        return f"no verdict within {TIMEOUT_S} s"
    if rc < 0:
        return f"killed by signal {-rc}"
    if rc not in (0, 1, 2):
        return f"exit {rc}"
    if "bad_alloc" in err or "cannot allocate" in err.lower():
        return "an allocation failed (unbounded?)"
    if rc == 2 and "dsv32" not in err and "Run with --help" not in err:
        return "exit 2 without a message"
    return ""


def one_case(tool, fixtures, scratch, seed, index, candidates, contents):
    rng = random.Random(f"{seed}/{index}")
    base = rng.choice(BASES)
    ref = os.path.join(fixtures, base + ".h5")
    cand = candidates[base]
    target = rng.choice(["golden", "golden", "candidate", "candidate", "case"])
    if target == "case":
        return case_file_case(tool, fixtures, scratch, seed, index, rng)
    family = rng.choice(["bytes", "bytes", "structure"])
    mut = os.path.join(scratch, f"case{index}.h5")
    shutil.copy(cand if target == "candidate" else ref, mut)
    try:
        if family == "bytes":
            desc, may_pass = flip_bytes(rng, mut), None
        elif target == "golden":
            desc, may_pass = golden_mutation(rng, mut)
        elif rng.random() < 0.3:  # never passes, in whichever layer it lands
            with h5py.File(mut, "r+") as f:
                desc, may_pass = malformed_topk_row(rng, f, golden_of(ref)), False
            if desc is None:
                raise ValueError("no top-k row can be made malformed")
        else:
            desc, may_pass = candidate_mutation(rng, mut)
    except Exception as e:  # noqa: BLE001 h5py could not make this mutation: a flip instead
        shutil.copy(cand if target == "candidate" else ref, mut)
        may_pass, family = None, "bytes"
        desc = f"after a failed mutation ({e}): {flip_bytes(rng, mut)}"
    if target == "golden":
        runs = [("diff", ["diff", mut, ref]),
                ("check", ["golden", "--check", mut, "--bitwise"]),
                ("judge", ["judge", cand, "--golden", mut])]
    else:
        runs = [("judge", ["judge", mut, "--golden", ref])]
    results = []
    for what, args in runs:
        rc, secs, rss, err = run_measured(tool, args)
        problem = run_problem(rc, err)
        if problem:
            pass
        elif rc == 0 and family == "structure" and may_pass is False and what != "diff":
            problem = "passed a mutation that changes what is judged"
        elif rc == 0 and family == "bytes" and what == "check":
            try:  # both sides read the same way: h5py's view, or where it fails the package's
                try:
                    same = h5py_content(mut) == contents[base]
                except (RuntimeError, OSError, KeyError):
                    same = package_content(mut) == package_content(ref)
            except Exception:  # noqa: BLE001
                same = False
            if not same:
                problem = "--check --bitwise passed a file whose judged content changed"
        results.append({"run": what, "rc": rc if rc != "timeout" else -999, "seconds": secs,
                        "rss_kib": rss, "problem": problem, "stderr": err.strip()[-200:]})
    if not any(r["problem"] for r in results):
        os.unlink(mut)
    return {"index": index, "seed": seed, "base": base, "target": target, "family": family,
            "mutation": desc, "runs": results}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--scratch", required=True)
    ap.add_argument("--seed", type=int, default=29)
    ap.add_argument("--default-cases", type=int, default=300)
    ap.add_argument("--cases", type=int, default=None)
    ap.add_argument("--only", type=int, default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    a = ap.parse_args()
    if a.cases is None:
        a.cases = int(os.environ.get("DSV32_FUZZ_CASES", a.default_cases))
    os.makedirs(a.scratch, exist_ok=True)
    candidates, contents = {}, {}
    for b in BASES:
        candidates[b] = os.path.join(a.scratch, f"{b}.candidate.h5")
        make_candidate(os.path.join(a.fixtures, b + ".h5"), candidates[b])
        contents[b] = h5py_content(os.path.join(a.fixtures, b + ".h5"))
    indices = [a.only] if a.only is not None else list(range(a.cases))
    print(f"fuzz_inputs: seed {a.seed}, {len(indices)} cases, {a.jobs} at a time "
          f"(replay one: --seed {a.seed} --only I)", flush=True)
    t0 = time.monotonic()
    done = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as pool:
        futs = [pool.submit(one_case, a.tool, a.fixtures, a.scratch, a.seed, i, candidates,
                            contents) for i in indices]
        for n, fut in enumerate(concurrent.futures.as_completed(futs), 1):
            try:
                done.append(fut.result())
            except Exception as e:  # noqa: BLE001 the harness's own failure is a failure too
                i = indices[futs.index(fut)]
                done.append({"index": i, "seed": a.seed, "base": "?", "target": "?",
                             "family": "harness", "mutation": "?",
                             "runs": [{"run": "harness", "rc": -998, "seconds": 0, "rss_kib": 0,
                                       "problem": f"harness error: {e!r}", "stderr": ""}]})
            if n % 50 == 0 or n == len(futs):
                print(f"  {n}/{len(futs)} cases, {time.monotonic() - t0:.0f} s", flush=True)
    done.sort(key=lambda c: c["index"])
    runs = [(c, r) for c in done for r in c["runs"]]
    by_rc = {}
    for _, r in runs:
        by_rc[r["rc"]] = by_rc.get(r["rc"], 0) + 1
    bad = [(c, r) for c, r in runs if r["problem"]]
    longest = max(runs, key=lambda cr: cr[1]["seconds"])
    largest = max(runs, key=lambda cr: cr[1]["rss_kib"])
    print(f"\n{'family':<10} {'target':<10} {'cases':>6} {'exit 0':>7} {'exit 1':>7} "
          f"{'exit 2':>7} {'problems':>9}")
    for fam in ("bytes", "structure"):
        for tgt in ("golden", "candidate", "case"):
            cs = [c for c in done if c["family"] == fam and c["target"] == tgt]
            rs = [r for c in cs for r in c["runs"]]
            print(f"{fam:<10} {tgt:<10} {len(cs):>6} "
                  + " ".join(f"{sum(r['rc'] == k for r in rs):>7}" for k in (0, 1, 2))
                  + f" {sum(bool(r['problem']) for r in rs):>9}")
    print(f"\n{len(done)} cases, {len(runs)} runs: exit codes {dict(sorted(by_rc.items()))}; "
          f"problems {len(bad)}")
    contained = {k: sum(k in r["stderr"] for _, r in runs) for k in
                 ("the HDF5 library crashed", "the HDF5 library gave no answer",
                  "the reader's memory bound")}
    print("contained inside libhdf5 (the file refused, this process unharmed): "
          + ", ".join(f"{k.replace('the HDF5 library ', '')} {v}" for k, v in contained.items()))
    print(f"longest run: {longest[1]['seconds']:.2f} s ({longest[1]['run']} of case "
          f"{longest[0]['index']}: {longest[0]['mutation']})")
    print(f"largest run: {largest[1]['rss_kib'] / 1024:.0f} MiB resident ({largest[1]['run']} of "
          f"case {largest[0]['index']}: {largest[0]['mutation']})")
    for c, r in bad:
        print(f"FAIL case {c['index']} (--seed {c['seed']} --only {c['index']}): {c['base']} "
              f"{c['target']} {c['mutation']}: {r['run']}: {r['problem']}; {r['stderr']}")
    if a.json:
        with open(a.json + ".tmp", "w") as f:
            json.dump({"seed": a.seed, "cases": len(done), "runs": len(runs),
                       "exit_codes": {str(k): v for k, v in by_rc.items()},
                       "problems": len(bad), "contained": contained,
                       "longest_s": longest[1]["seconds"],
                       "largest_rss_kib": largest[1]["rss_kib"],
                       "seconds": time.monotonic() - t0, "results": done}, f, indent=1)
        os.replace(a.json + ".tmp", a.json)
    print(f"{time.monotonic() - t0:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
