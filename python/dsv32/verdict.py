"""Judging a candidate through `dsv32 judge` and reading its verdict."""
import json
import os
import tempfile
from dataclasses import dataclass, field

from . import _tool
from ._tool import ToolError, ToolNotFound, find_tool  # noqa: F401 (the package's names)


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


def _requirements(require):
    """`require` as a tuple of strings: one requirement may be given as a string alone."""
    if isinstance(require, str):
        return (require,)
    try:
        items = tuple(require)
    except TypeError:
        raise ValueError(f"judge: require is a {type(require).__name__}; give a requirement "
                         "such as 'pruned>=50%', or a list of them") from None
    bad = [r for r in items if not isinstance(r, str)]
    if bad:
        raise ValueError(f"judge: require holds {bad[0]!r}, not a string such as 'pruned>=50%'")
    return items


def judge(candidate, golden, tool=None, tp=1, require=()):
    """Judges candidate file `candidate` against golden file `golden` (TESTING.md's rules).
    `require`: coverage requirements ("pruned>=50%", or a list of them, docs/COVERAGE.md); one
    not met fails the verdict (first_failure's stage "require"). A candidate or golden the
    tool refuses is a JudgeError with the tool's message."""
    names = []
    for what, p in (("candidate", candidate), ("golden", golden)):
        try:
            names.append(os.fsdecode(os.fspath(p)))
        except TypeError:
            raise ValueError(f"judge: {what} is a {type(p).__name__}, not a path") from None
    if isinstance(tp, bool) or not isinstance(tp, int) or not 1 <= tp <= 1024:
        raise ValueError(f"judge: tp is {tp!r}, not an integer in [1, 1024]")
    flags = [f for r in _requirements(require) for f in ("--require", r)]
    with tempfile.TemporaryDirectory(prefix="dsv32-judge-") as d:
        report = os.path.join(d, "report.json")
        rc, out, err = _tool.run(["judge", "--golden", _tool.path_arg(names[1]), "--json",
                                  report, "--tp", str(tp), *flags, "--",
                                  _tool.path_arg(names[0])], tool)
        if rc == 2:
            raise JudgeError(_tool.message(rc, out, err))
        if rc not in (0, 1) or not os.path.exists(report):
            raise _tool.failed(rc, out, err, f"judging {names[0]}")
        try:
            with open(report) as f:
                r = json.load(f)
            passed = r["verdict"] == "pass"
            stages, failures, not_provided = r["stages"], r["failures"], r["not_provided"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise _tool.ToolError(f"the dsv32 tool's report on {names[0]} is not what this "
                                  f"package reads ({type(e).__name__}: {e}): is the tool of "
                                  "another version?") from None
    # A failure that no finite ratio measures is "inf" in the JSON (JSON has no infinity).
    for d in [r] + list(stages):
        if d.get("worst_ratio") == "inf":
            d["worst_ratio"] = float("inf")
    return Verdict(passed=passed, first_failure=r.get("first_failure"),
                   failures=failures, not_provided=not_provided, stages=stages,
                   report=r, coverage=r.get("coverage", {}), text=out)
