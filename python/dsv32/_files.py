"""Outputs written whole or not at all, never over an input (docs/BAD_INPUT.md), as the `dsv32`
tool writes them: a temporary file of the writer's own beside the target (`NAME.PID-N.tmp`),
every write checked, then a rename; the temporary is removed on any error and on SIGTERM or
SIGHUP, and a temporary whose writer no longer runs is removed by the next write of the path."""
import contextlib
import errno
import itertools
import os
import re
import signal
import stat
import threading

# The first bytes of every candidate file this package writes (an HDF5 user block, which HDF5
# readers skip): the mark that lets a later write replace it. Nothing else is ever replaced.
CANDIDATE_MARK = b"dsv32-candidate\n"
USERBLOCK = 512

_serial = itertools.count()


class OutputError(ValueError):
    """An output path that cannot or must not be written: the message names it and why."""


def fspath(path, what):
    """`path` (str, bytes or os.PathLike) as a str, or an OutputError naming `what`."""
    try:
        p = os.fsdecode(os.fspath(path))
    except TypeError:
        raise OutputError(f"{what}: a path is a str or an os.PathLike, not "
                          f"{type(path).__name__}") from None
    if not p or "\0" in p:
        raise OutputError(f"{what}: {p!r} names no file")
    return p


def same_file(a, b):
    """Whether paths a and b name one file (a link to it included); False if either is absent."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def is_ours(path):
    """Whether `path` is a file this package may replace: a candidate it wrote, or empty."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(CANDIDATE_MARK))
    except OSError:
        return False
    return head in (b"", CANDIDATE_MARK)


def check_output(path, what, inputs=()):
    """Refuses, before any work, an output that could never be written or must not be: its
    folder missing or not a folder, the path a directory or another non-file, one of `inputs`
    (the same file, through a link too), or an existing file this package did not write (a
    golden, most often). Returns the path as a str."""
    p = fspath(path, what)
    for i in inputs:
        if i is not None and same_file(p, i):
            raise OutputError(f"{what}: {p} is also an input ({os.fsdecode(os.fspath(i))}): "
                              "writing it would replace what is read")
    folder = os.path.dirname(os.path.abspath(p))
    if not os.path.isdir(folder):
        raise OutputError(f"{what}: {p}: the folder {folder} does not exist" +
                          ("" if not os.path.exists(folder) else " as a folder"))
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"{what}: {p}: the folder {folder} is not writable")
    try:
        mode = os.stat(p).st_mode
    except FileNotFoundError:
        return p
    except OSError as e:
        raise OutputError(f"{what}: {p}: {e.strerror}") from None
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
        raise OutputError(f"{what}: {p} is {kind}")
    if not is_ours(p):
        raise OutputError(f"{what}: {p} exists and is not a candidate written by dsv32 (a "
                          "golden file?): it is not replaced; remove it or choose another path")
    return p


def _remove_stale(path):
    """Removes `path.PID-N.tmp` files whose writer no longer runs (one killed by SIGKILL)."""
    folder, name = os.path.split(os.path.abspath(path))
    pattern = re.compile(re.escape(name) + r"\.([1-9][0-9]{0,9})-[0-9]+\.tmp")
    try:
        entries = os.listdir(folder)
    except OSError:
        return
    for e in entries:
        m = pattern.fullmatch(e)
        if not m or int(m.group(1)) == os.getpid():
            continue
        try:
            os.kill(int(m.group(1)), 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, e))
        except (PermissionError, OverflowError):
            pass


@contextlib.contextmanager
def _removed_on_signal(tmp):
    """While the body runs, SIGTERM and SIGHUP first remove `tmp`, then act as before (the
    process still ends by the signal, or its own handler runs). Handlers can be set only in
    the main thread; elsewhere the temporary is removed on exceptions alone."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {}

    def handler(signum, frame):
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        for s, h in before.items():
            signal.signal(s, h)
        before.clear()
        os.kill(os.getpid(), signum)

    for s in (signal.SIGTERM, signal.SIGHUP):
        h = signal.getsignal(s)
        if h is not signal.SIG_IGN and h is not None:
            before[s] = h
            signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def write_whole(path, data):
    """Writes bytes `data` to `path` whole or not at all (see the module's text). A failed
    write (a full disk, a file-size limit) is an OutputError naming the temporary file and
    the cause; `path` is then as it was."""
    _remove_stale(path)
    tmp = f"{path}.{os.getpid()}-{next(_serial)}.tmp"
    with _removed_on_signal(tmp):
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)  # a stale one, or a link planted there: replaced, not followed
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise OutputError(f"{tmp}: cannot create: {e.strerror}") from None
        try:
            view, done = memoryview(data), 0
            try:
                while done < len(view):
                    done += os.write(fd, view[done:done + (64 << 20)])
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if isinstance(e, OSError):
                why = e.strerror or errno.errorcode.get(e.errno, str(e))
                raise OutputError(f"{tmp}: write failed after {done} of {len(data)} bytes: "
                                  f"{why}; {path} is as it was") from None
            raise
