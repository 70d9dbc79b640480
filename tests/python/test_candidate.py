#!/usr/bin/python3
"""The Python package (python/dsv32) end to end: candidates written from numpy arrays and judged
through `dsv32 judge`, against committed goldens and against goldens that another tool wrote by
GOLDEN.md alone (h5py, none of our extras).

usage: test_candidate.py FIXTURES_DIR SCRATCH_DIR   (DSV32_TOOL names the dsv32 tool)
Exit 77 (a ctest skip) without numpy or h5py."""
import os
import sys

try:
    import h5py
    import numpy as np
except ImportError as e:
    print(f"skipped: {e} (install python3-h5py and python3-numpy)")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import dsv32  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from checklist import check, finish  # noqa: E402

FIXTURES, SCRATCH = sys.argv[1], sys.argv[2]
os.makedirs(SCRATCH, exist_ok=True)


def expected_steps(golden):
    """The golden's own T0 tensors as a candidate (a perfect implementation)."""
    return [{k: v.copy() for k, v in s.expected.items()} for s in golden.steps]


def judged(name, steps, golden_path):
    path = os.path.join(SCRATCH, name + ".h5")
    dsv32.write_candidate(path, steps)
    return dsv32.judge(path, golden_path)


def swap_heads(o, heads):
    o = o.reshape(o.shape[0], heads, -1).copy()
    o[:, [0, 1]] = o[:, [1, 0]]
    return o.reshape(o.shape[0], -1)


def worse_topk(golden, s, layer, token):
    """Step s's topk of `layer` with token's best selected position replaced by its worst
    unselected one (scores from the golden's own T0 qI8, omega and kI8)."""
    cfg = golden.config
    K, HI, dI = cfg["index_topk"], cfg["index_n_heads"], cfg["index_head_dim"]
    def request_ids(st):  # request_id, or (without it) the first block of each request's table
        ids = st.inputs.get("request_id", st.inputs["block_table"][:, 0])
        return ids[st.inputs["request_of_token"]]

    keys = {}
    for i in range(s + 1):
        st = golden.steps[i]
        ids = request_ids(st)
        k8, ks = st.expected[f"layer{layer}/kI8"], st.expected[f"layer{layer}/kI_scale"]
        for t, (rid, p) in enumerate(zip(ids, st.inputs["positions"])):
            keys[(int(rid), int(p))] = (k8[t], ks[t])
    st = golden.steps[s]
    rid, p = int(request_ids(st)[token]), int(st.inputs["positions"][token])
    q8 = st.expected[f"layer{layer}/qI8"][token].reshape(HI, dI)
    omega = st.expected[f"layer{layer}/omega"][token]
    score = np.array([keys[(rid, j)][1] * np.sum(omega * np.maximum(q8 @ keys[(rid, j)][0], 0))
                      for j in range(p + 1)])
    topk = st.expected[f"layer{layer}/topk"].copy()
    chosen = set(int(x) for x in topk[token] if x >= 0)
    best = max(chosen, key=lambda j: score[j])
    worst = min((j for j in range(p + 1) if j not in chosen), key=lambda j: score[j])
    chosen = sorted((chosen - {best}) | {worst})
    topk[token, :len(chosen)] = chosen
    return topk


def first_long_token(golden):
    """(step, F layer, token) of the first token whose context exceeds K."""
    cfg = golden.config
    for s, st in enumerate(golden.steps):
        for layer, kind in enumerate(cfg["index_topk_pattern"]):
            if kind != "F":
                continue
            for t, p in enumerate(st.inputs["positions"]):
                if p + 1 > cfg["index_topk"]:
                    return s, layer, t
    return None


def defects(golden_path, label):
    golden = dsv32.read_golden(golden_path)
    v = judged(label + "-good", expected_steps(golden), golden_path)
    check(f"{label}: the golden's own T0 passes", v.passed, v.failures[:2])
    steps = expected_steps(golden)
    steps[-1]["output"][0, 0] += 1.0 + abs(steps[-1]["output"][0, 0])
    v = judged(label + "-output", steps, golden_path)
    check(f"{label}: a wrong output element fails at output",
          not v.passed and v.first_failure["stage"] == "output", v.first_failure)
    steps = expected_steps(golden)
    steps[0]["layer0/o"] = swap_heads(steps[0]["layer0/o"], golden.config["num_heads"])
    v = judged(label + "-o", steps, golden_path)
    check(f"{label}: two heads swapped in o fail at layer0/o",
          not v.passed and v.first_failure["stage"] == "o" and v.first_failure["layer"] == 0,
          v.first_failure)
    at = first_long_token(golden)
    if at is not None:
        s, layer, t = at
        steps = expected_steps(golden)
        steps[s][f"layer{layer}/topk"] = worse_topk(golden, s, layer, t)
        v = judged(label + "-topk", steps, golden_path)
        check(f"{label}: a worse selected position fails at step{s}/layer{layer}/topk",
              not v.passed and v.first_failure["stage"] == "topk"
              and v.first_failure["layer"] == layer and v.first_failure["step"] == s,
              v.first_failure)


def partial_and_short(golden_path):
    golden = dsv32.read_golden(golden_path)
    only = [{k: v for k, v in s.items() if k == "output" or k.endswith("/o")}
            for s in expected_steps(golden)]
    v = judged("partial", only, golden_path)
    check("partial: output and o only pass, the rest not provided",
          v.passed and "layer0/q_c" in v.not_provided and "layer0/o" not in v.not_provided,
          (v.failures[:2], v.not_provided[:3]))
    statuses = {s["stage"]: s["status"] for s in v.stages}
    check("partial: a missing stage is never 'pass'",
          statuses.get("layer0/q_c") == "not provided" and statuses.get("output") == "pass",
          statuses)
    v = judged("short", expected_steps(golden)[:-1], golden_path)
    n = len(golden.steps) - 1
    check(f"short: a candidate without its last step fails naming step{n}",
          not v.passed and v.first_failure["stage"] == "steps" and v.first_failure["step"] == n,
          v.first_failure)
    try:
        dsv32.write_candidate(os.path.join(SCRATCH, "no-output.h5"), [{"layer0/o": np.zeros(1)}])
        check("no output: refused before writing", False, "written")
    except ValueError as e:
        check("no output: refused before writing", "output" in str(e), e)
    path = os.path.join(SCRATCH, "typo.h5")
    steps = expected_steps(golden)
    steps[0]["layer0/olatent"] = steps[0].pop("layer0/olat")
    dsv32.write_candidate(path, steps)
    try:
        dsv32.judge(path, golden_path)
        check("typo: an unknown stage name is bad input", False, "judged")
    except dsv32.JudgeError as e:
        check("typo: an unknown stage name is bad input", "olatent: unknown stage" in str(e), e)


def as_other_tool(src, dst):
    """A copy of golden `src` as a tool following GOLDEN.md alone would write it: without our
    extras (the num_blocks attribute, inputs/request_id), integers as numpy's int64 and the
    float32 inputs (an fp32-precision case's `hidden`) as float64 with dtype float64."""
    with h5py.File(src, "r") as f, h5py.File(dst, "w") as g:
        for k, v in f.attrs.items():
            if k != "num_blocks":
                g.attrs[k] = v

        def copy(name, item):
            if isinstance(item, h5py.Group) or name.endswith("inputs/request_id"):
                return
            dtype = item.attrs["dtype"]
            dtype = dtype.decode() if isinstance(dtype, bytes) else dtype
            data = item[()]
            if dtype == "int32":
                data = data.astype(np.int64)
            if dtype == "float32" and "/inputs/" in name:
                data, dtype = data.astype(np.float64), "float64"
            d = g.create_dataset(name, data=data, track_times=False)
            d.attrs["dtype"] = dtype
            for k, v in item.attrs.items():
                if k != "dtype":
                    d.attrs[k] = v
        f.visititems(copy)
        for s in f["steps"]:
            g[f"steps/{s}/inputs"].attrs["capture_size"] = f[f"steps/{s}/inputs"].attrs[
                "capture_size"]


def golden_check(src):
    """`dsv32 golden --check`: a golden's expected tensors against this oracle's recomputation."""
    import shutil
    import subprocess
    tool = dsv32.verdict.find_tool()

    def rc(path, *flags):
        return subprocess.run([tool, "golden", "--check", path, *flags],
                              capture_output=True, text=True).returncode

    check("golden --check: a committed golden is this oracle's bits", rc(src, "--bitwise") == 0)
    for name, delta, want, want_bitwise in (("nudged", 1e-12, 0, 1), ("broken", 0.5, 1, 1)):
        path = os.path.join(SCRATCH, f"check-{name}.h5")
        shutil.copy(src, path)
        with h5py.File(path, "r+") as f:
            d = f["steps/step1/expected/layer0/o"]
            v = d[()]
            v[0, 0] += delta
            d[...] = v
        check(f"golden --check: {name} expected tensors exit {want} ({want_bitwise} bitwise)",
              rc(path) == want and rc(path, "--bitwise") == want_bitwise,
              (rc(path), rc(path, "--bitwise")))


def coverage(path):
    """The report's coverage and --require (docs/COVERAGE.md): the perfect candidate of a golden
    whose rows prune passes a requirement it meets and fails one it does not, naming it; a
    malformed requirement is refused (exit 2)."""
    g = dsv32.read_golden(path)
    cand = os.path.join(SCRATCH, "coverage.h5")
    dsv32.write_candidate(cand, expected_steps(g))
    v = dsv32.judge(cand, path, require=("pruned>=1", "scored>=1"))
    check("coverage: the perfect candidate of default prunes and meets what it exercised",
          v.passed and v.coverage["pruned"] > 0 and v.coverage["rows"] == sum(
              s.num_tokens for s in g.steps), v.coverage)
    v = dsv32.judge(cand, path, require=("pruned>=1", "pruned>=100%"))
    f = v.first_failure or {}
    check("coverage: ... and fails a requirement it does not meet, naming it",
          not v.passed and f.get("stage") == "require" and "pruned>=100%: pruned is" in
          f.get("message", "") and "did not exercise --require pruned>=100%" in v.text,
          (v.passed, f, v.text[-400:]))
    try:
        dsv32.judge(cand, path, require=("pruned=>1",))
        refused = ""
    except dsv32.JudgeError as e:
        refused = str(e)
    check("coverage: a malformed requirement is refused naming the comparison",
          "comparison =>" in refused, refused)


def main():
    coverage(os.path.join(FIXTURES, "default.h5"))
    golden_check(os.path.join(FIXTURES, "default.h5"))
    for case in ("default", "ctx-around-k", "kv-fp8", "precision-fp32"):
        defects(os.path.join(FIXTURES, case + ".h5"), case)
    partial_and_short(os.path.join(FIXTURES, "default.h5"))
    for case in ("ctx-around-k", "precision-fp32"):
        other = os.path.join(SCRATCH, case + "-other-tool.h5")
        as_other_tool(os.path.join(FIXTURES, case + ".h5"), other)
        with h5py.File(other, "r") as f:
            check(f"{case} by another tool: no num_blocks, no request_id",
                  "num_blocks" not in f.attrs and "request_id" not in f["steps/step0/inputs"])
        defects(other, case + " by another tool")
    finish()


if __name__ == "__main__":
    main()
