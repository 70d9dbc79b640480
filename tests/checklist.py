"""The checks of the Python test scripts: a line per check ("ok" or "FAIL" with its detail), the
names of the failed ones in `failed` for the script's exit status."""

failed = []


def check(name, cond, detail=""):
    print(("ok   " if cond else "FAIL ") + name + ("" if cond else f": {detail}"), flush=True)
    if not cond:
        failed.append(name)
