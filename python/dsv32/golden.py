"""Reading a golden file (GOLDEN.md) into numpy arrays."""
import json
from dataclasses import dataclass, field

import h5py

from .formats import decode


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


@dataclass
class Golden:
    path: str
    attrs: dict
    config: dict
    weights: list  # per layer: name -> array; F layers also "indexer/w_q_b", ...
    steps: list


def _tensors(group, prefix=""):
    out = {}
    for name, item in group.items():
        if isinstance(item, h5py.Group):
            out.update(_tensors(item, f"{prefix}{name}/"))
        else:
            out[prefix + name] = decode(item)
    return out


def read_golden(path):
    """Every tensor of a golden file, decoded (bf16 and e4m3 to their values)."""
    with h5py.File(path, "r") as f:
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
        config = json.loads(attrs["config"])
        weights = [_tensors(f["weights"][f"layer{l}"]) for l in range(config["num_layers"])]
        steps = []
        s = 0
        while f"steps/step{s}" in f:
            g = f[f"steps/step{s}"]
            inputs = _tensors(g["inputs"])
            step = Step(inputs, int(g["inputs"].attrs["capture_size"]))
            if "expected" in g:
                step.expected = _tensors(g["expected"])
            if "emulated" in g:
                step.emulated = _tensors(g["emulated"])
            steps.append(step)
            s += 1
    return Golden(path, attrs, config, weights, steps)
