#!/usr/bin/python3
"""Runs a pytest file of this folder for ctest: exit 77 (a skip, with the reason) where pytest or
torch is not importable, else pytest's own exit status.

usage: run_pytest.py TEST_FILE [pytest arguments...]"""
import sys

for module, package in (("pytest", "python3-pytest"), ("torch", "python3-torch")):
    try:
        __import__(module)
    except ImportError as e:
        print(f"skipped: {module} is not importable here ({e}); Debian: {package}")
        sys.exit(77)
import pytest  # noqa: E402

sys.exit(pytest.main(["-q", "-rs", "-p", "dsv32.pytest_plugin", *sys.argv[1:]]))
