#!/usr/bin/python3
"""Runs a pytest file for ctest: pytest's own exit status, except exit 77 (a skip, with the
reasons) where pytest is not importable or every test of the run skipped, and exit 1 where
`dsv32` would not be the installed copy.

ctest installs the package (Python.InstallPackage: `pip install --target`) and runs every Python
test with only that folder on PYTHONPATH, named again in $DSV32_PYTHON_SITE: the run refuses to
start when `import dsv32` would load anything else (a checkout's python/, another install).

When $DSV32_HOST_SHARE_SPEC names a CTest resource spec that exists (the GPU suite runs several
tests at once), the run takes its share of the host's cores for OpenMP and torch, as the gtest
binaries do (cmake/Dsv32TestResources.cmake); a caller's OMP_NUM_THREADS wins.

usage: run_pytest.py TEST_FILE [pytest arguments...]"""
import importlib.util
import json
import os
import sys


def host_share(spec_path):
    """Cores // (GPUs x slots) of the spec at spec_path, or None without a readable spec."""
    try:
        with open(spec_path, encoding="utf-8") as f:
            gpus = json.load(f)["local"][0]["gpus"]
        slots = sum(int(g.get("slots", 1)) for g in gpus)
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None
    return max(1, (os.cpu_count() or 1) // slots) if slots > 0 else None


def not_the_installed_copy(site):
    """Why `import dsv32` would not load the package installed in `site`, or ""."""
    spec = importlib.util.find_spec("dsv32")
    if spec is None or not spec.origin:
        return f"dsv32 is not importable (it is installed in {site}?)"
    where = os.path.realpath(spec.origin)
    if os.path.commonpath([where, os.path.realpath(site)]) != os.path.realpath(site):
        return f"dsv32 would be imported from {where}, not from the installed copy in {site}"
    return ""


class Outcomes:
    """Counts what the run's tests did (a module skipped at collection counts as skipped)."""

    def __init__(self):
        self.passed = self.failed = self.skipped = 0

    def pytest_runtest_logreport(self, report):
        if report.failed:
            self.failed += 1
        elif report.skipped:
            self.skipped += report.when == "setup" or report.when == "call"
        elif report.passed and report.when == "call":
            self.passed += 1

    def pytest_collectreport(self, report):
        if report.failed:
            self.failed += 1
        elif report.skipped:
            self.skipped += 1


def main():
    spec = os.environ.get("DSV32_HOST_SHARE_SPEC", "")
    if spec and "OMP_NUM_THREADS" not in os.environ:
        if (threads := host_share(spec)) is not None:
            os.environ["OMP_NUM_THREADS"] = str(threads)
            os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    try:
        import pytest
    except ImportError as e:
        print(f"skipped: pytest is not importable here ({e}); Debian: python3-pytest")
        return 77
    site = os.environ.get("DSV32_PYTHON_SITE", "")
    if site and (why := not_the_installed_copy(site)):
        print(f"FAIL: {why}")
        return 1
    outcomes = Outcomes()
    status = pytest.main(["-q", "-rs", "-p", "dsv32.pytest_plugin", *sys.argv[1:]],
                         plugins=[outcomes])
    if status in (0, 5) and outcomes.skipped and not outcomes.passed and not outcomes.failed:
        print("skipped: every test of the run skipped (the reasons are above)")
        return 77
    return int(status)


if __name__ == "__main__":
    sys.exit(main())
