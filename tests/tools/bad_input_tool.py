"""The bad-input tests' common ground (imported by test_bad_input*.py): the dsv32 tool run as a
user runs it, under a memory bound (4 GiB of address space) and a time bound (60 s), and
fixtures copied and edited with h5py in the module's scratch folder.

$DSV32_TOOL names the dsv32 tool, $DSV32_FIXTURES the committed goldens (default: the
checkout's fixtures/). The tests skip without numpy or h5py."""
import json
import os
import resource
import shutil
import signal
import subprocess

import pytest

h5py = pytest.importorskip("h5py", reason="install python3-h5py")
np = pytest.importorskip("numpy", reason="install python3-numpy")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.environ.get("DSV32_FIXTURES") or os.path.join(ROOT, "fixtures")
TOOL = os.environ.get("DSV32_TOOL", "dsv32")
MEMORY = 4 << 30
DEFAULT = os.path.join(FIXTURES, "default.h5")


def bounded(fsize=None):
    def limits():
        if not os.environ.get("DSV32_NO_MEMORY_LIMIT"):  # sanitizer builds reserve terabytes
            resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
            signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    return limits


def tool(*args, fsize=None, timeout=60, env=None):
    """(exit code or -signal, stdout + stderr) of one bounded run."""
    try:
        p = subprocess.run([TOOL] + [str(a) for a in args], capture_output=True, timeout=timeout,
                           preexec_fn=bounded(fsize), stdin=subprocess.DEVNULL,
                           env=None if env is None else {**os.environ, **env})
        return p.returncode, (p.stdout + p.stderr).decode(errors="replace")
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"") + (e.stderr or b"")
        return "timeout", out.decode(errors="replace")


def expect(result, rc, *words):
    """Asserts that a run `result` = (exit code, output) exited `rc` and said every one of
    `words`."""
    code, out = result
    missing = [w for w in words if w not in out]
    assert code == rc and not missing, \
        f"exit {code} (want {rc}); missing {missing!r} in: {out.strip()[-600:]!r}"


class Files:
    """Copies of the committed goldens, folders and files in the scratch folder `root`."""

    def __init__(self, root):
        self.root = root

    def path(self, name):
        return os.path.join(self.root, name)

    def copy(self, base, name):
        p = self.path(name + ".h5")
        shutil.copy(os.path.join(FIXTURES, base + ".h5"), p)
        return p

    def out_dir(self, name):
        d = self.path(name)
        os.makedirs(d, exist_ok=True)
        return d

    def compressed_copy(self, base, name, compression):
        """A copy of fixture `base` with every non-scalar dataset stored with `compression` (an
        h5py filter: "gzip", "lzf"), attributes kept."""
        path = self.path(name + ".h5")

        def clone(a, b):
            b.attrs.update(a.attrs)
            for key, item in a.items():
                if isinstance(item, h5py.Group):
                    clone(item, b.create_group(key))
                else:
                    ds = b.create_dataset(key, data=item[()],
                                          compression=compression if item.shape else None)
                    ds.attrs.update(item.attrs)

        with h5py.File(os.path.join(FIXTURES, base + ".h5"), "r") as src, \
                h5py.File(path, "w") as dst:
            clone(src, dst)
        return path


def edit(path, fn):
    with h5py.File(path, "r+") as f:
        fn(f)
    return path


def set_config(path, key, value):
    def fn(f):
        cfg = json.loads(f.attrs["config"])
        cfg[key] = value
        f.attrs["config"] = json.dumps(cfg)
    return edit(path, fn)


def poke(f, name, index, value):
    d = f[name]
    a = d[()]
    a.reshape(-1)[index] = value
    d[...] = a
