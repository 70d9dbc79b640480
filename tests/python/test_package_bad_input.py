"""The Python package as strict as the tool (docs/BAD_INPUT.md, "The Python package"): one test a
class of defect, each of which failed before its fix. Run by ctest as
Python.PackageRefusesBadInputByName (DSV32_TOOL, DSV32_FIXTURES set; the checkout's fixtures/
by default)."""
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest

import dsv32
OutputError = ValueError  # dsv32._files.OutputError is one

FIXTURES = os.environ.get("DSV32_FIXTURES") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "fixtures")
SMALL = os.path.join(FIXTURES, "kv-fp8.h5")  # the smallest golden


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.fixture(scope="module")
def small():
    return dsv32.read_golden(SMALL)


def perfect(golden):
    """The golden's own T0 tensors as a candidate."""
    return [dict(s.expected) for s in golden.steps]


def edited(tmp_path, name, fn):
    """A copy of the small golden, edited by fn(h5py.File)."""
    path = str(tmp_path / f"{name}.h5")
    shutil.copy(SMALL, path)
    with h5py.File(path, "r+") as f:
        fn(f)
    return path


def restored(f, path, values, stored, dtype_attr):
    """Replaces dataset `path` by `values` stored as `stored`, tagged `dtype_attr`."""
    del f[path]
    d = f.create_dataset(path, data=np.asarray(values, dtype=stored))
    d.attrs["dtype"] = dtype_attr


def set_config(key, value):
    def fn(f):
        import json
        c = json.loads(f.attrs["config"])
        c[key] = value
        f.attrs["config"] = json.dumps(c)
    return fn


def set_position(value, stored):
    def fn(f):
        p = f["steps/step0/inputs/positions"][()].astype(np.float64)
        p[0] = value
        restored(f, "steps/step0/inputs/positions", p, stored, "int32")
    return fn


def as_float64_bf16(f):
    w = dsv32.bf16_values(f["weights/layer0/g_q"][()]).astype(np.float64)
    restored(f, "weights/layer0/g_q", w, np.float64, "bfloat16")


# Each kind the tool refuses and read_golden once read, some with wrong values: the file, the
# words the refusal must hold.
READER_CASES = {
    "int64-stored int32 position 2^32+1 (read as 1)": (set_position(2**32 + 1, np.int64),
                                                       ("positions", "4294967297")),
    "1.5 stored under int32 (read as 1)": (set_position(1.5, np.float64),
                                           ("positions", "stored")),
    "float64 tagged bfloat16 (read as 9e-41)": (as_float64_bf16, ("g_q", "bfloat16")),
    "no /steps (read as 0 steps)": (lambda f: f.__delitem__("steps"), ("steps",)),
    "capture_size -5": (lambda f: f["steps/step0/inputs"].attrs.__setitem__("capture_size", -5),
                        ("capture_size", "-5")),
    "capture_size 2^40": (lambda f: f["steps/step0/inputs"].attrs.__setitem__(
        "capture_size", 2**40), ("capture_size",)),
    "index_topk_pattern FX": (set_config("index_topk_pattern", "FX"), ("index_topk_pattern",)),
    "hidden_size 65 over 64-wide weights": (set_config("hidden_size", 65), ("shape",)),
}


@pytest.mark.parametrize("kind", READER_CASES)
def test_read_golden_refuses_what_the_tool_refuses(tmp_path, kind):
    fn, words = READER_CASES[kind]
    path = edited(tmp_path, "bad", fn)
    rc = subprocess.run([dsv32.verdict.find_tool(), "validate", path], capture_output=True).returncode
    assert rc == 2, f"the tool takes {kind}: the case is not bad"
    with pytest.raises(dsv32.GoldenFileError) as e:
        dsv32.read_golden(path)
    assert all(w in str(e.value) for w in words), str(e.value)


@pytest.mark.parametrize("kind", ["int64-stored int32 position 2^32+1 (read as 1)",
                                  "1.5 stored under int32 (read as 1)",
                                  "float64 tagged bfloat16 (read as 9e-41)",
                                  "no /steps (read as 0 steps)"])
def test_read_golden_alone_never_reads_a_wrong_value(tmp_path, kind):
    """Without the tool in front, the package's own decoding still refuses these."""
    fn, _ = READER_CASES[kind]
    with pytest.raises(dsv32.GoldenFileError):
        dsv32.read_golden(edited(tmp_path, "bad", fn), validate_with_tool=False)


def _writer_script(body):
    return textwrap.dedent("""
        import os, resource, signal, sys, threading
        import numpy as np
        import dsv32
        target = sys.argv[1]
        steps = [{"output": np.random.default_rng(0).standard_normal((4000, 4000))}]
    """) + textwrap.dedent(body)


def run_writer(tmp_path, body, timeout=120):
    script = tmp_path / "writer.py"
    script.write_text(_writer_script(body))
    return subprocess.run([sys.executable, str(script), str(tmp_path / "out" / "cand.h5")],
                          capture_output=True, text=True, timeout=timeout)


def test_a_failed_write_is_an_error_not_a_crash(tmp_path):
    """A file-size limit (as a full disk) mid-write: an error naming the cause, the process
    alive, nothing left, an earlier candidate at the path as it was."""
    (tmp_path / "out").mkdir()
    first = run_writer(tmp_path, 'dsv32.write_candidate(target, [{"output": np.ones((2, 2))}])')
    assert first.returncode == 0, first.stderr
    before = digest(tmp_path / "out" / "cand.h5")
    p = run_writer(tmp_path, """
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        try:
            dsv32.write_candidate(target, steps)
        except ValueError as e:
            print("refused:", e)
            sys.exit(3)
    """)
    assert p.returncode == 3 and "File too large" in p.stdout, (p.returncode, p.stdout, p.stderr)
    assert os.listdir(tmp_path / "out") == ["cand.h5"]
    assert digest(tmp_path / "out" / "cand.h5") == before


def test_sigterm_during_a_write_leaves_no_temporary(tmp_path):
    (tmp_path / "out").mkdir()
    p = run_writer(tmp_path, """
        def killer():  # SIGTERM once the temporary file exists
            while not any(n.endswith(".tmp") for n in os.listdir(os.path.dirname(target))):
                pass
            os.kill(os.getpid(), signal.SIGTERM)
        threading.Thread(target=killer, daemon=True).start()
        dsv32.write_candidate(target, steps * 8)
    """)
    assert p.returncode == -signal.SIGTERM, (p.returncode, p.stderr)
    assert os.listdir(tmp_path / "out") == []


def test_a_killed_writers_temporary_is_removed_by_the_next_write(tmp_path):
    stale = tmp_path / "c.h5.999999999-0.tmp"  # no such process
    stale.write_bytes(b"half")
    dsv32.write_candidate(str(tmp_path / "c.h5"), [{"output": np.ones((2, 2))}])
    assert sorted(os.listdir(tmp_path)) == ["c.h5"]


@pytest.mark.parametrize("how", ["the same path", "a symbolic link", "a hard link",
                                 "another spelling"])
def test_write_candidate_never_replaces_a_golden(tmp_path, small, how):
    golden = str(tmp_path / "g.h5")
    shutil.copy(SMALL, golden)
    target = {"the same path": golden, "a symbolic link": str(tmp_path / "link.h5"),
              "a hard link": str(tmp_path / "hard.h5"),
              "another spelling": str(tmp_path / "." / ".." / tmp_path.name / "g.h5")}[how]
    if how == "a symbolic link":
        os.symlink(golden, target)
    if how == "a hard link":
        os.link(golden, target)
    before = digest(golden)
    with pytest.raises(OutputError, match="not replaced"):
        dsv32.write_candidate(target, perfect(small))
    assert digest(golden) == before


def test_write_candidate_replaces_its_own_candidate(tmp_path, small):
    path = str(tmp_path / "c.h5")
    dsv32.write_candidate(path, [{"output": np.ones((2, 2))}])
    dsv32.write_candidate(path, perfect(small))
    assert dsv32.judge(path, SMALL).passed


@pytest.mark.parametrize("target, words", [
    ("missing/c.h5", "does not exist"), ("dir", "a directory"), ("", "names no file")])
def test_write_candidate_refuses_an_output_it_could_never_write(tmp_path, target, words):
    (tmp_path / "dir").mkdir()
    with pytest.raises(OutputError, match=words):
        dsv32.write_candidate(str(tmp_path / target) if target else "", [{"output": np.ones(2)}])
    assert sorted(os.listdir(tmp_path)) == ["dir"]


class Replay:
    """A torch "layer" that returns the golden's own output for each step (and counts its
    calls): a passing layer that costs nothing, for the plumbing around it."""

    def __init__(self, golden, scale=1.0):
        self.golden, self.scale, self.calls = golden, scale, 0

    def __call__(self, batch):
        import torch
        self.calls += 1
        want = self.golden.steps[batch.step].expected["output"] * self.scale
        out = torch.zeros(batch.num_padded, want.shape[1], dtype=torch.float64)
        out[:want.shape[0]] = torch.from_numpy(want)
        return out


@pytest.fixture
def torch_check(monkeypatch, tmp_path):
    """dsv32.torch.check with the temporary folder pointed at an empty one of this test."""
    pytest.importorskip("torch", reason="dsv32.torch needs torch")
    import tempfile
    import dsv32.torch as dt
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return dt.check, tmp


def test_check_never_writes_over_its_golden(tmp_path, small, torch_check):
    check, _ = torch_check
    golden = str(tmp_path / "g.h5")
    shutil.copy(SMALL, golden)
    before, layer = digest(golden), Replay(small)
    for out in (golden, str(tmp_path / "." / "g.h5")):
        with pytest.raises(OutputError, match="also an input"):
            check(layer, golden, out=out)
    assert digest(golden) == before and layer.calls == 0


def test_check_refuses_an_unwritable_out_before_any_step(tmp_path, small, torch_check):
    check, _ = torch_check
    layer = Replay(small)
    with pytest.raises(OutputError, match="does not exist"):
        check(layer, small, out=str(tmp_path / "missing" / "c.h5"))
    assert layer.calls == 0


def test_check_leaves_nothing_behind_when_it_passes_or_cannot_write(small, torch_check):
    check, tmp = torch_check
    v = check(Replay(small), small)
    assert v.passed and v.candidate is None and os.listdir(tmp) == []

    class Unwritable(Replay):  # a top-k stage no int32 holds: write_candidate refuses it
        def __call__(self, batch):
            import dsv32.torch as dt
            import torch
            dt.record("layer0/topk", torch.full((batch.num_padded, 8), 2**40))
            return super().__call__(batch)
    with pytest.raises(ValueError, match="does not fit int32"):
        check(Unwritable(small), small)
    assert os.listdir(tmp) == []


def test_a_failing_check_keeps_its_candidate_for_the_command_it_prints(small, torch_check):
    check, tmp = torch_check
    v = check(Replay(small, scale=2.0), small)
    assert not v.passed and os.path.isfile(v.candidate)
    assert v.command == f"dsv32 judge {v.candidate} --golden {small.path}"
    assert [os.path.join(tmp, d, "candidate.h5") for d in os.listdir(tmp)] == [v.candidate]


USER_TEST = '''
def test_layer(dsv32_golden):
    assert dsv32_golden.steps
'''


def run_plugin(tmp_path, *args):
    (tmp_path / "test_user.py").write_text(USER_TEST)
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "dsv32.pytest_plugin",
                        "-p", "no:cacheprovider", "test_user.py", *args],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    return p.returncode, p.stdout + p.stderr


@pytest.mark.parametrize("args, words", [
    ((), "none was given"),
    (("--dsv32-golden", "missing.h5"), "missing.h5"),
    (("--dsv32-golden", "."), "a directory"),
    (("--dsv32-golden", SMALL, "--dsv32-mode", "eager,"), "'' is no mode"),
    (("--dsv32-golden", SMALL, "--dsv32-mode", "eager,eager"), "given twice"),
])
def test_the_plugin_refuses_a_run_that_would_check_nothing(tmp_path, args, words):
    """A usage error (pytest's exit 4) naming the option, never a run of skips that exits 0."""
    rc, out = run_plugin(tmp_path, *args)
    assert rc == 4 and words in out, (rc, out[-2000:])


def test_the_plugin_takes_goldens_from_the_ini_file(tmp_path):
    (tmp_path / "pytest.ini").write_text(f"[pytest]\ndsv32_golden = {SMALL}\n")
    rc, out = run_plugin(tmp_path)
    assert rc == 0 and "1 passed" in out, out[-2000:]


def fake_tool(tmp_path, script):
    path = tmp_path / "fake-dsv32"
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(0o755)
    return str(path)


def test_a_broken_tool_is_named_not_blamed_on_the_golden(tmp_path):
    with pytest.raises(dsv32.ToolError, match="exit 1"):
        dsv32.read_golden(SMALL, tool=fake_tool(tmp_path, "exit 1"))
    with pytest.raises(dsv32.ToolError, match="exit 0"):  # says nothing of the file: no pass
        dsv32.read_golden(SMALL, tool=fake_tool(tmp_path, "exit 0"))


def test_a_report_the_package_cannot_read_is_named(tmp_path, small):
    cand = str(tmp_path / "c.h5")
    dsv32.write_candidate(cand, perfect(small))
    # Writes '{}' as the report (the path after --json) and exits 0.
    tool = fake_tool(tmp_path, 'while [ "$1" != --json ]; do shift; done; echo "{}" > "$2"')
    with pytest.raises(dsv32.ToolError, match="not what this package reads"):
        dsv32.judge(cand, SMALL, tool=tool)


def test_paths_that_look_like_options_are_paths(tmp_path, small, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copy(SMALL, "--help")
    assert dsv32.read_golden("--help").steps
    dsv32.write_candidate("-c.h5", perfect(small))
    assert dsv32.judge("-c.h5", "--help").passed


def test_an_unreadable_attribute_is_named_or_left_out(tmp_path):
    path = edited(tmp_path, "attr", lambda f: f.attrs.create(
        "generator", b"\xff\xfe", dtype=h5py.string_dtype("utf-8", 2)))
    # The tool takes it (it reads the bytes), so the package leaves out what h5py cannot
    # decode; without the tool the attribute is named.
    assert "generator" not in dsv32.read_golden(path).attrs
    with pytest.raises(dsv32.GoldenFileError, match="generator"):
        dsv32.read_golden(path, validate_with_tool=False)


@pytest.mark.parametrize("call, words", [
    (lambda: dsv32.read_golden(SMALL, max_bytes=float("inf")), "max_bytes"),
    (lambda: dsv32.bf16_values(70000), "bf16_values"),
    (lambda: dsv32.e4m3_values(300), "e4m3_values"),
    (lambda: dsv32.e4m3_values(1.7), "e4m3_values"),
    (lambda: dsv32.judge(SMALL, SMALL, require=[3]), "require"),
    (lambda: dsv32.judge(SMALL, SMALL, tp=0), "tp"),
    (lambda: dsv32.write_candidate(3, [{"output": np.ones(1)}]), "a path"),
    (lambda: dsv32.write_candidate("x.h5", {"output": np.ones(1)}), "list of steps"),
    (lambda: dsv32.write_candidate("x.h5", [{"../x": np.ones(1), "output": np.ones(1)}]),
     "no stage name"),
    (lambda: dsv32.write_candidate("x.h5", [{"output": np.float64(1)}]), "shape"),
])
def test_a_bad_argument_is_named(tmp_path, monkeypatch, call, words):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=words):
        call()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("steps", [[99], [-1], "01", [1], [0, 0], [True]])
def test_run_steps_runs_a_goldens_first_steps_in_order(small, steps):
    pytest.importorskip("torch", reason="dsv32.torch needs torch")
    import dsv32.torch as dt
    layer = Replay(small)
    with pytest.raises(ValueError, match="first steps in order"):
        dt.run_steps(layer, small, steps=steps)
    assert layer.calls == 0


def test_failure_text_of_a_passing_verdict_says_pass(small, torch_check):
    check, _ = torch_check
    import dsv32.torch as dt
    assert dt.failure_text(check(Replay(small), small)).startswith("dsv32: pass")


def test_the_plugin_refuses_a_device_that_is_not_here(tmp_path):
    rc, out = run_plugin(tmp_path, "--dsv32-golden", SMALL, "--dsv32-device", "bogus")
    assert rc == 4 and "--dsv32-device 'bogus'" in out, out[-2000:]


def test_a_link_to_nothing_is_named_or_left_out(tmp_path):
    """h5py yields None for a dangling link (it ended in AttributeError on a newer h5py): a
    member the tool does not read is left out; without the tool it is named."""
    path = edited(tmp_path, "ghost", lambda f: f["steps/step0/expected/layer0"].__setitem__(
        "ghost", h5py.SoftLink("/nowhere")))
    assert "layer0/ghost" not in dsv32.read_golden(path).steps[0].expected
    with pytest.raises(dsv32.GoldenFileError, match="layer0/ghost: a link to nothing"):
        dsv32.read_golden(path, validate_with_tool=False)
