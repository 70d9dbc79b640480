"""Finding and running the `dsv32` tool, which owns every rule of what a golden and a
candidate must hold (docs/BAD_INPUT.md): the package asks it rather than guess again."""
import os
import shutil
import signal
import subprocess


class ToolNotFound(FileNotFoundError):
    """No `dsv32` tool to run: the message says where it was looked for and how to get one."""


class ToolError(RuntimeError):
    """The `dsv32` tool failed in a way no input explains (a crash, an unknown exit code, a
    report it did not write): the message names the tool and what it said."""


def path_arg(path):
    """A path as an argument the tool cannot take for an option ("-x.h5" -> "./-x.h5")."""
    return os.path.join(".", path) if path.startswith("-") else path


def _checkout():
    """The checkout this package comes from: where it lies, or where an installed wheel was
    built (dsv32/_checkout.py, written by python/_build/backend.py)."""
    try:
        from ._checkout import CHECKOUT
        return CHECKOUT
    except ImportError:
        return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def find_tool(tool=None):
    """`tool`, $DSV32_TOOL, `dsv32` on PATH, or the checkout's build/*/tools/dsv32."""
    for given, what in ((tool, "tool="), (os.environ.get("DSV32_TOOL"), "DSV32_TOOL=")):
        if given:
            given = os.fsdecode(os.fspath(given))
            if not (os.path.isfile(given) and os.access(given, os.X_OK)):
                raise ToolNotFound(f"{what}{given} is not an executable file")
            return given
    if shutil.which("dsv32"):
        return shutil.which("dsv32")
    root = _checkout()
    for preset in ("default", "cpu", "ci", "gpu", "asan"):
        p = os.path.join(root, "build", preset, "tools", "dsv32")
        if os.access(p, os.X_OK):
            return p
    raise ToolNotFound(
        f"no dsv32 tool: not in $DSV32_TOOL, not on PATH, not in {root}/build/*/tools/. Build it "
        f"(cmake --preset cpu && cmake --build --preset cpu, README) or set DSV32_TOOL to it")


def run(args, tool=None):
    """(exit code, stdout, stderr) of `dsv32 ARGS`. A run that ends by a signal says so in
    the exit code's place as a negative number, as subprocess does."""
    exe = find_tool(tool)
    try:
        p = subprocess.run([exe, *args], capture_output=True, text=True, errors="replace",
                           stdin=subprocess.DEVNULL)
    except OSError as e:
        raise ToolError(f"{exe}: cannot run the dsv32 tool: {e.strerror}") from None
    return p.returncode, p.stdout, p.stderr


def message(rc, out, err):
    """What a failed run said, as one line for an exception (never empty)."""
    text = (err or out or "").strip()
    for prefix in ("dsv32: bad input file: ", "dsv32: "):
        if text.startswith(prefix):
            text = text[len(prefix):]
            break
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        return f"the dsv32 tool was killed by {name}" + (f": {text}" if text else "")
    return text or f"the dsv32 tool exited {rc} and said nothing"


def failed(rc, out, err, doing):
    """The ToolError of a run that ended neither 0 nor as bad input (exit 2)."""
    return ToolError(f"the dsv32 tool failed {doing} (exit {rc}): {message(rc, out, err)}")
