"""Bad input, the third probe (docs/BAD_INPUT.md): case files and configs (deep, duplicated,
mistyped), shared outputs (two writers, a malformed or blocking manifest, an output that is an
input), the environment and the command line (absurd thread counts, contradicting and empty
flags, products of sizes), goldens the tool would itself refuse, and the Python package's reader
and writer. Each runs as a user would, bounded (bad_input_tool), and expects an exit code and
the words that name the problem.

    DSV32_TOOL=build/default/tools/dsv32 python3 -m pytest tests/tools/test_bad_input_cases.py
(ctest: BadInput.CaseFilesOutputsFlagsAndThePythonPackage.) Skips without numpy or h5py."""
import json
import os
import subprocess
import time

import pytest
from bad_input_tool import (DEFAULT, FIXTURES, ROOT, TOOL, bounded, edit, expect, h5py, np,
                            tool)

import dsv32

STEPS = [{"requests": [{"id": 0, "new_tokens": 3}]}]
HF_CONFIG = os.path.join(ROOT, "tests", "data", "hf", "deepseek-v3.2-exp.json")


def case_file(files, name, text):
    p = files.path(name + ".json")
    with open(p, "w") as f:
        f.write(text if isinstance(text, str) else json.dumps(text))
    return p


def case(config=None, **root):
    return {"name": "c", "config": {"preset": "tiny", **(config or {})}, "steps": STEPS, **root}


def spec_run(files, name, text, out="o"):
    """`dsv32 golden --spec` of case file NAME.json holding `text`, into out_dir(out)."""
    return tool("golden", "--spec", case_file(files, name, text), "--out", files.out_dir(out))


# Case files and configs.
def test_a_case_file_nested_50000_deep_is_refused_not_a_stack_overflow(files):
    deep = '{"name": "c", "config": {"preset": "tiny"}, "steps": ' + "[" * 50000 + "]" * 50000 + "}"
    expect(spec_run(files, "deep", deep), 2, "nested deeper than 64")


def test_a_key_given_twice_is_refused_not_resolved_last_wins(files):
    expect(spec_run(files, "dup", '{"name": "a", "name": "b", "config": {}, "steps": []}'), 2,
           "key 'name' given twice")


def test_a_nul_in_a_case_name_is_refused_by_name(files):
    expect(spec_run(files, "nul", case(name="a\u0000b")), 2, "file-name-safe", "a\\u0000b")


def test_a_configs_numeric_name_is_refused(files):
    expect(spec_run(files, "num-name", case({"name": 5})), 2, "config.name: expected a string")


def test_1e19_is_quoted_as_written_not_as_int64_min(files):
    expect(spec_run(files, "seed", case(seed=1e19)), 2, "got 1e+19")


@pytest.fixture(scope="module")
def hf():
    with open(HF_CONFIG) as f:
        return json.load(f)


@pytest.mark.parametrize("key,value,words", [
    ("indexer_rope_interleave", "true", "expected true or false"),
    ("rope_parameters", 5, "expected an object or null")])
def test_a_hugging_face_value_of_the_wrong_type_is_refused_not_ignored(files, hf, key, value,
                                                                       words):
    p = case_file(files, f"hf-{key}", {**hf, key: value})
    expect(spec_run(files, f"case-hf-{key}", {"name": "hf", "config": {
        "hf_config": p, "num_layers": 1}, "steps": STEPS}), 2, key, words)


def test_a_null_rope_parameters_keeps_the_configs_own_rope_theta_and_yarn(files, hf):
    p = case_file(files, "hf-null", {**hf, "rope_parameters": None})
    code, text = spec_run(files, "case-hf-null", {
        "name": "hfnull", "config": {"hf_config": p, "num_layers": 1, "hidden_size": 64,
                                     "num_heads": 2, "q_lora_rank": 32, "kv_lora_rank": 32,
                                     "index_topk": 8}, "steps": STEPS}, out="hfnull")
    written = files.path(os.path.join("hfnull", "hfnull.h5"))
    assert code == 0 and os.path.exists(written), f"exit {code}: {text[-300:]}"
    with h5py.File(written, "r") as f:
        cfg = json.loads(f.attrs["config"])
    assert cfg["rope_theta"] == hf["rope_theta"] and cfg["rope_scaling"] is not None, \
        (cfg.get("rope_theta"), cfg.get("rope_scaling"))


# Goldens the tool would itself refuse are not written.
@pytest.fixture(scope="module", params=[
    ("eps", {"rms_norm_eps": 1e300}),
    ("yarn", {"rope_scaling": {"type": "yarn", "mscale": -10, "mscale_all_dim": 1e300}})],
    ids=lambda p: p[0])
def unusable_gates(request, files):
    name, config = request.param
    d = files.out_dir(f"refused-{name}")
    return tool("golden", "--spec", case_file(files, f"refused-{name}", case(config)),
                "--out", d), d


def test_a_golden_whose_gates_are_unusable_is_refused(unusable_gates):
    expect(unusable_gates[0], 2, "could not judge a candidate")


def test_and_nothing_of_it_is_written(unusable_gates):
    assert os.listdir(unusable_gates[1]) == []


# Shared outputs.
@pytest.fixture(scope="module", params=[
    ("deep", '{"cases": ' + "[" * 50000 + "]" * 50000 + "}"), ("not-cases", '{"cases": [1]}'),
    ("dup", '{"cases": [], "cases": []}')], ids=lambda p: p[0])
def malformed_manifest(request, files):
    name, content = request.param
    d = files.out_dir(f"manifest-{name}")
    with open(os.path.join(d, "MANIFEST.json"), "w") as f:
        f.write(content)
    return tool("golden", "--case", "kv-fp8", "--out", d), d


def test_a_malformed_manifest_is_refused_by_name(malformed_manifest):
    expect(malformed_manifest[0], 2, "MANIFEST.json")


def test_before_the_work(malformed_manifest):
    assert sorted(os.listdir(malformed_manifest[1])) == ["MANIFEST.json"]


def test_a_fifo_where_the_manifest_belongs_is_refused_at_once(files):
    d = files.out_dir("manifest-fifo")
    os.mkfifo(os.path.join(d, "MANIFEST.json"))
    expect(tool("golden", "--case", "kv-fp8", "--out", d, timeout=30), 2, "MANIFEST.json", "FIFO")


@pytest.fixture(scope="module")
def writers(files):
    """Five writers into one --out: (their exit codes, the manifest's cases, the folder)."""
    d = files.out_dir("writers")
    procs = [subprocess.Popen([TOOL, "golden", "--case", "kv-fp8", "--case", "fs-pattern",
                               "--out", d], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              preexec_fn=bounded()) for _ in range(4)]
    procs.append(subprocess.Popen([TOOL, "golden", "--case", "odd-block", "--out", d],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  preexec_fn=bounded()))
    codes = [p.wait(timeout=120) for p in procs]
    with open(os.path.join(d, "MANIFEST.json")) as f:
        entries = [e["case"] for e in json.load(f)["cases"]]
    return codes, entries, d


def test_five_writers_into_one_out_all_succeed(writers):
    assert writers[0] == [0] * 5


def test_the_manifest_keeps_every_writers_entries(writers):
    assert writers[1] == ["fs-pattern", "kv-fp8", "odd-block"]


@pytest.mark.parametrize("name", ["kv-fp8", "fs-pattern", "odd-block"])
def test_and_each_golden_is_whole_and_this_builds(writers, name):
    expect(tool("diff", os.path.join(writers[2], name + ".h5"),
                os.path.join(FIXTURES, name + ".h5")), 0, "agree")


def test_no_temporary_file_is_left(writers):
    assert not [n for n in os.listdir(writers[2]) if n.endswith(".tmp")], os.listdir(writers[2])


@pytest.fixture(scope="module")
def output_over_input(files):
    g = files.copy("default", "judged-over")
    before = open(g, "rb").read()
    return tool("judge", g, "--golden", g, "--json", g), g, before


def test_an_output_that_is_an_input_is_refused(output_over_input):
    expect(output_over_input[0], 2, "is also an input")


def test_and_the_input_is_left_as_it_was(output_over_input):
    _, g, before = output_over_input
    assert open(g, "rb").read() == before


def test_a_case_file_that_would_be_overwritten_by_its_own_skeleton_is_refused(files):
    spec = case_file(files, "x.candidate", case(name="x"))
    expect(tool("golden", "--spec", spec, "--out", files.root), 2, "is also an input")


def test_a_goldens_config_nested_50000_deep_is_named_not_blamed_on_libhdf5(files):
    deep_config = files.copy("default", "deep-config")
    with h5py.File(deep_config, "r+") as f:
        f.attrs["config"] = f.attrs["config"][:-1] + ', "x": ' + "[" * 50000 + "]" * 50000 + "}"
    expect(tool("diff", deep_config, DEFAULT), 2, "config JSON: nested deeper than 64")


# Compressed datasets and a link to a golden are read, not called corrupt.
def test_a_golden_with_gzip_compressed_datasets_is_read(files):
    expect(tool("diff", files.compressed_copy("default", "gzip", "gzip"), DEFAULT), 0, "agree")


def test_a_symbolic_link_to_a_golden_is_read(files):
    link = files.path("link.h5")
    os.symlink(os.path.abspath(DEFAULT), link)
    expect(tool("diff", link, DEFAULT), 0, "agree")


# The environment and the command line.
def test_omp_num_threads_100000_is_refused_by_name_not_a_crash_in_libgomp(files):
    expect(tool("golden", "--case", "kv-fp8", "--out", files.out_dir("omp"),
                env={"OMP_NUM_THREADS": "100000"}), 2, "OMP_NUM_THREADS", "[1, 1024]")


def test_omp_num_threads_two_is_refused_by_name():
    expect(tool("golden", "--list", env={"OMP_NUM_THREADS": "two"}), 2, "OMP_NUM_THREADS")


def test_list_with_all_is_refused_not_silently_preferred():
    expect(tool("golden", "--list", "--all"), 2, "--list excludes --all")


def test_bitwise_without_check_is_refused(files):
    expect(tool("golden", "--bitwise", "--case", "kv-fp8", "--out", files.out_dir("o")), 2,
           "--check")


def test_an_empty_json_is_refused_when_parsed():
    expect(tool("judge", DEFAULT, "--golden", DEFAULT, "--json", ""), 2, "--json", "empty")


def timed(*args):
    """(the run, its seconds)."""
    t0 = time.monotonic()
    return tool(*args), time.monotonic() - t0


@pytest.fixture(scope="module")
def unknown_scenario():
    return timed("selfcheck", "--scenario", "nope")


def test_an_unknown_scenario_is_refused_before_any_work(unknown_scenario):
    expect(unknown_scenario[0], 2, "unknown case 'nope'", "known: default")


def test_an_unknown_scenario_at_once(unknown_scenario):
    assert unknown_scenario[1] < 10, f"{unknown_scenario[1]:.1f} s"


def test_an_unknown_mutant_lists_the_known_ones():
    expect(tool("selfcheck", "--mutant", "nope"), 2, "unknown mutant 'nope'", "stale-positions")


@pytest.fixture(scope="module")
def malformed_require():
    return timed("selfcheck", "--require", "pruned=>1")


def test_a_malformed_require_is_refused_when_parsed_naming_the_part(malformed_require):
    expect(malformed_require[0], 2, "comparison =>", "one of >=")


def test_a_malformed_require_at_once(malformed_require):
    assert malformed_require[1] < 10, f"{malformed_require[1]:.1f} s"


def test_a_require_of_an_unknown_metric_lists_the_known_ones():
    expect(tool("judge", DEFAULT, "--golden", DEFAULT, "--require", "prune>=1"), 2,
           "no metric prune", "largest_tie")


def test_bench_oracle_a_product_of_in_range_sizes_is_refused_before_any_work():
    expect(tool("bench-oracle", "--decode", "4096", "--context", "1048576"), 2, "--max-gib")


def test_bench_gpu_a_product_of_in_range_sizes_is_refused_before_any_work():
    expect(tool("bench-gpu", "--decode", "4096", "--context", "1048576", "--layers", "64"), 2,
           "--decode 4096 x --context 1048576 x 64 layers")


def test_progress_piped_is_a_line_an_update_no_carriage_return_running_them_into_one(files):
    code, text = tool("golden", "--case", "kv-fp8", "--out", files.out_dir("piped"))
    assert code == 0 and "\r" not in text and "kv-fp8: step 1/2\n" in text \
        and "kv-fp8: step 2/2\n" in text, repr(text[:300])


def test_version_prints_the_version():
    expect(tool("--version"), 0, "dsv32 0.")


def test_a_mistyped_command_is_named_with_the_commands():
    expect(tool("judgee", DEFAULT), 2, "unknown command 'judgee'", "judge")


def test_an_unknown_option_is_named_before_a_missing_required_one():
    expect(tool("judge", DEFAULT, "--gold", DEFAULT), 2, "unknown option '--gold'")


@pytest.fixture(scope="module")
def kv_candidate(files):
    cand = files.path("kv-fp8-candidate.h5")
    kv = dsv32.read_golden(os.path.join(FIXTURES, "kv-fp8.h5"))
    dsv32.write_candidate(cand, [s.expected for s in kv.steps])
    return cand


def test_diff_of_a_candidate_says_to_judge_it(kv_candidate):
    expect(tool("diff", kv_candidate, DEFAULT), 2, "a candidate file", "dsv32 judge")


def test_a_candidate_judged_against_another_cases_golden_is_told_so(kv_candidate):
    expect(tool("judge", kv_candidate, "--golden", DEFAULT), 2,
           "is this a candidate for another case?")


def test_a_golden_judged_against_itself_says_every_stage_is_exact_not_at():
    code, text = tool("judge", DEFAULT, "--golden", DEFAULT)
    assert code == 0 and "every judged stage exact" in text and "at )" not in text, text[-300:]


@pytest.mark.parametrize("flags,words", [
    (["--dcp", "2", "--dcp-interleave", "3"], ["dcp_interleave", "must divide block_size"]),
    (["--dcp-interleave", "2"], ["needs --dcp W > 1"]),
    (["--dcp", "2", "--tp", "3"], ["--dcp 2 does not divide --tp 3"]),
    (["--dcp", "65"], ["--dcp: 65 is outside [1, 64]"])], ids=["interleave", "alone", "tp", "w"])
def test_a_dcp_layout_vllm_refuses_is_refused_by_name_before_the_gpu(flags, words):
    expect(tool("gpu", DEFAULT, *flags), 2, *words)


@pytest.fixture(scope="module")
def no_gpu():
    """`dsv32 gpu`'s run where no GPU is (a skip where one is)."""
    code, text = tool("gpu", DEFAULT)
    if code != 2 or os.path.exists("/dev/nvidiactl"):
        pytest.skip(f"a GPU is here (dsv32 gpu exit {code})")
    return text


def test_no_gpu_is_told_from_an_old_driver(no_gpu):
    assert "driver version is insufficient" not in no_gpu and \
        ("no NVIDIA driver" in no_gpu or "no CUDA" in no_gpu), no_gpu


@pytest.fixture(scope="module")
def mutant_without_gpu(no_gpu):
    return timed("selfcheck", "--mutant", "stale-positions")


def test_selfcheck_mutant_without_the_gpu_rows_says_nothing_was_checked(mutant_without_gpu):
    expect(mutant_without_gpu[0], 2, "GPU rows did not run")


def test_selfcheck_mutant_without_the_gpu_rows_before_any_work(mutant_without_gpu):
    assert mutant_without_gpu[1] < 10, f"{mutant_without_gpu[1]:.1f} s"


# The Python package.
@pytest.fixture(scope="module", params=[
    ("int64", np.array([[2**40]]), "does not fit int32"),
    ("complex", np.zeros((2, 2)) + 1j, "complex"),
    ("bool", np.ones((2, 2), dtype=bool), "boolean")], ids=lambda p: p[0])
def bad_array_write(request, files):
    """(the error write_candidate raised or None, the words it must name, files it left)."""
    name, value, words = request.param
    golden = dsv32.read_golden(DEFAULT)
    bad = [{k: v.copy() for k, v in st.expected.items()} for st in golden.steps]
    bad[0]["layer0/topk"] = value
    try:
        dsv32.write_candidate(files.path(f"py-{name}.h5"), bad)
        error = None
    except ValueError as e:
        error = e
    return error, words, [n for n in os.listdir(files.root) if n.startswith(f"py-{name}.h5")]


def test_write_candidate_refuses_the_array(bad_array_write):
    error, words, _ = bad_array_write
    assert error is not None, "it wrote it"
    assert words in str(error), str(error)


def test_and_leaves_no_file(bad_array_write):
    assert bad_array_write[2] == []


def refused(path, *words, own=None):
    """Asserts that read_golden refuses `path` naming `words`, and, without the tool's reader in
    front (validate_with_tool=False), by its own checks naming `own` (default `words`)."""
    for validate, want in ((True, words), (False, own or words)):
        with pytest.raises(dsv32.GoldenFileError) as e:
            dsv32.read_golden(path, validate_with_tool=validate)
        assert all(w in str(e.value) for w in want), f"validate_with_tool={validate}: {e.value}"


def test_read_golden_refuses_a_fifo_at_once(files):
    fifo = files.path("py-fifo.h5")
    os.mkfifo(fifo)
    t0 = time.monotonic()
    refused(fifo, "FIFO")
    assert time.monotonic() - t0 < 5, f"{time.monotonic() - t0:.1f} s"


def test_read_golden_names_a_gap_in_the_steps(files):
    gap = edit(files.copy("default", "py-gap"), lambda f: f.move("steps/step3", "steps/step9"))
    refused(gap, "/steps/step3", "missing")


def test_read_golden_refuses_an_inf_in_a_goldens_tensor(files):
    inf = edit(files.copy("default", "py-inf"),
               lambda f: f["steps/step1/expected/layer0/o"].__setitem__((0, 0), np.inf))
    refused(inf, "layer0/o", "inf")


def test_read_golden_refuses_capture_size_true(files):
    true = edit(files.copy("default", "py-true"),
                lambda f: f["steps/step0/inputs"].attrs.__setitem__("capture_size", True))
    refused(true, "capture_size")


def test_read_golden_bounds_a_lazily_sized_dataset_before_reading_it(files):
    def lazy(f):
        del f["steps/step0/expected/layer0/o"]
        d = f["steps/step0/expected/layer0"].create_dataset("o", shape=(4, 10**9), dtype="f8")
        d.attrs["dtype"] = "float64"

    refused(edit(files.copy("default", "py-lazy"), lazy), "layer0/o", own=("layer0/o", "bytes"))


def test_read_golden_refuses_a_config_key_given_twice(files):
    dupe = files.copy("default", "py-dup-key")
    with h5py.File(dupe, "r+") as f:
        f.attrs["config"] = f.attrs["config"][:-1] + ', "num_layers": 3}'
    refused(dupe, "num_layers", "twice")
