"""`git bisect run` with a golden as the predicate (tools/git-bisect-golden.sh, issue 53), on a
history made here: an engine (python/examples/numpy_layer.py, copied into a fresh repository)
whose fifth commit plants a bug (MLA RoPE on half-split pairs) among commits that change
nothing of the layer, and one whose build fails (skipped, exit 125). Bisect must name the
planted commit."""
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tools", "git-bisect-golden.sh")
TOOL = os.environ.get("DSV32_TOOL", "dsv32")
FIXTURES = os.environ.get("DSV32_FIXTURES") or os.path.join(ROOT, "fixtures")
GOLDEN = os.path.join(FIXTURES, "prefill-only.h5")
pytest.importorskip("h5py", reason="install python3-h5py")
pytest.importorskip("numpy", reason="install python3-numpy")
if shutil.which("git") is None:
    pytest.skip("git is not installed", allow_module_level=True)


def git(repo, *args):
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def commit(repo, message):
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """(repository, the first commit, the planted commit, the last commit)."""
    repo = str(tmp_path_factory.mktemp("engine"))
    git(repo, "init", "-q")
    layer = os.path.join(repo, "layer.py")
    shutil.copy(os.path.join(ROOT, "python", "examples", "numpy_layer.py"), layer)
    first = commit(repo, "the layer")
    for i in range(3):
        with open(os.path.join(repo, "NOTES"), "a") as f:
            f.write(f"note {i}\n")
        commit(repo, f"note {i}")
    text = open(layer).read()
    planted_text = text.replace('ap.add_argument("--defect", choices=DEFECTS)',
                                'ap.add_argument("--defect", choices=DEFECTS, default="rope-pairs")')
    assert planted_text != text, "numpy_layer.py's --defect option moved: update this test"
    open(layer, "w").write(planted_text)
    planted = commit(repo, "a refactor that breaks RoPE")
    open(os.path.join(repo, "BROKEN"), "w").write("the build fails here\n")
    commit(repo, "a commit whose build fails")
    os.remove(os.path.join(repo, "BROKEN"))
    last = commit(repo, "the build again")
    return repo, first, planted, last


def env():
    e = dict(os.environ)
    e["PYTHONPATH"] = os.path.join(ROOT, "python") + os.pathsep + e.get("PYTHONPATH", "")
    return e


def predicate(golden=GOLDEN):
    """The script's command line: the build fails where BROKEN exists; the engine's candidate
    is the layer's (its own verdict and exit status ignored)."""
    candidate = f"{shlex.quote(sys.executable)} layer.py {shlex.quote(golden)} " \
                '--out "$DSV32_CANDIDATE" > /dev/null'
    return ["bash", SCRIPT, "--golden", golden, "--tool", TOOL, "--build", "test ! -e BROKEN",
            "--candidate", candidate]


def test_bisect_names_the_planted_commit(history):
    repo, first, planted, last = history
    git(repo, "bisect", "start", last, first)
    try:
        run = subprocess.run(["git", "-C", repo, "bisect", "run", *predicate()],
                             capture_output=True, text=True, env=env(), cwd=repo, timeout=900)
    finally:
        subprocess.run(["git", "-C", repo, "bisect", "reset"], capture_output=True)
    found = re.search(r"^([0-9a-f]{40}) is the first bad commit", run.stdout, re.M)
    assert found and found.group(1) == planted, run.stdout[-1500:] + run.stderr[-1500:]


@pytest.mark.parametrize("where,want", [("first", 0), ("planted", 1)])
def test_a_good_commit_exits_0_and_a_bad_one_1(history, where, want):
    repo, first, planted, _ = history
    git(repo, "checkout", "-q", {"first": first, "planted": planted}[where])
    run = subprocess.run(predicate(), capture_output=True, text=True, env=env(), cwd=repo,
                         timeout=600)
    assert run.returncode == want, run.stderr[-1500:]


def test_a_commit_whose_build_fails_is_skipped_with_125(history):
    repo = history[0]
    git(repo, "checkout", "-q", git(repo, "log", "--format=%H", "--all", "-n1",
                                     "--grep", "a commit whose build fails"))
    run = subprocess.run(predicate(), capture_output=True, text=True, env=env(), cwd=repo,
                         timeout=600)
    assert run.returncode == 125 and "the build failed" in run.stderr, run.stderr[-800:]


def test_usage_errors_stop_the_bisection_instead_of_skipping(history):
    repo = history[0]
    run = subprocess.run(["bash", SCRIPT, "--golden", os.path.join(repo, "no.h5"),
                          "--candidate", "true", "--tool", TOOL],
                         capture_output=True, text=True, cwd=repo)
    assert run.returncode == 2 and "no golden file" in run.stderr, run.stderr
