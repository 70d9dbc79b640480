"""Writing a candidate file (docs/CANDIDATE.md): a golden's layout, the tensors only."""
import os
import tempfile

import h5py
import numpy as np

_INT32 = np.iinfo(np.int32)


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
    return np.asarray(x)


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


def write_candidate(path, steps):
    """Writes `steps` (a list, step 0 first; each a dict "layer{l}/{stage}" or "output" ->
    array of rows [0, T_a)) to `path` as /steps/step{s}/expected/...: float arrays as float64
    or float32, integer arrays (topk) as int32 (each value checked to fit). Any subset of the
    stages; "output" is required. Written to a temporary file of its own beside `path` and
    renamed when complete: on any error nothing is left, and `path` is as it was."""
    steps = list(steps)
    for s, tensors in enumerate(steps):
        if "output" not in tensors:
            raise ValueError(f"step {s}: a candidate must provide 'output'")
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=os.path.basename(path) + ".",
                               suffix=".tmp")
    os.close(fd)
    try:
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would carry over to the candidate
        with h5py.File(tmp, "w") as f:
            f.attrs["schema"] = "dsv32-candidate"
            for s, tensors in enumerate(steps):
                g = f.require_group(f"steps/step{s}/expected")
                for name, value in tensors.items():
                    where = f"step {s} {name}"
                    a, dtype = _stored(_array(value, where), where)
                    d = g.create_dataset(name, data=a, track_times=False)
                    d.attrs["dtype"] = dtype
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
