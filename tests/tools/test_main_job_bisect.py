"""A failing row of the main job says how to bisect it, and the command runs as printed
(issue 53): `dsv32 selfcheck --mutant M` with a DCP mutant switched on fails its DCP row, prints
`to bisect "ROW": COMMAND` (and the JSON row's `bisect`), and COMMAND, split as a shell splits
it, names the op the mutant broke. Skips without a GPU (the GPU rows do not run)."""
import json
import os
import shlex
import subprocess

import pytest

TOOL = os.environ.get("DSV32_TOOL", "dsv32")
MUTANT = "dcp-share-prefix"


def run(args, timeout=600):
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


@pytest.fixture(scope="module")
def main_job(tmp_path_factory):
    out = tmp_path_factory.mktemp("main-job") / "selfcheck.json"
    code, text = run([TOOL, "selfcheck", "--mutant", MUTANT, "--json", str(out)])
    if code == 2 and "GPU rows did not run" in text:
        pytest.skip("no GPU here: the GPU rows do not run")
    return code, text, json.loads(out.read_text())


def test_the_failing_row_prints_its_bisect_command(main_job):
    code, text, report = main_job
    assert code == 1, text[-800:]
    failing = [r for r in report["rows"] if r["status"] == "FAIL"]
    assert [r["check"] for r in failing] and all("dcp" in r["check"] for r in failing), failing
    for r in failing:
        assert f'to bisect "{r["check"]}": {r["bisect"]}' in text, text[-800:]
        assert "--case dcp-bait" in r["bisect"] and f"--mutant {MUTANT}" in r["bisect"], r


def test_the_printed_command_runs_as_printed_and_names_the_op(main_job):
    _, _, report = main_job
    command = next(r["bisect"] for r in report["rows"] if r["status"] == "FAIL")
    code, text = run(shlex.split(command))
    row = [line.split() for line in text.splitlines() if line.startswith(MUTANT + " ")]
    # mutant, case, plan, verdict, op, layer, first divergence; exit 1: it diverged.
    assert code == 1 and row and row[0][1] == "dcp-bait" and row[0][3:5] == ["data", "sparse_mqa"], \
        text[-800:]
