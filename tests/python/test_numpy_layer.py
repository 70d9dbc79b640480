#!/usr/bin/python3
"""The worked example (python/examples/numpy_layer.py, the layer in numpy from MATH.md) judged
through the Python package: it passes on every committed golden, and each of its deliberate
defects fails, naming the stage where the bug shows.

usage: test_numpy_layer.py FIXTURES_DIR SCRATCH_DIR   (DSV32_TOOL names the dsv32 tool)
Exit 77 (a ctest skip) without numpy or h5py."""
import glob
import os
import sys

try:
    import h5py  # noqa: F401
    import numpy  # noqa: F401
except ImportError as e:
    print(f"skipped: {e} (install python3-h5py and python3-numpy)")
    sys.exit(77)

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "python"))
sys.path.insert(0, os.path.join(here, "..", "..", "python", "examples"))
import dsv32  # noqa: E402
import numpy_layer  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from checklist import check, finish  # noqa: E402

FIXTURES, SCRATCH = sys.argv[1], sys.argv[2]
os.makedirs(SCRATCH, exist_ok=True)


def run(golden_path, defect=None):
    golden = dsv32.read_golden(golden_path)
    stack = numpy_layer.Stack(golden, defect)
    name = os.path.basename(golden_path)[:-3] + (f"-{defect}" if defect else "")
    path = os.path.join(SCRATCH, name + ".h5")
    dsv32.write_candidate(path, [stack.step(s.inputs) for s in golden.steps])
    return dsv32.judge(path, golden_path)


for path in sorted(glob.glob(os.path.join(FIXTURES, "*.h5"))):
    v = run(path)
    check(f"{os.path.basename(path)}: the numpy layer passes", v.passed,
          v.failures[:2] or v.not_provided[:3])
    check(f"{os.path.basename(path)}: every stage judged", not v.not_provided, v.not_provided)

# Each defect fails where it shows: MLA RoPE on the wrong pairs at kR, a causal range one short
# at topk, a latent that never reaches the cache at c (the latent read back).
for case in ("default", "ctx-around-k"):
    path = os.path.join(FIXTURES, case + ".h5")
    for defect, stage in (("rope-pairs", "kR"), ("topk-off-by-one", "topk"),
                          ("stale-cache", "c")):
        v = run(path, defect)
        check(f"{case} with {defect}: fails at {stage}",
              not v.passed and v.first_failure["stage"] == stage, v.first_failure)

finish()
