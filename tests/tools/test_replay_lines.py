#!/usr/bin/python3
"""Every replay line a test failure prints runs exactly that test (docs/GPU.md, "Test names and
replay lines").

Each gtest binary prints, with --dsv32_replay_lines, every test's ctest name and the line its
failures print (tests/support/replay.hpp). For every test ctest lists, this checks that its
binary gives a line, and that the line's regular expression selects that test and no other of
ctest's list; ctest itself confirms one line a binary. No test source may type a replay line by
hand (a "ctest -R" literal outside support/replay.hpp).

usage: test_replay_lines.py CTEST BUILD_DIR TESTS_SOURCE_DIR"""
import json
import pathlib
import re
import subprocess
import sys

LINE = re.compile(r"^ctest -R '([^']+)' --output-on-failure$")


def ctest_tests(ctest, build):
    out = subprocess.run([ctest, "--test-dir", build, "-N", "--show-only=json-v1"],
                         capture_output=True, text=True, timeout=600, check=True).stdout
    return [(t["name"], t.get("command", [])) for t in json.loads(out)["tests"]]


def gtest_binary(command):
    """The gtest binary a discovered test runs, or None: CMake 3.x runs `BINARY
    --gtest_filter=...`, CMake 4 `cmake -D TEST_EXECUTABLE=BINARY ... -P LaunchTest.cmake`."""
    for arg in command:
        if arg.startswith("TEST_EXECUTABLE="):
            return arg[len("TEST_EXECUTABLE="):]
    if any(a.startswith("--gtest_filter=") for a in command):
        return command[0]
    return None


def replay_lines(binary):
    run = subprocess.run([binary, "--dsv32_replay_lines"], capture_output=True, text=True,
                         timeout=120)
    if run.returncode != 0:
        raise RuntimeError(f"{binary} --dsv32_replay_lines exited {run.returncode}: "
                           f"{run.stderr.strip()[-300:]}")
    lines = {}
    for row in run.stdout.splitlines():
        name, _, line = row.partition("\t")
        lines[name] = line
    return lines


def main():
    ctest, build, sources = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
    problems = []
    tests = ctest_tests(ctest, build)
    names = [n for n, _ in tests]
    by_binary = {}
    for name, command in tests:
        if (binary := gtest_binary(command)) is not None:
            by_binary.setdefault(binary, []).append(name)
    if not by_binary:
        sample = "; ".join(f"{n!r}: {c!r}" for n, c in tests[:2])
        problems.append(f"ctest lists {len(tests)} tests, none a gtest (no --gtest_filter or "
                        f"TEST_EXECUTABLE): nothing to check; first: {sample}")
    checked = 0
    for binary, own in sorted(by_binary.items()):
        lines = replay_lines(binary)
        confirm = None
        for name in own:
            line = lines.get(name)
            if line is None:
                problems.append(f"{name}: {pathlib.Path(binary).name} prints no replay line "
                                "for it (its ctest name and gtest's differ)")
                continue
            m = LINE.match(line)
            if not m:
                problems.append(f"{name}: replay line {line!r} is not `ctest -R '...' "
                                "--output-on-failure`")
                continue
            selected = [n for n in names if re.search(m.group(1), n)]
            if selected != [name]:
                problems.append(f"{name}: {line!r} selects {len(selected)} tests "
                                f"({', '.join(selected[:3])}{', ...' if len(selected) > 3 else ''})")
            checked += 1
            if confirm is None or len(name) > len(confirm[0]):
                confirm = (name, m.group(1))
        if confirm:  # ctest's own regular expressions agree with Python's on this binary's line
            out = subprocess.run([ctest, "--test-dir", build, "-N", "-R", confirm[1]],
                                 capture_output=True, text=True, timeout=300).stdout
            listed = re.findall(r"Test +#\d+: (.+)$", out, re.M)
            if listed != [confirm[0]]:
                problems.append(f"{confirm[0]}: ctest -N -R '{confirm[1]}' lists {listed}")
    for path in sorted(sources.rglob("*")):
        if path.suffix in (".cpp", ".cu", ".hpp") and path.name != "replay.hpp":
            for i, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if '"ctest -R' in text:
                    problems.append(f"{path.relative_to(sources)}:{i}: a replay line typed by "
                                    "hand; use testing::replay_line()")
    for p in problems:
        print("FAIL", p)
    print(f"replay lines: {checked} checked over {len(by_binary)} binaries, "
          f"{len(problems)} problems")
    return 1 if problems or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
