"""Writing a candidate file (docs/CANDIDATE.md): a golden's layout, the tensors only."""
import os

import h5py
import numpy as np


def _array(x):
    """A numpy array of x; torch tensors (any dtype, any device) come as float32 or int."""
    if hasattr(x, "detach"):  # torch.Tensor, without importing torch
        t = x.detach().cpu()
        if t.is_floating_point():
            t = t.float()  # bf16 and f16 -> f32 is exact
        return t.numpy()
    return np.asarray(x)


def write_candidate(path, steps):
    """Writes `steps` (a list, step 0 first; each a dict "layer{l}/{stage}" or "output" ->
    array of rows [0, T_a)) to `path` as /steps/step{s}/expected/...: float arrays as float64
    or float32, integer arrays (topk) as int32. Any subset of the stages; "output" is required.
    Written to a temporary name and renamed when complete."""
    tmp = path + ".tmp"
    with h5py.File(tmp, "w") as f:
        f.attrs["schema"] = "dsv32-candidate"
        for s, tensors in enumerate(steps):
            if "output" not in tensors:
                raise ValueError(f"step {s}: a candidate must provide 'output'")
            g = f.require_group(f"steps/step{s}/expected")
            for name, value in tensors.items():
                a = _array(value)
                if a.dtype.kind in "iu":
                    a, dtype = a.astype(np.int32), "int32"
                elif a.dtype == np.float32:
                    dtype = "float32"
                else:
                    a, dtype = a.astype(np.float64), "float64"
                d = g.create_dataset(name, data=a, track_times=False)
                d.attrs["dtype"] = dtype
    os.replace(tmp, path)
