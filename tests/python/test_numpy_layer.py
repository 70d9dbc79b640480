"""The worked example (python/examples/numpy_layer.py, the layer in numpy from MATH.md) judged
through the Python package: it passes on every committed golden, and each of its deliberate
defects fails, naming the stage where the bug shows.

    DSV32_TOOL=build/default/tools/dsv32 python3 -m pytest tests/python/test_numpy_layer.py
(ctest: Python.TheNumpyLayerPassesAndItsDefectsAreNamed.) Skips without numpy or h5py."""
import glob
import os

import pytest

pytest.importorskip("h5py", reason="install python3-h5py")
pytest.importorskip("numpy", reason="install python3-numpy")
import dsv32  # noqa: E402
import example_layers  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.environ.get("DSV32_FIXTURES") or os.path.join(ROOT, "fixtures")
GOLDENS = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(FIXTURES, "*.h5")))


def run(scratch, case, defect=None):
    golden_path = os.path.join(FIXTURES, case + ".h5")
    golden = dsv32.read_golden(golden_path)
    stack = example_layers.load("numpy_layer").Stack(golden, defect)
    path = os.path.join(scratch, case + (f"-{defect}" if defect else "") + ".h5")
    dsv32.write_candidate(path, [stack.step(s.inputs) for s in golden.steps])
    return dsv32.judge(path, golden_path)


@pytest.fixture(scope="module", params=GOLDENS)
def verdict(request, scratch):
    return run(scratch, request.param)


def test_the_numpy_layer_passes(verdict):
    assert verdict.passed, verdict.failures[:2] or verdict.not_provided[:3]


def test_every_stage_judged(verdict):
    assert not verdict.not_provided, verdict.not_provided


# Each defect fails where it shows: MLA RoPE on the wrong pairs at kR, a causal range one short
# at topk, a latent that never reaches the cache at c (the latent read back).
@pytest.mark.parametrize("defect,stage", [("rope-pairs", "kR"), ("topk-off-by-one", "topk"),
                                          ("stale-cache", "c")])
@pytest.mark.parametrize("case", ["default", "ctx-around-k"])
def test_a_defect_fails_at_its_stage(scratch, case, defect, stage):
    v = run(scratch, case, defect)
    assert not v.passed and v.first_failure["stage"] == stage, v.first_failure
