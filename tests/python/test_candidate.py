"""The Python package (python/dsv32) end to end: candidates written from numpy arrays and judged
through `dsv32 judge`, against committed goldens and against goldens that another tool wrote by
GOLDEN.md alone (h5py, none of our extras).

    DSV32_TOOL=build/default/tools/dsv32 python3 -m pytest tests/python/test_candidate.py
(ctest: Python.CandidatesAreJudgedThroughThePackage.) Skips without numpy or h5py."""
import os
import shutil
import subprocess

import pytest

h5py = pytest.importorskip("h5py", reason="install python3-h5py")
np = pytest.importorskip("numpy", reason="install python3-numpy")
import dsv32  # noqa: E402

def expected_steps(golden):
    """The golden's own T0 tensors as a candidate (a perfect implementation)."""
    return [{k: v.copy() for k, v in s.expected.items()} for s in golden.steps]


def judged(scratch, name, steps, golden_path):
    path = os.path.join(scratch, name.replace(" ", "-") + ".h5")
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


# The goldens judged: committed ones, and two as a tool following GOLDEN.md alone writes them.
OTHER = " by another tool"
GOLDENS = ["default", "ctx-around-k", "kv-fp8", "precision-fp32", "ctx-around-k" + OTHER,
           "precision-fp32" + OTHER]


@pytest.fixture(scope="module")
def golden_of(fixtures_dir, scratch):
    """label -> (path, dsv32.Golden): a committed golden, or (label "CASE by another tool") the
    committed CASE written by as_other_tool."""
    made = {}

    def get(label):
        if label not in made:
            case = label[:-len(OTHER)] if label.endswith(OTHER) else label
            path = os.path.join(fixtures_dir, case + ".h5")
            if label.endswith(OTHER):
                other = os.path.join(scratch, case + "-other-tool.h5")
                as_other_tool(path, other)
                path = other
            made[label] = (path, dsv32.read_golden(path))
        return made[label]
    return get


def ids(label):
    return label.replace(" ", "-")


# The report's coverage and --require (docs/COVERAGE.md): the perfect candidate of a golden whose
# rows prune passes a requirement it meets and fails one it does not, naming it; a malformed
# requirement is refused (exit 2).
@pytest.fixture(scope="module")
def coverage(golden_of, scratch):
    path, g = golden_of("default")
    cand = os.path.join(scratch, "coverage.h5")
    dsv32.write_candidate(cand, expected_steps(g))
    return cand, path, g


def test_coverage_the_perfect_candidate_of_default_prunes_and_meets_what_it_exercised(coverage):
    cand, path, g = coverage
    v = dsv32.judge(cand, path, require=("pruned>=1", "scored>=1"))
    assert v.passed and v.coverage["pruned"] > 0 and v.coverage["rows"] == sum(
        s.num_tokens for s in g.steps), v.coverage


def test_coverage_and_fails_a_requirement_it_does_not_meet_naming_it(coverage):
    cand, path, _ = coverage
    v = dsv32.judge(cand, path, require=("pruned>=1", "pruned>=100%"))
    f = v.first_failure or {}
    assert not v.passed and f.get("stage") == "require" and "pruned>=100%: pruned is" in \
        f.get("message", "") and "did not exercise --require pruned>=100%" in v.text, \
        (v.passed, f, v.text[-400:])


def test_coverage_a_malformed_requirement_is_refused_naming_the_comparison(coverage):
    cand, path, _ = coverage
    with pytest.raises(dsv32.JudgeError, match="comparison =>"):
        dsv32.judge(cand, path, require=("pruned=>1",))


# `dsv32 golden --check`: a golden's expected tensors against this oracle's recomputation.
def golden_check(path, *flags):
    return subprocess.run([dsv32.verdict.find_tool(), "golden", "--check", path, *flags],
                          capture_output=True, text=True).returncode


def test_golden_check_a_committed_golden_is_this_oracles_bits(fixtures_dir):
    assert golden_check(os.path.join(fixtures_dir, "default.h5"), "--bitwise") == 0


@pytest.mark.parametrize("name,delta,want,want_bitwise", [("nudged", 1e-12, 0, 1),
                                                          ("broken", 0.5, 1, 1)])
def test_golden_check_of_changed_expected_tensors(fixtures_dir, scratch, name, delta, want,
                                                  want_bitwise):
    path = os.path.join(scratch, f"check-{name}.h5")
    shutil.copy(os.path.join(fixtures_dir, "default.h5"), path)
    with h5py.File(path, "r+") as f:
        d = f["steps/step1/expected/layer0/o"]
        v = d[()]
        v[0, 0] += delta
        d[...] = v
    got = (golden_check(path), golden_check(path, "--bitwise"))
    assert got == (want, want_bitwise), got


# Defects and their verdicts, on every golden judged.
@pytest.mark.parametrize("label", GOLDENS, ids=ids)
def test_the_goldens_own_t0_passes(golden_of, scratch, label):
    path, golden = golden_of(label)
    v = judged(scratch, label + "-good", expected_steps(golden), path)
    assert v.passed, v.failures[:2]


@pytest.mark.parametrize("label", GOLDENS, ids=ids)
def test_a_wrong_output_element_fails_at_output(golden_of, scratch, label):
    path, golden = golden_of(label)
    steps = expected_steps(golden)
    steps[-1]["output"][0, 0] += 1.0 + abs(steps[-1]["output"][0, 0])
    v = judged(scratch, label + "-output", steps, path)
    assert not v.passed and v.first_failure["stage"] == "output", v.first_failure


@pytest.mark.parametrize("label", GOLDENS, ids=ids)
def test_two_heads_swapped_in_o_fail_at_layer0_o(golden_of, scratch, label):
    path, golden = golden_of(label)
    steps = expected_steps(golden)
    steps[0]["layer0/o"] = swap_heads(steps[0]["layer0/o"], golden.config["num_heads"])
    v = judged(scratch, label + "-o", steps, path)
    assert not v.passed and v.first_failure["stage"] == "o" and v.first_failure["layer"] == 0, \
        v.first_failure


@pytest.mark.parametrize("label", GOLDENS, ids=ids)
def test_a_worse_selected_position_fails_at_its_topk(golden_of, scratch, label):
    path, golden = golden_of(label)
    at = first_long_token(golden)
    if at is None:
        pytest.skip(f"{label}: no token's context exceeds K")
    s, layer, t = at
    steps = expected_steps(golden)
    steps[s][f"layer{layer}/topk"] = worse_topk(golden, s, layer, t)
    v = judged(scratch, label + "-topk", steps, path)
    f = v.first_failure
    assert not v.passed and f["stage"] == "topk" and f["layer"] == layer and f["step"] == s, \
        (f"want step{s}/layer{layer}/topk", f)


@pytest.mark.parametrize("label", [g for g in GOLDENS if g.endswith(OTHER)], ids=ids)
def test_a_golden_by_another_tool_has_no_num_blocks_and_no_request_id(golden_of, label):
    with h5py.File(golden_of(label)[0], "r") as f:
        assert "num_blocks" not in f.attrs and "request_id" not in f["steps/step0/inputs"]


# Partial and short candidates, and names that are not stages.
@pytest.fixture(scope="module")
def partial(golden_of, scratch):
    path, golden = golden_of("default")
    only = [{k: v for k, v in s.items() if k == "output" or k.endswith("/o")}
            for s in expected_steps(golden)]
    return judged(scratch, "partial", only, path)


def test_partial_output_and_o_only_pass_the_rest_not_provided(partial):
    v = partial
    assert v.passed and "layer0/q_c" in v.not_provided and "layer0/o" not in v.not_provided, \
        (v.failures[:2], v.not_provided[:3])


def test_partial_a_missing_stage_is_never_pass(partial):
    statuses = {s["stage"]: s["status"] for s in partial.stages}
    assert statuses.get("layer0/q_c") == "not provided" and statuses.get("output") == "pass", \
        statuses


def test_short_a_candidate_without_its_last_step_fails_naming_that_step(golden_of, scratch):
    path, golden = golden_of("default")
    v = judged(scratch, "short", expected_steps(golden)[:-1], path)
    n = len(golden.steps) - 1
    assert not v.passed and v.first_failure["stage"] == "steps" and \
        v.first_failure["step"] == n, (f"want step{n}", v.first_failure)


def test_no_output_refused_before_writing(scratch):
    with pytest.raises(ValueError, match="output"):
        dsv32.write_candidate(os.path.join(scratch, "no-output.h5"), [{"layer0/o": np.zeros(1)}])


def test_typo_an_unknown_stage_name_is_bad_input(golden_of, scratch):
    path, golden = golden_of("default")
    cand = os.path.join(scratch, "typo.h5")
    steps = expected_steps(golden)
    steps[0]["layer0/olatent"] = steps[0].pop("layer0/olat")
    dsv32.write_candidate(cand, steps)
    with pytest.raises(dsv32.JudgeError, match="olatent: unknown stage"):
        dsv32.judge(cand, path)
