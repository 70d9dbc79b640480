"""A user's DCP merge judged alone on a golden's partials (dsv32.dcp.judge_merge; MATH.md,
"Context-parallel shards"): a merge that skips empty ranks passes in either base it is told;
the textbook merge fails where a rank owning none of a row says so with +inf (FlashMLA) or a
NaN olat; a merge of base-2 LSEs read as natural logs fails. The golden is generated here from
a case file by `dsv32 golden --spec` (4 ranks, interleave 2, FlashMLA's fp8 cache, vLLM's
engine-argument names, distinct tables per rank).

    DSV32_TOOL=build/default/tools/dsv32 python3 -m pytest tests/python/test_dcp_merge.py"""
import json
import os
import subprocess

import numpy as np
import pytest

import dsv32
from dsv32 import _tool

try:
    import torch
except ImportError:
    torch = None

CASE = {
    "name": "dcp-merge",
    "description": "a prefill, a decode past K beside a short prefill, decodes (tests/python)",
    "config": {"preset": "tiny", "num_layers": 2, "index_topk_pattern": "FS", "index_topk": 8,
               "block_size": 4, "kv_cache": "fp8_ds_mla", "decode_context_parallel_size": 4,
               "cp_kv_cache_interleave_size": 2},
    "cache": {"num_blocks": 64, "dcp_tables": "distinct"},
    "steps": [
        {"requests": [{"id": 0, "new_tokens": 30}]},
        {"requests": [{"id": 0, "new_tokens": 1}, {"id": 1, "new_tokens": 5}], "capture_size": 8},
        {"requests": [{"id": 0, "new_tokens": 1}, {"id": 1, "new_tokens": 1}]},
    ],
}


@pytest.fixture(scope="module")
def golden(scratch):
    spec = os.path.join(scratch, "dcp-merge.json")
    with open(spec, "w", encoding="utf-8") as f:
        json.dump(CASE, f)
    p = subprocess.run([_tool.find_tool(), "golden", "--spec", spec, "--out", scratch],
                       capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stdout + p.stderr
    return dsv32.read_golden(os.path.join(scratch, "dcp-merge.h5"))


def careful(base):
    """Skips what a rank owning none of a row reports (lse -inf, +inf or NaN), max-shifted."""
    def merge(olat, lse):
        lse = lse.astype(np.float64) * (np.log(2.0) if base == "2" else 1.0)
        live = np.isfinite(lse)
        m = np.where(live, lse, -np.inf).max(axis=0)
        w = np.where(live, np.exp(np.where(live, lse, 0.0) - m), 0.0)
        total = m + np.log(w.sum(axis=0))
        w = w / w.sum(axis=0)
        olat = np.where(live[..., None], olat, 0.0)
        out = (w[..., None] * olat).sum(axis=0)
        return out, total / (np.log(2.0) if base == "2" else 1.0)
    return merge


def textbook(olat, lse):
    with np.errstate(invalid="ignore", over="ignore"):  # its NaN is what is judged
        lse = lse.astype(np.float64)
        total = np.log(np.exp(lse).sum(axis=0))
        return (np.exp(lse - total)[..., None] * olat).sum(axis=0), total


def test_a_careful_merge_passes_in_the_base_it_is_given(golden):
    assert golden.config["dcp_size"] == 4
    for base in ("e", "2"):
        v = dsv32.dcp.judge_merge(golden, careful(base), base=base)
        assert v.passed, v.first_failure
        assert v.checked == len(golden.steps) * golden.config["num_layers"] * 3


def test_the_textbook_merge_fails_where_an_empty_rank_says_inf_or_nan(golden):
    v = dsv32.dcp.judge_merge(golden, textbook)
    assert not v.passed
    assert not any("(empty lse -inf)" in f for f in v.failures), v.failures[:3]
    assert any("(empty lse +inf)" in f and "NaN" in f for f in v.failures), v.failures[:3]
    assert any("(empty olat NaN)" in f and "NaN" in f for f in v.failures), v.failures[:3]


def test_base_2_lses_merged_as_natural_logs_fail(golden):
    v = dsv32.dcp.judge_merge(golden, careful("e"), base="2")
    assert not v.passed
    assert "olat" in v.first_failure or "lse" in v.first_failure


@pytest.mark.skipif(torch is None, reason="torch is not importable here")
def test_a_torch_merge_is_judged_on_tensors(golden):
    def merge(olat, lse):
        assert isinstance(olat, torch.Tensor) and olat.dtype == torch.float32
        live = torch.isfinite(lse)
        lse = torch.where(live, lse, torch.tensor(-torch.inf))
        total = torch.logsumexp(lse, dim=0)
        w = torch.exp(lse - total)
        return (w[..., None] * torch.where(live[..., None], olat, 0.0)).sum(0), total
    v = dsv32.dcp.judge_merge(golden, merge, as_torch=True)
    assert v.passed, v.first_failure


def test_a_golden_without_dcp_is_refused(scratch):
    g = dsv32.read_golden(os.path.join(os.environ["DSV32_FIXTURES"], "default.h5"))
    with pytest.raises(dsv32.GoldenFileError, match="not a DCP golden"):
        dsv32.dcp.judge_merge(g, textbook)


def test_a_candidates_ranks_are_judged_in_the_base_it_states(golden, scratch):
    # The golden's T1 without its own quantized indexer inputs (its sets are T0's, judged on
    # T0's scores), every rank's stages included.
    drop = ("qI8", "qI_scale", "kI8", "kI_scale", "omega")
    steps = [{k: v for k, v in s.emulated.items() if k.rsplit("/", 1)[-1] not in drop}
             for s in golden.steps]
    assert any("/rank3/share" in k for k in steps[0])
    ok = os.path.join(scratch, "ranks.h5")
    dsv32.write_candidate(ok, steps)
    v = dsv32.judge(ok, golden.path)
    assert v.passed, v.first_failure
    base2 = [{k: (a / np.log(2.0) if "/rank" in k and k.endswith("/lse") else a)
              for k, a in s.items()} for s in steps]
    unsaid = os.path.join(scratch, "base2.h5")
    dsv32.write_candidate(unsaid, base2)
    v = dsv32.judge(unsaid, golden.path)
    assert not v.passed
    assert "base 2 judged as natural log" in v.first_failure["message"], v.first_failure
    said = os.path.join(scratch, "base2-said.h5")
    dsv32.write_candidate(said, base2, lse_base="2")
    v = dsv32.judge(said, golden.path)
    assert v.passed, v.first_failure
    with pytest.raises(ValueError, match="lse_base"):
        dsv32.write_candidate(os.path.join(scratch, "x.h5"), steps, lse_base="10")
