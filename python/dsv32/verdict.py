"""Judging a candidate through `dsv32 judge` and reading its verdict."""
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field


class JudgeError(RuntimeError):
    """`dsv32 judge` refused its input (exit 2): the message names the problem."""


@dataclass
class Verdict:
    passed: bool
    first_failure: dict = None  # step, layer (-1: output), stage, message
    failures: list = field(default_factory=list)
    not_provided: list = field(default_factory=list)
    stages: list = field(default_factory=list)  # per stage: status, worst_ratio, ...
    report: dict = field(default_factory=dict)  # the whole JSON report
    coverage: dict = field(default_factory=dict)  # what the run exercised (docs/COVERAGE.md)
    text: str = ""  # the table `dsv32 judge` printed

    def __bool__(self):
        return self.passed


def _checkout():
    """The checkout this package comes from: where it lies, or where an installed wheel was
    built (dsv32/_checkout.py, written by python/_build/backend.py)."""
    try:
        from ._checkout import CHECKOUT
        return CHECKOUT
    except ImportError:
        return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def find_tool():
    """$DSV32_TOOL, `dsv32` on PATH, or the checkout's build/*/tools/dsv32."""
    if os.environ.get("DSV32_TOOL"):
        tool = os.environ["DSV32_TOOL"]
        if not os.access(tool, os.X_OK):
            raise FileNotFoundError(f"DSV32_TOOL={tool} is not an executable file")
        return tool
    if shutil.which("dsv32"):
        return shutil.which("dsv32")
    root = _checkout()
    for preset in ("default", "cpu", "ci", "gpu", "asan"):
        p = os.path.join(root, "build", preset, "tools", "dsv32")
        if os.access(p, os.X_OK):
            return p
    raise FileNotFoundError(
        f"no dsv32 tool: not in $DSV32_TOOL, not on PATH, not in {root}/build/*/tools/. Build it "
        f"(cmake --preset cpu && cmake --build --preset cpu, README) or set DSV32_TOOL to it")


def judge(candidate, golden, tool=None, tp=1, require=()):
    """Judges candidate file `candidate` against golden file `golden` (TESTING.md's rules).
    `require`: coverage requirements ("pruned>=50%", docs/COVERAGE.md); one not met fails the
    verdict (first_failure's stage "require")."""
    tool = tool or find_tool()
    flags = [f for r in require for f in ("--require", r)]
    with tempfile.TemporaryDirectory() as d:
        report = os.path.join(d, "report.json")
        p = subprocess.run([tool, "judge", candidate, "--golden", golden, "--json", report,
                            "--tp", str(tp), *flags], capture_output=True, text=True)
        if p.returncode not in (0, 1) or not os.path.exists(report):
            raise JudgeError((p.stderr or p.stdout).strip())
        with open(report) as f:
            r = json.load(f)
    # A failure that no finite ratio measures is "inf" in the JSON (JSON has no infinity).
    for d in [r] + r["stages"]:
        if d.get("worst_ratio") == "inf":
            d["worst_ratio"] = float("inf")
    return Verdict(passed=r["verdict"] == "pass", first_failure=r.get("first_failure"),
                   failures=r["failures"], not_provided=r["not_provided"], stages=r["stages"],
                   report=r, coverage=r.get("coverage", {}), text=p.stdout)
