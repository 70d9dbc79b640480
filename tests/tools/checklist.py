"""The checks of the Python test scripts: a line per check ("ok" or "FAIL" with its detail), the
names of the failed ones in `failed`, and `finish()`, the script's last line and exit status."""
import sys

failed = []


def check(name, cond, detail=""):
    print(("ok   " if cond else "FAIL ") + name + ("" if cond else f": {detail}"), flush=True)
    if not cond:
        failed.append(name)


def finish():
    print(f"\n{'all checks pass' if not failed else f'{len(failed)} check(s) FAIL'}")
    sys.exit(1 if failed else 0)
