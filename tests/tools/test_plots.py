"""tools/plot_bench.py makes every figure from the committed benchmark JSON (docs/), each a PNG
of plausible size, and refuses a JSON of another mode by naming the missing key.

    python3 -m pytest tests/tools/test_plots.py
(ctest: Plots.FiguresFromTheCommittedBenchmarks.) Skips without matplotlib."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("matplotlib", reason="install python3-matplotlib")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = os.path.join(ROOT, "docs")
SCRIPT = os.path.join(ROOT, "tools", "plot_bench.py")
INPUTS = {"whatif": os.path.join(DOCS, "bench-gpu-whatif.json"),
          "per-op": os.path.join(DOCS, "bench-gpu-per-op-decode.json"),
          "memory": os.path.join(DOCS, "bench-gpu-memory.json")}


def plot(scratch, *args):
    return subprocess.run([sys.executable, SCRIPT, "--out", scratch, *args],
                          capture_output=True, text=True)


@pytest.mark.parametrize("flag", list(INPUTS))
def test_a_figure_from_the_committed_json(scratch, flag):
    png = os.path.join(scratch, flag + ".png")
    if os.path.exists(png):
        os.remove(png)
    extra = ["--preset", "dsv32"] if flag == "per-op" else []
    r = plot(scratch, f"--{flag}", INPUTS[flag], *extra)
    assert r.returncode == 0 and os.path.exists(png), r.stderr.strip()
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(png) > 10000, os.path.getsize(png)


def test_a_per_op_json_given_as_memory_is_refused_by_name(scratch):
    # A JSON of another mode: the key it lacks is named, nothing is drawn.
    png = os.path.join(scratch, "memory.png")
    if os.path.exists(png):
        os.remove(png)
    r = plot(scratch, "--memory", INPUTS["per-op"])
    assert r.returncode != 0 and "'runs'" in r.stderr and not os.path.exists(png), r.stderr.strip()


def test_a_missing_file_is_refused_by_name(scratch):
    r = plot(scratch, "--whatif", os.path.join(scratch, "no-such.json"))
    assert r.returncode != 0 and "no-such.json" in r.stderr, r.stderr.strip()
