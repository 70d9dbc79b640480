"""`check(layer, golden, mode)`: a live torch layer driven through a golden's steps and judged
(docs/TORCH.md)."""
import os
import shutil
import tempfile

import torch

from .. import _files
from ..candidate import write_candidate
from ..golden import Golden, read_golden
from ..verdict import JudgeError, judge
from .batch import Inputs
from .capture import MODES, Runner

# The config keys a layer's own `config` (a dict, when it has one) must agree on with a golden.
SHAPE_KEYS = ("hidden_size", "num_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
              "qk_rope_head_dim", "v_head_dim", "index_n_heads", "index_head_dim",
              "index_topk", "num_layers", "kv_cache", "precision", "index_topk_pattern")


class LayerError(RuntimeError):
    """The layer did something no candidate can be made of (it raised, returned the wrong
    shape or dtype, or does not match the golden): the message names the step and stage.
    `candidate` is the candidate file kept when the judge refused what the layer recorded
    (named in the message too), else None."""

    def __init__(self, message, candidate=None):
        super().__init__(message)
        self.candidate = candidate


def _numpy(name, t, rows, where):
    if not isinstance(t, torch.Tensor):
        raise LayerError(f"{where}: stage {name} is a {type(t).__name__}, not a tensor")
    if t.dim() == 0 or t.shape[0] < rows:
        raise LayerError(f"{where}: stage {name} has shape {tuple(t.shape)}, fewer than the "
                         f"step's {rows} rows")
    a = t[:rows].detach().cpu()
    if a.is_complex() or a.dtype == torch.bool:
        raise LayerError(f"{where}: stage {name} is {a.dtype}; stages are real numbers")
    return a.numpy() if not a.is_floating_point() else a.double().numpy()


def _check_config(layer, golden):
    mine = getattr(layer, "config", None)
    if not isinstance(mine, dict):
        return
    for k in SHAPE_KEYS:
        if k in mine and mine[k] != golden.config.get(k):
            raise LayerError(f"the layer's config has {k} = {mine[k]!r}, the golden "
                             f"{os.path.basename(golden.path)} has {golden.config.get(k)!r}")


def _check_arguments(layer, golden, mode, device, dtype):
    """Refuses, naming the argument, what no run can be made of (before any work)."""
    if not isinstance(golden, Golden):
        raise TypeError(f"golden is a {type(golden).__name__}; give a dsv32.Golden "
                        "(dsv32.read_golden) or, to check(), a golden file's path")
    if not callable(layer):
        raise TypeError(f"layer is a {type(layer).__name__}, not callable: give a module or "
                        "function called as layer(batch) -> output")
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {', '.join(MODES)}")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device {device!r} is no torch device ({e})") from None
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (dev.index or 0) >= n:
            raise ValueError(f"device {device!r}: this process sees {n} CUDA devices")
    elif dev.type != "cpu":
        raise ValueError(f"device {device!r}: dsv32.torch runs on cpu or cuda")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype {dtype!r}: the hidden states' dtype is a floating torch dtype "
                         "(torch.float64, the default; torch.float32; torch.bfloat16)")


def run_steps(layer, golden, mode="eager", device="cpu", dtype=torch.float64, steps=None):
    """The candidate steps (name -> numpy array) of `layer` over the golden's steps, and the
    runner (its `notes`)."""
    _check_arguments(layer, golden, mode, device, dtype)
    n = len(golden.steps)
    if steps is not None and not (
            isinstance(steps, (list, tuple, range)) and len(steps) <= n and
            all(type(s) is int for s in steps) and list(steps) == list(range(len(steps)))):
        raise ValueError(f"steps {steps!r}: the golden's first steps in order, 0, 1, ... (at "
                         f"most {n}): a step runs on the caches the earlier ones wrote")
    runner = Runner(mode, device)  # refuses capture without CUDA
    _check_config(layer, golden)
    inputs = Inputs(golden, device, dtype)
    D = golden.config["hidden_size"]
    out = []
    for s in range(len(golden.steps)) if steps is None else steps:
        padded = None if mode == "eager" else inputs.capture_size(s)
        batch = inputs.step(s, padded)
        inputs.store_given(s)  # requests that start here from a given prefix
        where = f"step {s} ({mode}, {batch.num_padded} rows)"
        try:
            got = runner.run(layer, batch, inputs)
        except LayerError:
            raise
        except Exception as e:
            what = "capture or replay" if mode != "eager" else "the forward"
            raise LayerError(f"{where}: the layer raised during {what}: "
                             f"{type(e).__name__}: {e}") from e
        o = got["output"]
        if not isinstance(o, torch.Tensor) or tuple(o.shape) != (batch.num_padded, D):
            shape = tuple(o.shape) if isinstance(o, torch.Tensor) else type(o).__name__
            raise LayerError(f"{where}: stage output has shape {shape}, expected "
                             f"({batch.num_padded}, {D})")
        if not o.is_floating_point():
            raise LayerError(f"{where}: stage output is {o.dtype}, expected a floating dtype")
        out.append({k: _numpy(k, v, batch.num_tokens, where) for k, v in got.items()})
    return out, runner


def check(layer, golden, mode="eager", device="cpu", dtype=torch.float64, out=None):
    """Runs `layer(batch) -> output` over every step of `golden` (a path or a Golden) in
    `mode`, writes the candidate and judges it. Returns the Verdict; `verdict.notes` holds the
    runner's notes, `verdict.candidate` the candidate file and `verdict.command` the command
    that judges it again. `out`: where the candidate goes (checked before any work: its folder
    exists, it is not the golden, it replaces no file but a candidate); by default a temporary
    folder of its own, removed when the verdict passes and kept, for `verdict.command`, when
    it fails."""
    g = golden if isinstance(golden, Golden) else read_golden(golden)
    _check_arguments(layer, g, mode, device, dtype)
    if out is not None:
        out = _files.check_output(out, "check(out=...)", (g.path,))
    steps, runner = run_steps(layer, g, mode, device, dtype)
    folder = None
    if out is None:
        folder = tempfile.mkdtemp(prefix=f"dsv32-{mode}-")
        out = os.path.join(folder, "candidate.h5")
    try:
        write_candidate(out, steps, (g.path,))
    except BaseException:
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    try:
        verdict = judge(out, g.path)
    except JudgeError as e:  # a stage the layer recorded that no candidate holds, say
        raise LayerError(f"the judge refuses what the layer recorded: {e} (the candidate is "
                         f"kept: {out})", candidate=out) from None
    if folder and verdict.passed:
        shutil.rmtree(folder, ignore_errors=True)
        out = None
    verdict.notes = list(runner.notes)
    verdict.candidate = out
    verdict.command = f"dsv32 judge {out} --golden {g.path}" if out else ""
    return verdict


def failure_text(verdict):
    """One paragraph: the first failing step, layer and stage, the runner's notes and the
    command that judges the candidate again."""
    if verdict.passed:
        return f"dsv32: pass ({len(verdict.stages)} stages judged)" + "".join(
            f"\n  note: {n}" for n in getattr(verdict, "notes", []))
    f = verdict.first_failure or {}
    lines = [f"dsv32: FAIL at step {f.get('step')}, layer {f.get('layer')}, stage "
             f"{f.get('stage')}: {f.get('message', '')}".rstrip()]
    lines += [f"  note: {n}" for n in getattr(verdict, "notes", [])]
    lines.append(f"  again: {getattr(verdict, 'command', '')}")
    return "\n".join(lines)


__all__ = ["check", "run_steps", "failure_text", "LayerError"]
