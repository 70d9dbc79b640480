"""Reading a golden file (GOLDEN.md) into numpy arrays, by the `dsv32` tool's rules: the tool's
own reader (`dsv32 validate`) takes the file first, so the package refuses exactly what the tool
refuses (shapes against the config, the config's bounds, step metadata against the block
tables, ...); then h5py reads it, itself bounded: only a regular file is opened (a FIFO would
block), steps are exactly step0..step{n-1}, every dataset's size is bounded before it is read,
every value is checked against its stored type, the config is strict JSON, and a NaN or an Inf
in a golden's tensors is refused, naming the dataset (docs/BAD_INPUT.md). A version-2 file's
given prefixes (/prefix) are read into `Golden.prefix` (request id -> `Prefix`), checked as the
tool checks them."""
import json
import math
import os
import re
import stat
from dataclasses import dataclass, field

import h5py
import numpy as np

from . import _tool
from .formats import decode, dtype_attribute


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
class Prefix:
    """A request's given prefix (GOLDEN.md, "Given prefix"): the cache entries of its positions
    0..length-1, which an implementation stores at `slots` (slot of position p = block_table[p //
    B] * B + p % B, its block table at `first_step`) in every layer before step `first_step`,
    where the request first appears with ctx_len == length. `layers[l]` holds, as the file
    stores them (P = length):
    - `latent` (P, Lkv): under `fp8_ds_mla`, uint8 e4m3 codes (formats.e4m3_values gives their
      values, before the tile scale); in a bf16 cache, float32: the stored values exactly (bf16
      values in `bf16` precision, fp32 ones in `fp32`);
    - `latent_scale` (P, ceil(Lkv / 128)) float32, `fp8_ds_mla` only: each 128-value tile's scale
      (the latent reads back as fp32(code value x scale));
    - `k_rope` (P, dr) float32: the rotary part as stored (already rotated; bf16 or fp32 values);
    - F layers only: `index_k` (P, dI) uint8 e4m3 codes and `index_scale` (P) float32, their ue8m0
      scale (a power of two)."""
    request_id: int
    length: int
    first_step: int
    slots: np.ndarray  # (P) int64
    layers: list  # per layer: name -> array


@dataclass
class Golden:
    path: str
    attrs: dict
    config: dict
    weights: list  # per layer: name -> array; F layers also "indexer/w_q_b", ...
    steps: list
    prefix: dict = field(default_factory=dict)  # request id -> Prefix (a version-2 file's)


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
        bad = ~np.isfinite(a) if finite and a.dtype.kind == "f" else None
        if bad is not None and re.search(r"/layer[0-9]+/rank[0-9]+/lse$", d.name):
            bad &= a != -np.inf  # a DCP rank owning none of a row (the tool checks where)
        if bad is not None and bad.any():
            i = np.unravel_index(int(np.flatnonzero(bad)[0]), a.shape)
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


def _as_int(v):
    """An attribute's integer value, or None."""
    if isinstance(v, np.ndarray) and v.shape == ():
        v = v[()]
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        return None
    return int(v)


def _first_steps(steps):
    """{request id: (its first step, its row there, ctx_len there)}."""
    first = {}
    for s, step in enumerate(steps):
        # Without our writer's request_id, a request is known by the first physical block of
        # its table, which it keeps while it lives (as the tool reads such a file).
        ids = step.inputs.get("request_id")
        if ids is None:
            ids = np.asarray(step.inputs["block_table"])[:, 0]
        for row, rid in enumerate(ids):
            first.setdefault(int(rid), (s, row, int(step.inputs["ctx_len"][row])))
    return first


def _prefix_dataset(r, g, name, dtype, shape):
    """Dataset `name` of prefix layer group g: logical `dtype`, `shape` exactly; e4m3 kept as its
    uint8 codes (none of them NaN), everything else as float32 values (finite)."""
    where = f"{r.path}:{g.name}/{name}"
    try:
        d = g.get(name)
    except (KeyError, OSError, ValueError) as e:
        raise GoldenFileError(f"{where}: cannot be opened: {e}") from None
    if not isinstance(d, h5py.Dataset):
        raise GoldenFileError(f"{where}: " + ("missing dataset" if d is None else "not a dataset"))
    try:
        got = dtype_attribute(d)
    except (KeyError, ValueError) as e:
        raise GoldenFileError(f"{where}: {e}" if isinstance(e, ValueError) else
                              f"{where}: no dtype attribute") from None
    if got != dtype:
        raise GoldenFileError(f"{where}: dtype {got}, expected {dtype}")
    if tuple(d.shape) != tuple(shape):
        raise GoldenFileError(f"{where}: shape {tuple(d.shape)}, expected {tuple(shape)}")
    if dtype != "float8_e4m3fn":
        a = r.tensor(d, True)  # decoded, checked finite
        return a.astype(np.float32)
    if d.dtype.newbyteorder("=") != np.dtype(np.uint8):
        raise GoldenFileError(f"{where}: stored as {d.dtype}, which does not hold dtype {dtype}")
    need = math.prod(shape)
    if need > r.left:
        raise GoldenFileError(f"{where}: shape {tuple(shape)} needs {need} bytes, over what is "
                              f"left of the read's bound ({r.left})")
    r.left -= need
    a = np.asarray(d[()], dtype=np.uint8).reshape(shape)
    bad = (a & 0x7F) == 0x7F
    if bad.any():
        i = np.unravel_index(int(np.flatnonzero(bad)[0]), a.shape)
        raise GoldenFileError(f"{where}: code 0x{int(a[i]):02X} at {tuple(map(int, i))} is no "
                              "finite e4m3 value")
    return a


def _prefixes(f, path, attrs, config, steps, r):
    """/prefix, each request's checked as `dsv32 validate` checks it (GOLDEN.md, "Given
    prefix"): only in a version-2 file, members request{id}, each started by exactly one step
    whose ctx_len is its length, shapes and dtypes by the config, codes finite, tile scales
    positive, index scales powers of two; and every request that first appears with a context
    has one."""
    first = _first_steps(steps)
    given = {}
    if "prefix" in f:
        version = _as_int(attrs.get("schema_version"))
        if version != 2:
            raise GoldenFileError(f"{path}:/prefix: a given prefix needs schema_version 2 (this "
                                  f"file says {attrs.get('schema_version')!r})")
        pg = f["prefix"]
        if not isinstance(pg, h5py.Group):
            raise GoldenFileError(f"{path}:/prefix: not a group")
        c = config
        fp8 = c["kv_cache"] == "fp8_ds_mla"
        act = "bfloat16" if c["precision"] == "bf16" else "float32"
        L, dr, dI, B = (c["kv_lora_rank"], c["qk_rope_head_dim"], c["index_head_dim"],
                        c["block_size"])
        for name in pg:
            m = re.fullmatch(r"request(0|[1-9][0-9]{0,9})", name)
            if not m or int(m.group(1)) >= 2**31:
                raise GoldenFileError(f"{path}:/prefix/{name}: not a request (the members of "
                                      "/prefix are request{id})")
            rid, rg = int(m.group(1)), pg[name]
            if not isinstance(rg, h5py.Group):
                raise GoldenFileError(f"{path}:/prefix/{name}: not a group")
            P = _as_int(rg.attrs.get("length"))
            if P is None or P < 1:
                raise GoldenFileError(f"{path}:/prefix/{name}: attribute length is "
                                      f"{rg.attrs.get('length')!r}, not an integer >= 1")
            if rid not in first or first[rid][2] == 0:
                raise GoldenFileError(f"{path}:/prefix/{name}: no step starts request id {rid} "
                                      "with a context (a prefix nothing reads)")
            s, row, ctx = first[rid]
            if ctx != P:
                raise GoldenFileError(f"{path}:/steps/step{s}/inputs: request id {rid} first "
                                      f"appears with ctx_len {ctx}, its given prefix has {P} "
                                      "positions")
            table = steps[s].inputs["block_table"][row]
            p = np.arange(P, dtype=np.int64)
            if (P - 1) // B >= table.shape[0] or (table[:(P - 1) // B + 1] < 0).any():
                raise GoldenFileError(f"{path}:/steps/step{s}/inputs/block_table: request id "
                                      f"{rid}'s row names no block for all {P} positions of its "
                                      "given prefix")
            slots = table[p // B].astype(np.int64) * B + p % B
            layers = []
            for l in range(c["num_layers"]):
                lname = f"layer{l}"
                lg = rg.get(lname)
                if not isinstance(lg, h5py.Group):
                    raise GoldenFileError(f"{path}:/prefix/{name}/{lname}: missing group")
                layer = {"latent": _prefix_dataset(r, lg, "latent", "float8_e4m3fn" if fp8
                                                   else act, (P, L))}
                if fp8:
                    sc = _prefix_dataset(r, lg, "latent_scale", "float32", (P, -(-L // 128)))
                    if not (sc > 0).all():
                        i = np.unravel_index(int(np.flatnonzero(~(sc > 0))[0]), sc.shape)
                        raise GoldenFileError(f"{path}:{lg.name}/latent_scale: {sc[i]} at "
                                              f"{tuple(map(int, i))} is no positive scale")
                    layer["latent_scale"] = sc
                layer["k_rope"] = _prefix_dataset(r, lg, "k_rope", act, (P, dr))
                if c["index_topk_pattern"][l] == "F":
                    layer["index_k"] = _prefix_dataset(r, lg, "index_k", "float8_e4m3fn", (P, dI))
                    sc = _prefix_dataset(r, lg, "index_scale", "float32", (P,))
                    mant, _ = np.frexp(sc)
                    bad = ~((sc > 0) & (mant == 0.5))
                    if bad.any():
                        i = int(np.flatnonzero(bad)[0])
                        raise GoldenFileError(f"{path}:{lg.name}/index_scale: {sc[i]} at ({i},) "
                                              "is no power of two")
                    layer["index_scale"] = sc
                layers.append(layer)
            given[rid] = Prefix(rid, P, s, slots, layers)
    for rid, (s, _, ctx) in sorted(first.items(), key=lambda kv: kv[1][:2]):
        if ctx and rid not in given:
            raise GoldenFileError(f"{path}:/steps/step{s}/inputs: request id {rid} first appears "
                                  f"with ctx_len {ctx} and the file gives no /prefix/request{rid} "
                                  "(caches start empty; GOLDEN.md, \"Given prefix\")")
    return given


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
            prefix = _prefixes(f, path, attrs, config, steps, r)
    except KeyError as e:
        raise GoldenFileError(f"{path}: missing {e}") from None
    except OSError as e:
        raise GoldenFileError(f"{path}: not a readable HDF5 file: {e}") from None
    return Golden(path, attrs, config, weights, steps, prefix)
