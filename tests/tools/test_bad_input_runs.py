#!/usr/bin/python3
"""Bad input, the fourth probe (issue 49; docs/BAD_INPUT.md): a stage the judge would skip, runs
of `dsv32 golden` that must be whole or not at all (concurrent writers of one case, a run that
fails after its first outputs, an output path that is a directory), a filter this libhdf5 cannot
decode, threads that cannot fit the address space, and two outputs on one path. Each runs as a
user would, bounded (bad_input_tool), and expects an exit code and the words that name the
problem.

usage: test_bad_input_runs.py FIXTURES_DIR SCRATCH_DIR   (DSV32_TOOL names the dsv32 tool)"""
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bad_input_tool import (DEFAULT, SCRATCH, TOOL, bounded, compressed_copy, copy, edit,  # noqa: E402
                            expect, tool)
from checklist import check, finish  # noqa: E402


STEPS = [{"requests": [{"id": 0, "new_tokens": 3}]}]


def case_file(file, **root):
    """A case file FILE.json of a tiny case named FILE unless `root` says otherwise."""
    p = os.path.join(SCRATCH, file + ".json")
    with open(p, "w") as f:
        json.dump({"name": file, "config": {"preset": "tiny"}, "steps": STEPS, **root}, f)
    return p


def out_dir(name):
    d = os.path.join(SCRATCH, name)
    os.makedirs(d, exist_ok=True)
    return d


def md5(path):
    with open(path, "rb") as f:
        return hashlib.md5(f.read()).hexdigest()


def snapshot(d):
    """Every file of d (recursively) with its bytes' hash, directories as 'dir'."""
    out = {}
    for root, dirs, files in os.walk(d):
        for n in dirs:
            out[os.path.relpath(os.path.join(root, n), d)] = "dir"
        for n in files:
            out[os.path.relpath(os.path.join(root, n), d)] = md5(os.path.join(root, n))
    return out


# A. Every stage given is judged: a scale without its codes (or codes without their scale) is
# refused naming the stage, not skipped (all-zero scales once passed, exit 0).
for drop, zero, words in (
        (["kI8"], "kI_scale", "kI_scale: provided without kI8"),
        (["qI8", "omega"], "qI_scale", "qI_scale: provided without qI8 and omega"),
        (["kI_scale"], "kI8", "kI8: provided without kI_scale")):
    def strip(f):
        for s in f["steps"]:
            e = f["steps"][s]["expected"]
            for layer in [n for n in e if n != "output" and "kI8" in e[n]]:
                for name in drop:
                    del e[layer][name]
                e[layer][zero][...] = 0
    cand = edit(copy("default", f"without-{drop[0]}"), strip)
    expect(f"a candidate with {zero} and no {drop[0]} is refused, not passed",
           tool("judge", cand, "--golden", DEFAULT), 2, "/steps/step0/expected/layer0/" + words,
           "leave out " + zero)

# B. One case name written by runs into one --out: the manifest describes the golden that is
# there. Each run's golden once took its name and was hashed outside the directory's lock, so a
# run that renamed first and took the lock last recorded its hash over another run's file. Now
# nothing in the directory changes while another holds its lock: the test holds it (flock on the
# directory, as the tool takes it) while two runs of one case name make their goldens.
known = {}
specs = [case_file(f"race{s}", name="race", seed=s) for s in (1, 2, 3)]
for s, spec in enumerate(specs):
    d = out_dir(f"race-alone{s}")
    tool("golden", "--spec", spec, "--out", d)
    entry = json.load(open(os.path.join(d, "MANIFEST.json")))["cases"][0]
    known[entry["fnv1a64"]] = (md5(os.path.join(d, "race.h5")), entry["bytes"])
check("three seeds make three different goldens", len({m for m, _ in known.values()}) == 3,
      known)


def waits_for_lock(p, timeout=60):
    """Whether run p sleeps in flock (or has ended) within `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if p.poll() is not None:
            return True
        try:
            if "lock" in open(f"/proc/{p.pid}/wchan").read():
                return True
        except OSError:
            time.sleep(2)  # no wchan here: give the run the time a tiny case takes, and more
            return True
        time.sleep(0.02)
    return False


def settled(d):
    return {n: h for n, h in snapshot(d).items() if not n.endswith(".tmp")}


d = out_dir("race")
tool("golden", "--spec", specs[2], "--out", d)
before = settled(d)
lock = os.open(d, os.O_RDONLY)
fcntl.flock(lock, fcntl.LOCK_EX)
procs = []
for spec in specs[:2]:
    procs.append(subprocess.Popen([TOOL, "golden", "--spec", spec, "--out", d],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  preexec_fn=bounded()))
    waits = waits_for_lock(procs[-1])
    check(f"run {len(procs)} changes nothing while another holds the directory's lock",
          waits and settled(d) == before, f"waits {waits}: {before} then {settled(d)}")
fcntl.flock(lock, fcntl.LOCK_UN)
os.close(lock)
codes = [p.wait(timeout=120) for p in procs]
entry = json.load(open(os.path.join(d, "MANIFEST.json")))["cases"][0]
golden = os.path.join(d, "race.h5")
check("two runs of one case into one --out both succeed", codes == [0, 0], codes)
check("... and the manifest describes the golden that is there",
      known.get(entry["fnv1a64"]) == (md5(golden), os.path.getsize(golden)),
      f"manifest {entry['fnv1a64']} is {known.get(entry['fnv1a64'])}, the file {md5(golden)}")
check("... and no temporary file is left", not [n for n in os.listdir(d) if n.endswith(".tmp")],
      os.listdir(d))

# C. A run is whole or not at all: one that fails after its first case leaves the directory as
# it was (the first case's golden and skeleton were once left behind, unlisted in the manifest).
first = case_file("first")
d = out_dir("whole")
expect("a run into a fresh --out", tool("golden", "--spec", first, "--out", d), 0, "first.h5")
before = snapshot(d)
again = case_file("first-again", name="first", seed=2)
for name, bad, words in (
        ("an unmet require", case_file("unmet", require=["largest_tie>=300"]),
         "case unmet does not exercise what it claims"),
        ("unusable gates", case_file("eps", config={"preset": "tiny", "rms_norm_eps": 1e300}),
         "could not judge a candidate")):
    expect(f"a second case with {name} fails the run",
           tool("golden", "--spec", again, "--spec", bad, "--out", d), 2, words)
    check(f"... and leaves every file and the manifest as they were ({name})",
          snapshot(d) == before, (sorted(before), sorted(snapshot(d))))

# D. Every output path of every case is checked before any work (a directory in the way was
# found after every step was computed).
for taken in ("second.h5", "second.candidate.json", "MANIFEST.json"):
    d = out_dir(f"taken-{taken}")
    os.makedirs(os.path.join(d, taken))
    code, out = tool("golden", "--spec", case_file("first"), "--spec", case_file("second"),
                     "--out", d)
    expect(f"an output path that is a directory ({taken}) is refused",
           (code, out), 2, os.path.join(d, taken), "is a directory")
    check(f"... before any work ({taken})", "step 1/1" not in out, out[-400:])
    check(f"... and nothing is written ({taken})", snapshot(d) == {taken: "dir"}, snapshot(d))

# E. A filter this libhdf5 cannot decode is named (h5py's lzf was called "truncated or corrupt").
lzf = compressed_copy("default", "lzf", "lzf")
words = ("uses the HDF5 filter lzf (id 32000), which this libhdf5 cannot decode",
         "uncompressed or with gzip")
expect("a golden compressed with lzf is refused naming the filter", tool("diff", lzf, DEFAULT), 2,
       "lzf.h5:/weights/layer0/w_qkv_a: ", *words)
expect("a candidate compressed with lzf is refused naming the filter",
       tool("judge", lzf, "--golden", DEFAULT), 2, "lzf.h5:/steps/step0/expected/layer0/", *words)

# E. Threads whose stacks cannot fit the address space are refused by name before anything runs
# (OMP_NUM_THREADS=1000 under 4 GiB ended in libgomp's "Thread creation failed").
if not os.environ.get("DSV32_NO_MEMORY_LIMIT"):  # the bound is what is checked
    for env in ({"OMP_NUM_THREADS": "1000"}, {"OMP_NUM_THREADS": "100", "OMP_STACKSIZE": "64M"}):
        said = " ".join(f"{k}={v}" for k, v in env.items())
        d = out_dir("omp")
        code, out = tool("golden", "--case", "kv-fp8", "--out", d, env=env)
        expect(f"{said} under a 4 GiB address space is refused by name", (code, out), 2,
               "bad environment: OMP_NUM_THREADS=", "threads with a stack of", "ulimit -v")
        check(f"... before anything runs ({said})", "step 1/2" not in out and os.listdir(d) == [],
              out[-300:])
    expect("OMP_STACKSIZE=lots is refused by name",
           tool("golden", "--list", env={"OMP_STACKSIZE": "lots"}), 2, "OMP_STACKSIZE='lots'")
    expect("... and 100 threads of the default stack still run",
           tool("golden", "--case", "kv-fp8", "--out", out_dir("omp-100"),
                env={"OMP_NUM_THREADS": "100"}), 0, "kv-fp8.h5")

# F. No two outputs on one path and no output over an input, in every command, compared as
# paths also when the files do not exist yet (`gpu G --json F --dump F` once passed a check that
# compared existing files only). `gpu` parses its outputs on a machine without a GPU too.
for json_path, dump in (("same.h5", "same.h5"), ("sub/../same.h5", "./same.h5")):
    os.makedirs(os.path.join(SCRATCH, "sub"), exist_ok=True)
    expect(f"gpu --json {json_path} --dump {dump} is refused",
           tool("gpu", DEFAULT, "--json", os.path.join(SCRATCH, json_path), "--dump",
                os.path.join(SCRATCH, dump)), 2, "name one file")
    check(f"... and writes nothing ({dump})", not os.path.exists(os.path.join(SCRATCH, dump)))
d = out_dir("manifest-spec")
spec = os.path.join(d, "MANIFEST.json")
with open(spec, "w") as f:
    json.dump({"name": "m", "config": {"preset": "tiny"}, "steps": STEPS}, f)
before = md5(spec)
expect("a case file where the run's manifest goes is refused",
       tool("golden", "--spec", spec, "--out", d), 2, "the manifest", "is also an input")
check("... and it is left as it was", md5(spec) == before and os.listdir(d) == ["MANIFEST.json"],
      os.listdir(d))

finish()
