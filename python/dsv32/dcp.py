"""Decode context parallelism from Python: a user's LSE merge judged alone on a golden's partials.

    import dsv32
    golden = dsv32.read_golden("dcp.h5")           # a golden with dcp_size W > 1
    verdict = dsv32.dcp.judge_merge(golden, my_merge)
    assert verdict.passed, verdict.first_failure

`my_merge(olat_parts, lse_parts)` gets every rank's partial attention of one layer of one step,
olat_parts (W, T_a, H, Lkv) and lse_parts (W, T_a, H) as float32 numpy arrays (torch tensors with
`as_torch=True`), and returns (olat (T_a, H, Lkv), lse (T_a, H)). Each step is given three times,
with a rank that owns none of a row presented as lse -inf and olat 0 (ours), lse +inf and olat 0
(FlashMLA's sparse kernels), and lse -inf with olat NaN (a masked row): an empty rank must add
exactly nothing (MATH.md, "Context-parallel shards"). `base="2"` gives and expects LSEs in base
2 (FlashInfer's trtllm-gen sparse MLA and its merge_state); the golden's are natural logs.
"""
from dataclasses import dataclass, field

import numpy as np

from .golden import GoldenFileError

# The stated gates, relative to each element's largest partial magnitude over the ranks (olat)
# or to 1 + |lse|: a merge in fp32 is a few fp32 ulps from the fp64 one; in bf16 (vLLM's
# all-gather + reduce-scatter path rounds each rescaled partial and each partial sum) (W + 2)
# bf16 half-ulps. A merge in the wrong base is off by tens of percent.
_FP32_REL = 2.0**-14
_LN2 = float(np.log(2.0))

PRESENTATIONS = ("empty lse -inf", "empty lse +inf", "empty olat NaN")


@dataclass
class MergeVerdict:
    passed: bool
    failures: list = field(default_factory=list)  # "step1/layer0 (empty lse +inf): ..." each
    checked: int = 0  # (step, layer, presentation) merges judged

    @property
    def first_failure(self):
        return self.failures[0] if self.failures else ""


def _ranks(golden):
    w = golden.config.get("dcp_size", 1)
    if isinstance(w, bool) or not isinstance(w, int) or w < 2:
        raise GoldenFileError(f"{golden.path}: config dcp_size is {w!r}: not a DCP golden "
                              "(dcp_size > 1)")
    return w


def _as_numpy(x, what):
    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().to("cpu").float().numpy()
    a = np.asarray(x, dtype=np.float64)
    return a


def judge_merge(golden, merge, base="e", precision="fp32", as_torch=False):
    """Judges `merge` on every layer of every step of a DCP golden (module docstring). Returns a
    MergeVerdict; its failures name the step, layer, presentation and the first element off."""
    if base not in ("e", "2"):
        raise ValueError(f"judge_merge: base is {base!r}, not 'e' or '2'")
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"judge_merge: precision is {precision!r}, not 'fp32' or 'bf16'")
    W = _ranks(golden)
    rel = _FP32_REL if precision == "fp32" else (W + 2) * 2.0**-9
    to_base = 1.0 if base == "e" else 1.0 / _LN2
    verdict = MergeVerdict(True)
    L = golden.config["num_layers"]
    for s, step in enumerate(golden.steps):
        for layer in range(L):
            key = f"layer{layer}"
            try:
                olat_r = np.stack([step.expected[f"{key}/rank{r}/olat"] for r in range(W)])
                lse_r = np.stack([step.expected[f"{key}/rank{r}/lse"] for r in range(W)])
                share = np.stack([step.expected[f"{key}/rank{r}/share"] for r in range(W)])
                want_olat = step.expected[f"{key}/olat"]
                want_lse = step.expected[f"{key}/lse"]
            except KeyError as e:
                raise GoldenFileError(f"{golden.path}: step{s}/{key}: missing {e} (a DCP golden "
                                      "has every rank's olat, lse and share)") from None
            empty = share[:, :, 0] < 0  # (W, T_a): the rank owns none of the row
            scale = np.abs(olat_r).max(axis=0)  # (T_a, H, Lkv)
            for how in PRESENTATIONS:
                o = olat_r.astype(np.float32)
                l_ = (lse_r * to_base).astype(np.float32)
                if how == "empty lse +inf":
                    l_[empty] = np.inf
                if how == "empty olat NaN":
                    o[empty] = np.nan
                args = (o, l_)
                if as_torch:
                    import torch
                    args = (torch.from_numpy(o), torch.from_numpy(l_))
                got = merge(*args)
                if not (isinstance(got, (tuple, list)) and len(got) == 2):
                    raise TypeError(f"judge_merge: merge returned {type(got).__name__}, not "
                                    "(olat, lse)")
                g_olat, g_lse = _as_numpy(got[0], "olat"), _as_numpy(got[1], "lse") / to_base
                where = f"step{s}/{key} ({how})"
                verdict.checked += 1
                for name, g, w_, tol in (
                        ("olat", g_olat, want_olat, rel * scale),
                        ("lse", g_lse, want_lse, rel * (1 + np.abs(want_lse)))):
                    if g.shape != w_.shape:
                        verdict.failures.append(f"{where}: {name} has shape {g.shape}, expected "
                                                f"{w_.shape}")
                        continue
                    bad = ~(np.abs(g - w_) <= tol)  # NaN is bad
                    if bad.any():
                        i = tuple(int(v) for v in np.argwhere(bad)[0])
                        why = ("NaN" if np.isnan(g[i]) else
                               f"{g[i]:.9g} vs {w_[i]:.9g} (gate {tol[i]:.3g})")
                        hint = ""
                        if name == "lse" and np.isfinite(g[i]) and w_[i] != 0:
                            f = g[i] / w_[i]
                            if abs(f - 1 / _LN2) < 1e-2:
                                hint = ": times log2(e), a base-2 LSE read as natural log?"
                            elif abs(f - _LN2) < 1e-2:
                                hint = ": times ln 2, a natural log read as base 2?"
                        verdict.failures.append(f"{where}: {name} at {i}: {why}{hint}")
    verdict.passed = not verdict.failures and verdict.checked > 0
    return verdict
