#!/usr/bin/python3
"""Runs a pytest file of this folder for ctest: exit 77 (a skip, with the reason) where pytest or
torch is not importable, else pytest's own exit status.

When $DSV32_HOST_SHARE_SPEC names a CTest resource spec that exists (the GPU suite runs several
tests at once), the run takes its share of the host's cores for OpenMP and torch, as the gtest
binaries do (cmake/Dsv32TestResources.cmake); a caller's OMP_NUM_THREADS wins.

usage: run_pytest.py TEST_FILE [pytest arguments...]"""
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


spec = os.environ.get("DSV32_HOST_SHARE_SPEC", "")
if spec and "OMP_NUM_THREADS" not in os.environ:
    if (threads := host_share(spec)) is not None:
        os.environ["OMP_NUM_THREADS"] = str(threads)
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

for module, package in (("pytest", "python3-pytest"), ("torch", "python3-torch")):
    try:
        __import__(module)
    except ImportError as e:
        print(f"skipped: {module} is not importable here ({e}); Debian: {package}")
        sys.exit(77)
import pytest  # noqa: E402

sys.exit(pytest.main(["-q", "-rs", "-p", "dsv32.pytest_plugin", *sys.argv[1:]]))
