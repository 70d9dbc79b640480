"""Reading a golden file (GOLDEN.md) into numpy arrays, by the `dsv32` tool's rules: the tool's
own reader (`dsv32 validate`) takes the file first, so the package refuses exactly what the tool
refuses (shapes against the config, the config's bounds, step metadata against the block
tables, ...); then h5py reads it, itself bounded: only a regular file is opened (a FIFO would
block), steps are exactly step0..step{n-1}, every dataset's size is bounded before it is read,
every value is checked against its stored type, the config is strict JSON, and a NaN or an Inf
in a golden's tensors is refused, naming the dataset (docs/BAD_INPUT.md)."""
import json
import math
import os
import re
import stat
from dataclasses import dataclass, field

import h5py
import numpy as np

from . import _tool
from .formats import decode


class GoldenFileError(ValueError):
    """A golden file this package refuses: the message names the file and the dataset."""


# Bytes of decoded tensors one read may hold (float64): a lazily allocated dataset of a few
# bytes on disk can declare terabytes.
MAX_BYTES = 16 << 30


@dataclass
class Step:
    """One step: its inputs (hidden, positions, slots, request_of_token, ctx_len, q_len,
    block_table, ...), the capture size, and the expected tensors by name ("layer0/q_c",
    "output"): `expected` is T0 (float64), `emulated` T1 (storage precision)."""
    inputs: dict
    capture_size: int
    expected: dict = field(default_factory=dict)
    emulated: dict = field(default_factory=dict)

    @property
    def num_tokens(self):
        return int(self.inputs["hidden"].shape[0])

    def rows_by_request(self):
        """{request id: the step's token rows of that request, in order}: the rows an
        implementation that runs one request at a time computes together."""
        rows = {}
        for t, r in enumerate(self.inputs["request_of_token"]):
            rows.setdefault(int(self.inputs["request_id"][r]), []).append(t)
        return rows


@dataclass
class Golden:
    path: str
    attrs: dict
    config: dict
    weights: list  # per layer: name -> array; F layers also "indexer/w_q_b", ...
    steps: list


def require_regular_file(path):
    """Raises GoldenFileError unless `path` is a regular file (after links); opens it without
    blocking, so a FIFO is named rather than waited on."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise GoldenFileError(f"{path}: {e.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
    finally:
        os.close(fd)
    if not stat.S_ISREG(mode):
        kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode)
                else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a file")
        raise GoldenFileError(f"{path}: is {kind}, not a regular file")


def _strict_json(text, where):
    """JSON with no duplicate key and no NaN/Infinity literal."""
    def pairs(items):
        out = {}
        for k, v in items:
            if k in out:
                raise GoldenFileError(f"{where}: key {k!r} given twice")
            out[k] = v
        return out

    def constant(name):
        raise GoldenFileError(f"{where}: {name} is not a JSON number")
    try:
        return json.loads(text, object_pairs_hook=pairs, parse_constant=constant)
    except (ValueError, RecursionError) as e:
        if isinstance(e, GoldenFileError):
            raise
        raise GoldenFileError(f"{where}: not JSON: {e}") from None


class _Reader:
    """Bounded reads of a file's datasets. `skip_unread`: the tool's reader took the file, so a
    member that does not decode, or holds NaN, is one the tool does not read (an extra of
    another writer): it is left out rather than refused."""

    def __init__(self, path, max_bytes, skip_unread=False):
        self.path, self.left, self.skip_unread = path, max_bytes, skip_unread

    def tensor(self, d, finite):
        need = 8 * math.prod(d.shape or (1,))
        if need > self.left:
            raise GoldenFileError(f"{self.path}:{d.name}: shape {d.shape} needs {need} bytes, "
                                  f"over what is left of the read's bound ({self.left})")
        self.left -= need
        try:
            a = decode(d)
        except (KeyError, ValueError) as e:
            raise GoldenFileError(f"{self.path}:{d.name}: {e}") from None
        if finite and a.dtype.kind == "f" and not np.isfinite(a).all():
            i = np.unravel_index(int(np.flatnonzero(~np.isfinite(a))[0]), a.shape)
            raise GoldenFileError(f"{self.path}:{d.name}: {a[i]} at {tuple(map(int, i))}")
        return a

    def tensors(self, group, finite, prefix=""):
        out = {}
        for name in group:
            try:  # None for a link to nothing (h5py's items() yields it)
                item = group.get(name)
            except (KeyError, OSError, ValueError) as e:
                raise GoldenFileError(f"{self.path}:{group.name.rstrip('/')}/{name}: "
                                      f"cannot be opened: {e}") from None
            if isinstance(item, h5py.Group):
                out.update(self.tensors(item, finite, f"{prefix}{name}/"))
                continue
            try:
                if not isinstance(item, h5py.Dataset):
                    what = "a link to nothing" if item is None else "not a dataset"
                    raise GoldenFileError(f"{self.path}:{group.name.rstrip('/')}/{name}: {what}")
                out[prefix + name] = self.tensor(item, finite)
            except GoldenFileError:
                if not self.skip_unread:
                    raise
        return out


def _steps(f, path):
    """The step groups, exactly step0..step{n-1}: a gap or a stray member is named."""
    if "steps" not in f:
        raise GoldenFileError(f"{path}:/steps: missing group (a golden has step0 at least)")
    names = list(f["steps"].keys())
    numbers = []
    for n in names:
        m = re.fullmatch(r"step(0|[1-9][0-9]{0,8})", n)
        if not m:
            raise GoldenFileError(f"{path}:/steps/{n}: not a step (step0, step1, ...)")
        numbers.append(int(m.group(1)))
    numbers.sort()
    for want, got in enumerate(numbers):
        if want != got:
            raise GoldenFileError(f"{path}:/steps/step{want}: missing group (step{got} exists; "
                                  "steps run in order)")
    if not numbers:
        raise GoldenFileError(f"{path}:/steps/step0: missing group (no steps)")
    return [f[f"steps/step{s}"] for s in numbers]


def _capture_size(g, path):
    v = g["inputs"].attrs.get("capture_size")
    if isinstance(v, np.ndarray) and v.shape == ():
        v = v[()]
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise GoldenFileError(f"{path}:{g.name}/inputs: capture_size is {v!r}, not an integer")
    return int(v)


def validate(path, max_bytes=MAX_BYTES, tool=None):
    """Raises GoldenFileError, with the tool's own message, unless `dsv32 validate` takes
    `path` as a golden file. ToolNotFound where no tool is found."""
    gib = f"{max(max_bytes, 1) / 2**30:.9g}"
    path = os.fsdecode(os.fspath(path))
    try:
        rc, out, err = _tool.run(["validate", "--max-gib", gib, "--", _tool.path_arg(path)],
                                 tool)
    except _tool.ToolNotFound as e:
        raise _tool.ToolNotFound(f"{e}; or read without the tool's checks: "
                                 "read_golden(path, validate_with_tool=False)") from None
    if rc == 2:
        raise GoldenFileError(_tool.message(rc, out, err))
    if rc != 0 or "a golden file" not in out:
        raise _tool.failed(rc, out, err, f"validating {path}")


def read_golden(path, max_bytes=MAX_BYTES, tool=None, validate_with_tool=True):
    """Every tensor of a golden file, decoded (bf16 and e4m3 to their values). The file is
    first read by the `dsv32` tool (`tool`, else found as `dsv32.judge` finds it), whose
    refusal is a GoldenFileError; `validate_with_tool=False` skips that (the package's own
    checks still hold, the tool's cross-checks do not)."""
    try:
        path = os.fsdecode(os.fspath(path))
    except TypeError:
        raise GoldenFileError(f"read_golden: a path is a str or an os.PathLike, not "
                              f"{type(path).__name__}") from None
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, (int, float)) or \
            not 0 < max_bytes <= 2**50:
        raise ValueError(f"read_golden: max_bytes is {max_bytes!r}, not a number of bytes in "
                         "(0, 2^50]")
    require_regular_file(path)
    if validate_with_tool:
        validate(path, max_bytes, tool)
    r = _Reader(path, max_bytes, skip_unread=validate_with_tool)
    try:
        with h5py.File(path, "r") as f:
            attrs = {}
            for k in f.attrs:
                try:
                    v = f.attrs[k]
                    attrs[k] = v.decode() if isinstance(v, bytes) else v
                except (UnicodeDecodeError, OSError, TypeError, ValueError) as e:
                    if isinstance(e, GoldenFileError):
                        raise
                    if validate_with_tool and k != "config":
                        continue  # the tool took the file: h5py's decoding differs, not ours
                    raise GoldenFileError(f"{path}: attribute {k!r} cannot be read: "
                                          f"{type(e).__name__}: {e}") from None
            if not isinstance(attrs.get("config"), str):
                raise GoldenFileError(f"{path}: no config attribute (a JSON string)")
            config = _strict_json(attrs["config"], f"{path}: config")
            layers = config.get("num_layers") if isinstance(config, dict) else None
            if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= 1024:
                raise GoldenFileError(f"{path}: config num_layers is {layers!r}, not an integer "
                                      "in [1, 1024]")
            weights = [r.tensors(f["weights"][f"layer{l}"], True) for l in range(layers)]
            steps = []
            for g in _steps(f, path):
                step = Step(r.tensors(g["inputs"], True), _capture_size(g, path))
                if "expected" in g:
                    step.expected = r.tensors(g["expected"], True)
                if "emulated" in g:
                    step.emulated = r.tensors(g["emulated"], True)
                steps.append(step)
    except KeyError as e:
        raise GoldenFileError(f"{path}: missing {e}") from None
    except OSError as e:
        raise GoldenFileError(f"{path}: not a readable HDF5 file: {e}") from None
    return Golden(path, attrs, config, weights, steps)
