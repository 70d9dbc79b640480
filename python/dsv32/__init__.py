"""dsv32-oracle from Python: read golden files, write a candidate, judge it.

    import dsv32
    golden = dsv32.read_golden("fixtures/default.h5")
    dsv32.write_candidate("mine.h5", [my_layer(golden, step) for step in golden.steps])
    verdict = dsv32.judge("mine.h5", "fixtures/default.h5")
    assert verdict.passed, verdict.first_failure

numpy and h5py are required; torch tensors are accepted where arrays are. The candidate layout
is docs/CANDIDATE.md; judging is `dsv32 judge` (TESTING.md's rules), found as $DSV32_TOOL, on
PATH, or in this checkout's build folders.
"""
try:
    import h5py  # noqa: F401
except ImportError as e:  # not a declared dependency (pyproject.toml says why)
    raise ImportError(f"dsv32 needs h5py ({e}): apt install python3-h5py, or pip install h5py") from e

from .formats import bf16_bits, bf16_values, e4m3_values
from .golden import Golden, GoldenFileError, Prefix, Step, read_golden
from .candidate import write_candidate
from ._files import OutputError
from ._tool import ToolError, ToolNotFound
from .verdict import JudgeError, Verdict, judge
from . import dcp

__all__ = ["Golden", "GoldenFileError", "Prefix", "Step", "read_golden", "write_candidate", "judge",
           "Verdict", "JudgeError", "OutputError", "dcp", "ToolError", "ToolNotFound", "bf16_bits", "bf16_values", "e4m3_values"]
