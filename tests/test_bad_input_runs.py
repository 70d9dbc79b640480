#!/usr/bin/python3
"""Bad input, the fourth probe (issue 49; docs/BAD_INPUT.md): a stage the judge would skip, runs
of `dsv32 golden` that must be whole or not at all (concurrent writers of one case, a run that
fails after its first outputs, an output path that is a directory), a filter this libhdf5 cannot
decode, threads that cannot fit the address space, and two outputs on one path. Each runs as a
user would, bounded (bad_input_tool), and expects an exit code and the words that name the
problem.

usage: test_bad_input_runs.py FIXTURES_DIR SCRATCH_DIR   (DSV32_TOOL names the dsv32 tool)"""
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bad_input_tool import DEFAULT, SCRATCH, copy, edit, expect, tool  # noqa: E402
from checklist import check, finish  # noqa: E402


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

finish()
