"""Bad input, the fourth probe (issue 49; docs/BAD_INPUT.md): a stage the judge would skip, runs
of `dsv32 golden` that must be whole or not at all (concurrent writers of one case, a run that
fails after its first outputs, an output path that is a directory), a filter this libhdf5 cannot
decode, threads that cannot fit the address space, and two outputs on one path. Each runs as a
user would, bounded (bad_input_tool), and expects an exit code and the words that name the
problem.

    DSV32_TOOL=build/default/tools/dsv32 python3 -m pytest tests/tools/test_bad_input_runs.py
(ctest: BadInput.WholeRunsJudgedStagesAndDistinctOutputs.) Skips without numpy or h5py."""
import fcntl
import hashlib
import json
import os
import subprocess
import time

import pytest
from bad_input_tool import DEFAULT, TOOL, bounded, edit, expect, tool

STEPS = [{"requests": [{"id": 0, "new_tokens": 3}]}]


def case_file(files, file, **root):
    """A case file FILE.json of a tiny case named FILE unless `root` says otherwise."""
    p = files.path(file + ".json")
    with open(p, "w") as f:
        json.dump({"name": file, "config": {"preset": "tiny"}, "steps": STEPS, **root}, f)
    return p


def md5(path):
    with open(path, "rb") as f:
        return hashlib.md5(f.read()).hexdigest()


def snapshot(d):
    """Every file of d (recursively) with its bytes' hash, directories as 'dir'."""
    out = {}
    for root, dirs, names in os.walk(d):
        for n in dirs:
            out[os.path.relpath(os.path.join(root, n), d)] = "dir"
        for n in names:
            out[os.path.relpath(os.path.join(root, n), d)] = md5(os.path.join(root, n))
    return out


# A. Every stage given is judged: a scale without its codes (or codes without their scale) is
# refused naming the stage, not skipped (all-zero scales once passed, exit 0).
@pytest.mark.parametrize("drop,zero,words", [
    (["kI8"], "kI_scale", "kI_scale: provided without kI8"),
    (["qI8", "omega"], "qI_scale", "qI_scale: provided without qI8 and omega"),
    (["kI_scale"], "kI8", "kI8: provided without kI_scale")], ids=["kI8", "qI8", "kI_scale"])
def test_a_candidate_with_a_scale_or_codes_alone_is_refused_not_passed(files, drop, zero, words):
    def strip(f):
        for s in f["steps"]:
            e = f["steps"][s]["expected"]
            for layer in [n for n in e if n != "output" and "kI8" in e[n]]:
                for name in drop:
                    del e[layer][name]
                e[layer][zero][...] = 0
    cand = edit(files.copy("default", f"without-{drop[0]}"), strip)
    expect(tool("judge", cand, "--golden", DEFAULT), 2, "/steps/step0/expected/layer0/" + words,
           "leave out " + zero)


# B. One case name written by runs into one --out: the manifest describes the golden that is
# there. Each run's golden once took its name and was hashed outside the directory's lock, so a
# run that renamed first and took the lock last recorded its hash over another run's file. Now
# nothing in the directory changes while another holds its lock: the test holds it (flock on the
# directory, as the tool takes it) while two runs of one case name make their goldens.
def waits_for_lock(p, timeout=60):
    """Whether run p sleeps in flock (or has ended) within `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if p.poll() is not None:
            return True
        try:
            if "lock" in open(f"/proc/{p.pid}/wchan").read():
                return True
        except OSError:
            time.sleep(2)  # no wchan here: give the run the time a tiny case takes, and more
            return True
        time.sleep(0.02)
    return False


def settled(d):
    return {n: h for n, h in snapshot(d).items() if not n.endswith(".tmp")}


@pytest.fixture(scope="module")
def race(files):
    """The race, run: each seed's golden made alone (`known`: manifest hash -> (md5, bytes)),
    then two runs into one --out while the test holds its lock (`held`: whether each waited and
    what the folder was before and while), then both let go."""
    known = {}
    specs = [case_file(files, f"race{s}", name="race", seed=s) for s in (1, 2, 3)]
    for s, spec in enumerate(specs):
        d = files.out_dir(f"race-alone{s}")
        tool("golden", "--spec", spec, "--out", d)
        entry = json.load(open(os.path.join(d, "MANIFEST.json")))["cases"][0]
        known[entry["fnv1a64"]] = (md5(os.path.join(d, "race.h5")), entry["bytes"])
    d = files.out_dir("race")
    tool("golden", "--spec", specs[2], "--out", d)
    before = settled(d)
    lock = os.open(d, os.O_RDONLY)
    fcntl.flock(lock, fcntl.LOCK_EX)
    procs, held = [], []
    for spec in specs[:2]:
        procs.append(subprocess.Popen([TOOL, "golden", "--spec", spec, "--out", d],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      preexec_fn=bounded()))
        held.append((waits_for_lock(procs[-1]), before, settled(d)))
    fcntl.flock(lock, fcntl.LOCK_UN)
    os.close(lock)
    codes = [p.wait(timeout=120) for p in procs]
    entry = json.load(open(os.path.join(d, "MANIFEST.json")))["cases"][0]
    return {"known": known, "held": held, "codes": codes, "entry": entry, "dir": d}


def test_three_seeds_make_three_different_goldens(race):
    assert len({m for m, _ in race["known"].values()}) == 3, race["known"]


@pytest.mark.parametrize("run", [1, 2])
def test_a_run_changes_nothing_while_another_holds_the_directorys_lock(race, run):
    waits, before, during = race["held"][run - 1]
    assert waits and during == before, f"waits {waits}: {before} then {during}"


def test_two_runs_of_one_case_into_one_out_both_succeed(race):
    assert race["codes"] == [0, 0]


def test_and_the_manifest_describes_the_golden_that_is_there(race):
    golden, h = os.path.join(race["dir"], "race.h5"), race["entry"]["fnv1a64"]
    assert race["known"].get(h) == (md5(golden), os.path.getsize(golden)), \
        f"manifest {h} is {race['known'].get(h)}, the file {md5(golden)}"


def test_and_no_temporary_file_is_left(race):
    left = os.listdir(race["dir"])
    assert not [n for n in left if n.endswith(".tmp")], left


# C. A run is whole or not at all: one that fails after its first case leaves the directory as
# it was (the first case's golden and skeleton were once left behind, unlisted in the manifest).
@pytest.fixture(scope="module")
def fresh_run(files):
    d = files.out_dir("whole")
    return tool("golden", "--spec", case_file(files, "first"), "--out", d), d, snapshot(d)


def test_a_run_into_a_fresh_out(fresh_run):
    expect(fresh_run[0], 0, "first.h5")


@pytest.fixture(scope="module", params=[
    ("an unmet require", {"file": "unmet", "require": ["largest_tie>=300"]},
     "case unmet does not exercise what it claims"),
    ("unusable gates", {"file": "eps", "config": {"preset": "tiny", "rms_norm_eps": 1e300}},
     "could not judge a candidate")], ids=["unmet-require", "unusable-gates"])
def failed_second_case(request, files, fresh_run):
    _, d, before = fresh_run
    _, root, words = request.param
    again = case_file(files, "first-again", name="first", seed=2)
    bad = case_file(files, **root)
    return tool("golden", "--spec", again, "--spec", bad, "--out", d), words, before, d


def test_a_second_case_that_fails_fails_the_run(failed_second_case):
    result, words, _, _ = failed_second_case
    expect(result, 2, words)


def test_and_leaves_every_file_and_the_manifest_as_they_were(failed_second_case):
    _, _, before, d = failed_second_case
    assert snapshot(d) == before, (sorted(before), sorted(snapshot(d)))


# D. Every output path of every case is checked before any work (a directory in the way was
# found after every step was computed).
@pytest.fixture(scope="module", params=["second.h5", "second.candidate.json", "MANIFEST.json"])
def taken(request, files):
    d = files.out_dir(f"taken-{request.param}")
    os.makedirs(os.path.join(d, request.param))
    code, out = tool("golden", "--spec", case_file(files, "first"), "--spec",
                     case_file(files, "second"), "--out", d)
    return request.param, d, (code, out)


def test_an_output_path_that_is_a_directory_is_refused(taken):
    name, d, result = taken
    expect(result, 2, os.path.join(d, name), "is a directory")


def test_before_any_work(taken):
    out = taken[2][1]
    assert "step 1/1" not in out, out[-400:]


def test_and_nothing_is_written(taken):
    name, d, _ = taken
    assert snapshot(d) == {name: "dir"}


# E. A filter this libhdf5 cannot decode is named (h5py's lzf was called "truncated or corrupt").
LZF_WORDS = ("uses the HDF5 filter lzf (id 32000), which this libhdf5 cannot decode",
             "uncompressed or with gzip")


@pytest.fixture(scope="module")
def lzf(files):
    return files.compressed_copy("default", "lzf", "lzf")


def test_a_golden_compressed_with_lzf_is_refused_naming_the_filter(lzf):
    expect(tool("diff", lzf, DEFAULT), 2, "lzf.h5:/weights/layer0/w_qkv_a: ", *LZF_WORDS)


def test_a_candidate_compressed_with_lzf_is_refused_naming_the_filter(lzf):
    expect(tool("judge", lzf, "--golden", DEFAULT), 2, "lzf.h5:/steps/step0/expected/layer0/",
           *LZF_WORDS)


# E. Threads whose stacks cannot fit the address space are refused by name before anything runs
# (OMP_NUM_THREADS=1000 under 4 GiB ended in libgomp's "Thread creation failed").
@pytest.fixture(scope="module")
def bounded_address_space():
    if os.environ.get("DSV32_NO_MEMORY_LIMIT"):
        pytest.skip("DSV32_NO_MEMORY_LIMIT: the 4 GiB bound these check is off (sanitizers)")


@pytest.fixture(scope="module", params=[
    {"OMP_NUM_THREADS": "1000"}, {"OMP_NUM_THREADS": "100", "OMP_STACKSIZE": "64M"}],
    ids=["1000-threads", "100-threads-of-64M"])
def too_many_threads(request, files, bounded_address_space):
    d = files.out_dir("omp-" + "-".join(request.param.values()))
    return tool("golden", "--case", "kv-fp8", "--out", d, env=request.param), d


def test_threads_that_cannot_fit_4_gib_are_refused_by_name(too_many_threads):
    expect(too_many_threads[0], 2, "bad environment: OMP_NUM_THREADS=", "threads with a stack of",
           "ulimit -v")


def test_before_anything_runs(too_many_threads):
    (_, out), d = too_many_threads
    assert "step 1/2" not in out and os.listdir(d) == [], out[-300:]


def test_omp_stacksize_lots_is_refused_by_name(bounded_address_space):
    expect(tool("golden", "--list", env={"OMP_STACKSIZE": "lots"}), 2, "OMP_STACKSIZE='lots'")


def test_and_100_threads_of_the_default_stack_still_run(files, bounded_address_space):
    expect(tool("golden", "--case", "kv-fp8", "--out", files.out_dir("omp-100"),
                env={"OMP_NUM_THREADS": "100"}), 0, "kv-fp8.h5")


# F. No two outputs on one path and no output over an input, in every command, compared as
# paths also when the files do not exist yet (`gpu G --json F --dump F` once passed a check that
# compared existing files only). `gpu` parses its outputs on a machine without a GPU too.
@pytest.fixture(scope="module", params=[("same.h5", "same.h5"), ("sub/../same.h5", "./same.h5")],
                ids=["same", "dotted"])
def one_path_twice(request, files):
    json_path, dump = request.param
    os.makedirs(files.path("sub"), exist_ok=True)
    return tool("gpu", DEFAULT, "--json", files.path(json_path), "--dump", files.path(dump)), \
        files.path(dump)


def test_gpu_json_and_dump_on_one_path_is_refused(one_path_twice):
    expect(one_path_twice[0], 2, "name one file")


def test_and_writes_nothing(one_path_twice):
    assert not os.path.exists(one_path_twice[1])


@pytest.fixture(scope="module")
def manifest_spec(files):
    d = files.out_dir("manifest-spec")
    spec = os.path.join(d, "MANIFEST.json")
    with open(spec, "w") as f:
        json.dump({"name": "m", "config": {"preset": "tiny"}, "steps": STEPS}, f)
    before = md5(spec)
    return tool("golden", "--spec", spec, "--out", d), spec, before, d


def test_a_case_file_where_the_runs_manifest_goes_is_refused(manifest_spec):
    expect(manifest_spec[0], 2, "the manifest", "is also an input")


def test_and_it_is_left_as_it_was(manifest_spec):
    _, spec, before, d = manifest_spec
    assert md5(spec) == before and os.listdir(d) == ["MANIFEST.json"], os.listdir(d)
