"""Writing a candidate file (docs/CANDIDATE.md): a golden's layout, the tensors only."""
import io
import re

import h5py
import numpy as np

from . import _files

_INT32 = np.iinfo(np.int32)
_NAME = re.compile(r"output|layer(0|[1-9][0-9]{0,5})/(rank(0|[1-9][0-9]{0,2})/)?"
                   r"[A-Za-z][A-Za-z0-9_]{0,63}")


def _array(x, where):
    """A numpy array of x; torch tensors (any dtype, any device): bf16 and f16 as float32
    (exact), other reals and integers as they are."""
    if hasattr(x, "detach"):  # torch.Tensor, without importing torch
        t = x.detach().cpu()
        if t.is_complex():
            raise ValueError(f"{where}: a complex tensor; stages are real")
        if t.is_floating_point() and t.element_size() < 4:
            t = t.float()  # bf16 and f16 -> f32 is exact; numpy has no bf16
        return t.numpy()
    try:
        a = np.asarray(x)
    except ValueError as e:  # ragged nested lists
        raise ValueError(f"{where}: not an array ({e})") from None
    if a.ndim == 0 or a.shape[0] == 0:
        raise ValueError(f"{where}: shape {a.shape}; a stage is rows [0, T_a) of the step, "
                         "at least one")
    return a


def _stored(a, where):
    """(array, GOLDEN.md dtype) as written: integers as int32 (each in range), float32 as is,
    other reals as float64. Complex, boolean and non-numeric arrays are refused: writing them
    would drop the imaginary part or store a flag as a number."""
    if a.dtype.kind in "iu":
        if a.size and (a.min() < _INT32.min or a.max() > _INT32.max):
            bad = a.max() if a.max() > _INT32.max else a.min()
            raise ValueError(f"{where}: integer {int(bad)} does not fit int32 (a top-k entry "
                             "is a position, or -1)")
        return a.astype(np.int32), "int32"
    if a.dtype.kind == "f":
        if a.dtype == np.float32:
            return a, "float32"
        return a.astype(np.float64), "float64"
    what = {"c": "complex", "b": "boolean"}.get(a.dtype.kind, f"non-numeric ({a.dtype})")
    raise ValueError(f"{where}: a {what} array; stages are real numbers (topk integers)")


def _checked_steps(steps):
    """`steps` as a list of {name: array}, every name and value checked, before anything is
    written."""
    if isinstance(steps, (str, bytes, dict)) or not hasattr(steps, "__iter__"):
        raise ValueError(f"write_candidate: steps is a {type(steps).__name__}; give a list of "
                         "steps, step 0 first, each a dict 'layer{l}/{stage}' or 'output' -> "
                         "array")
    out = []
    for s, tensors in enumerate(steps):
        if not isinstance(tensors, dict):
            raise ValueError(f"step {s}: a {type(tensors).__name__}; a step is a dict "
                             "'layer{l}/{stage}' or 'output' -> array")
        if "output" not in tensors:
            raise ValueError(f"step {s}: a candidate must provide 'output'")
        arrays = {}
        for name, value in tensors.items():
            if not isinstance(name, str) or not _NAME.fullmatch(name):
                raise ValueError(f"step {s}: {name!r} is no stage name ('output', "
                                 "'layer{l}/{stage}' such as 'layer0/q_c', or under DCP "
                                 "'layer{l}/rank{r}/{stage}')")
            where = f"step {s} {name}"
            arrays[name] = _stored(_array(value, where), where)
        out.append(arrays)
    if not out:
        raise ValueError("write_candidate: no steps (a candidate has step 0 at least)")
    return out


def _image(steps, lse_base):
    """The candidate file's bytes, built in memory: libhdf5 never writes to the disk, so a
    failed write is our own error and nothing is left for its exit-time flush (which ended
    in SIGSEGV after a write to a full disk had failed)."""
    buf = io.BytesIO()
    try:
        with h5py.File(buf, "w", userblock_size=_files.USERBLOCK) as f:
            f.attrs["schema"] = "dsv32-candidate"
            if lse_base is not None:
                f.attrs["lse_base"] = lse_base
            for s, arrays in enumerate(steps):
                g = f.require_group(f"steps/step{s}/expected")
                for name, (a, dtype) in arrays.items():
                    d = g.create_dataset(name, data=a, track_times=False)
                    d.attrs["dtype"] = dtype
    except MemoryError:
        size = sum(a.nbytes for arrays in steps for a, _ in arrays.values())
        raise MemoryError(f"write_candidate: out of memory building the file ({size} bytes of "
                          "tensors, held twice while it is built)") from None
    buf.seek(0)
    buf.write(_files.CANDIDATE_MARK)  # into the user block, which HDF5 leaves as zeros
    return buf.getbuffer()


def write_candidate(path, steps, inputs=(), lse_base=None):
    """Writes `steps` (a list, step 0 first; each a dict "layer{l}/{stage}" or "output" ->
    array of rows [0, T_a)) to `path` as /steps/step{s}/expected/...: float arrays as float64
    or float32, integer arrays (topk) as int32 (each value checked to fit). Any subset of the
    stages; "output" is required.

    Whole or not at all: the file is built in memory, written to a temporary file of its own
    beside `path` and renamed when complete; on any error (a full disk included) or SIGTERM
    nothing is left and `path` is as it was. `path` may replace only a candidate this package
    wrote (or an empty file), never a golden, nor any of `inputs`; its folder must exist.

    Under decode context parallelism a step may also give every rank's stages,
    "layer{l}/rank{r}/topk", "share", "olat" and "lse" (docs/CANDIDATE.md), and `lse_base`
    ("e", the judge's default, or "2") says which log the LSEs are in."""
    if lse_base not in (None, "e", "2"):
        raise ValueError(f"write_candidate: lse_base is {lse_base!r}, not 'e' or '2'")
    path = _files.check_output(path, "write_candidate", inputs)
    _files.write_whole(path, _image(_checked_steps(steps), lse_base))
