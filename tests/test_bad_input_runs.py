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
from bad_input_tool import DEFAULT, SCRATCH, TOOL, bounded, copy, edit, expect, tool  # noqa: E402
from checklist import check, finish  # noqa: E402

import h5py  # noqa: E402

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
