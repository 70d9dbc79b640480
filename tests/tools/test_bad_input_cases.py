#!/usr/bin/python3
"""Bad input, the third probe (docs/BAD_INPUT.md): case files and configs (deep, duplicated,
mistyped), shared outputs (two writers, a malformed or blocking manifest, an output that is an
input), the environment and the command line (absurd thread counts, contradicting and empty
flags, products of sizes), goldens the tool would itself refuse, and the Python package's reader
and writer. Each runs as a user would, bounded (bad_input_tool), and expects an exit code and
the words that name the problem.

usage: test_bad_input_cases.py FIXTURES_DIR SCRATCH_DIR   (DSV32_TOOL names the dsv32 tool)"""
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bad_input_tool import (DEFAULT, FIXTURES, SCRATCH, TOOL, bounded, compressed_copy,  # noqa: E402
                            copy, edit, expect, tool)
from checklist import check, finish  # noqa: E402

import h5py  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import dsv32  # noqa: E402

STEPS = [{"requests": [{"id": 0, "new_tokens": 3}]}]


def case_file(name, text):
    p = os.path.join(SCRATCH, name + ".json")
    with open(p, "w") as f:
        f.write(text if isinstance(text, str) else json.dumps(text))
    return p


def case(config=None, **root):
    return {"name": "c", "config": {"preset": "tiny", **(config or {})}, "steps": STEPS, **root}


def out_dir(name):
    d = os.path.join(SCRATCH, name)
    os.makedirs(d, exist_ok=True)
    return d


# Case files and configs.
deep = '{"name": "c", "config": {"preset": "tiny"}, "steps": ' + "[" * 50000 + "]" * 50000 + "}"
expect("a case file nested 50000 deep is refused, not a stack overflow",
       tool("golden", "--spec", case_file("deep", deep), "--out", out_dir("o")), 2,
       "nested deeper than 64")
expect("a key given twice is refused, not resolved last-wins",
       tool("golden", "--spec", case_file("dup", '{"name": "a", "name": "b", "config": {}, '
                                                 '"steps": []}'), "--out", out_dir("o")), 2,
       "key 'name' given twice")
expect("a NUL in a case name is refused by name",
       tool("golden", "--spec", case_file("nul", case(name="a\u0000b")), "--out", out_dir("o")),
       2, "file-name-safe", "a\\u0000b")
expect("a config's numeric name is refused",
       tool("golden", "--spec", case_file("num-name", case({"name": 5})), "--out", out_dir("o")),
       2, "config.name: expected a string")
expect("1e19 is quoted as written, not as INT64_MIN",
       tool("golden", "--spec", case_file("seed", case(seed=1e19)), "--out", out_dir("o")), 2,
       "got 1e+19")
hf = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "hf",
                                 "deepseek-v3.2-exp.json")))
for key, value, words in (("indexer_rope_interleave", "true", "expected true or false"),
                          ("rope_parameters", 5, "expected an object or null")):
    p = case_file(f"hf-{key}", {**hf, key: value})
    expect(f"a Hugging Face {key} of {value!r} is refused, not ignored",
           tool("golden", "--spec", case_file(f"case-hf-{key}", {
               "name": "hf", "config": {"hf_config": p, "num_layers": 1}, "steps": STEPS}),
               "--out", out_dir("o")), 2, key, words)
p = case_file("hf-null", {**hf, "rope_parameters": None})
code, text = tool("golden", "--spec", case_file("case-hf-null", {
    "name": "hfnull", "config": {"hf_config": p, "num_layers": 1, "hidden_size": 64,
                                 "num_heads": 2, "q_lora_rank": 32, "kv_lora_rank": 32,
                                 "index_topk": 8}, "steps": STEPS}), "--out", out_dir("hfnull"))
written = os.path.join(SCRATCH, "hfnull", "hfnull.h5")
ok = code == 0 and os.path.exists(written)
cfg = json.loads(h5py.File(written, "r").attrs["config"]) if ok else {}
check("a null rope_parameters keeps the config's own rope_theta and YaRN",
      ok and cfg["rope_theta"] == hf["rope_theta"] and cfg["rope_scaling"] is not None,
      f"exit {code}: {text[-300:]} {cfg.get('rope_theta')} {cfg.get('rope_scaling')}")

# Goldens the tool would itself refuse are not written.
for name, config, words in (("eps", {"rms_norm_eps": 1e300}, "could not judge a candidate"),
                            ("yarn", {"rope_scaling": {"type": "yarn", "mscale": -10,
                                                       "mscale_all_dim": 1e300}},
                             "could not judge a candidate")):
    d = out_dir(f"refused-{name}")
    expect(f"a golden whose gates are unusable ({name}) is refused",
           tool("golden", "--spec", case_file(f"refused-{name}", case(config)), "--out", d), 2,
           *words.split("|"))
    check(f"... and nothing of it is written ({name})", os.listdir(d) == [], os.listdir(d))

# Shared outputs.
for name, content in (("deep", '{"cases": ' + "[" * 50000 + "]" * 50000 + "}"),
                      ("not-cases", '{"cases": [1]}'), ("dup", '{"cases": [], "cases": []}')):
    d = out_dir(f"manifest-{name}")
    with open(os.path.join(d, "MANIFEST.json"), "w") as f:
        f.write(content)
    expect(f"a malformed MANIFEST.json ({name}) is refused by name",
           tool("golden", "--case", "kv-fp8", "--out", d), 2, "MANIFEST.json")
    check(f"... before the work ({name})", sorted(os.listdir(d)) == ["MANIFEST.json"],
          os.listdir(d))
d = out_dir("manifest-fifo")
os.mkfifo(os.path.join(d, "MANIFEST.json"))
expect("a FIFO where MANIFEST.json belongs is refused at once",
       tool("golden", "--case", "kv-fp8", "--out", d, timeout=30), 2, "MANIFEST.json", "FIFO")
d = out_dir("writers")
procs = [subprocess.Popen([TOOL, "golden", "--case", "kv-fp8", "--case", "fs-pattern", "--out", d],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          preexec_fn=bounded()) for _ in range(4)]
procs.append(subprocess.Popen([TOOL, "golden", "--case", "odd-block", "--out", d],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              preexec_fn=bounded()))
codes = [p.wait(timeout=120) for p in procs]
entries = [e["case"] for e in json.load(open(os.path.join(d, "MANIFEST.json")))["cases"]]
check("five writers into one --out all succeed", codes == [0] * 5, codes)
check("... the manifest keeps every writer's entries", entries == ["fs-pattern", "kv-fp8",
                                                                   "odd-block"], entries)
for n in ("kv-fp8", "fs-pattern", "odd-block"):
    expect(f"... and {n}.h5 is whole and this build's", tool(
        "diff", os.path.join(d, n + ".h5"), os.path.join(FIXTURES, n + ".h5")), 0, "agree")
check("... no temporary file is left", not [n for n in os.listdir(d) if n.endswith(".tmp")],
      os.listdir(d))
g = copy("default", "judged-over")
before = open(g, "rb").read()
expect("an output that is an input is refused", tool("judge", g, "--golden", g, "--json", g), 2,
       "is also an input")
check("... and the input is left as it was", open(g, "rb").read() == before)
spec = case_file("x.candidate", case(name="x"))
expect("a case file that would be overwritten by its own skeleton is refused",
       tool("golden", "--spec", spec, "--out", SCRATCH), 2, "is also an input")

deep_config = copy("default", "deep-config")
with h5py.File(deep_config, "r+") as f:
    f.attrs["config"] = f.attrs["config"][:-1] + ', "x": ' + "[" * 50000 + "]" * 50000 + "}"
expect("a golden's config nested 50000 deep is named, not blamed on libhdf5",
       tool("diff", deep_config, DEFAULT), 2, "config JSON: nested deeper than 64")

# Compressed datasets and a link to a golden are read, not called corrupt.
gz = compressed_copy("default", "gzip", "gzip")
expect("a golden with gzip-compressed datasets is read", tool("diff", gz, DEFAULT), 0, "agree")
link = os.path.join(SCRATCH, "link.h5")
os.symlink(os.path.abspath(DEFAULT), link)
expect("a symbolic link to a golden is read", tool("diff", link, DEFAULT), 0, "agree")

# The environment and the command line.
expect("OMP_NUM_THREADS=100000 is refused by name, not a crash in libgomp",
       tool("golden", "--case", "kv-fp8", "--out", out_dir("omp"),
            env={"OMP_NUM_THREADS": "100000"}), 2, "OMP_NUM_THREADS", "[1, 1024]")
expect("OMP_NUM_THREADS=two is refused by name",
       tool("golden", "--list", env={"OMP_NUM_THREADS": "two"}), 2, "OMP_NUM_THREADS")
expect("--list with --all is refused, not silently preferred", tool("golden", "--list", "--all"),
       2, "--list excludes --all")
expect("--bitwise without --check is refused", tool("golden", "--bitwise", "--case", "kv-fp8",
                                                     "--out", out_dir("o")), 2, "--check")
expect("an empty --json is refused when parsed",
       tool("judge", DEFAULT, "--golden", DEFAULT, "--json", ""), 2, "--json", "empty")
t0 = time.monotonic()
expect("an unknown scenario is refused before any work", tool("selfcheck", "--scenario", "nope"),
       2, "unknown case 'nope'", "known: default")
check("... at once", time.monotonic() - t0 < 10, f"{time.monotonic() - t0:.1f} s")
expect("an unknown mutant lists the known ones", tool("selfcheck", "--mutant", "nope"), 2,
       "unknown mutant 'nope'", "stale-positions")
t0 = time.monotonic()
expect("a malformed --require is refused when parsed, naming the part",
       tool("selfcheck", "--require", "pruned=>1"), 2, "comparison =>", "one of >=")
check("... at once", time.monotonic() - t0 < 10, f"{time.monotonic() - t0:.1f} s")
expect("a --require of an unknown metric lists the known ones",
       tool("judge", DEFAULT, "--golden", DEFAULT, "--require", "prune>=1"), 2,
       "no metric prune", "largest_tie")
expect("bench-oracle: a product of in-range sizes is refused before any work",
       tool("bench-oracle", "--decode", "4096", "--context", "1048576"), 2, "--max-gib")
expect("bench-gpu: a product of in-range sizes is refused before any work",
       tool("bench-gpu", "--decode", "4096", "--context", "1048576", "--layers", "64"), 2,
       "--decode 4096 x --context 1048576 x 64 layers")

code, text = tool("golden", "--case", "kv-fp8", "--out", out_dir("piped"))
check("progress piped is a line an update, no carriage return running them into one",
      code == 0 and "\r" not in text and "kv-fp8: step 1/2\n" in text
      and "kv-fp8: step 2/2\n" in text, repr(text[:300]))
code, text = tool("--version")
expect("--version prints the version", (code, text), 0, "dsv32 0.")
expect("a mistyped command is named, with the commands", tool("judgee", DEFAULT), 2,
       "unknown command 'judgee'", "judge")
expect("an unknown option is named before a missing required one",
       tool("judge", DEFAULT, "--gold", DEFAULT), 2, "unknown option '--gold'")
cand = os.path.join(SCRATCH, "kv-fp8-candidate.h5")
kv = dsv32.read_golden(os.path.join(FIXTURES, "kv-fp8.h5"))
dsv32.write_candidate(cand, [s.expected for s in kv.steps])
expect("diff of a candidate says to judge it", tool("diff", cand, DEFAULT), 2,
       "a candidate file", "dsv32 judge")
expect("a candidate judged against another case's golden is told so",
       tool("judge", cand, "--golden", DEFAULT), 2, "is this a candidate for another case?")
code, text = tool("judge", DEFAULT, "--golden", DEFAULT)
check("a golden judged against itself says every stage is exact, not 'at )'",
      code == 0 and "every judged stage exact" in text and "at )" not in text, text[-300:])
code, text = tool("gpu", DEFAULT)
if code == 2 and not os.path.exists("/dev/nvidiactl"):  # no GPU here
    check("no GPU is told from an old driver", "driver version is insufficient" not in text and
          ("no NVIDIA driver" in text or "no CUDA" in text), text)
    t0 = time.monotonic()
    expect("selfcheck --mutant without the GPU rows says nothing was checked",
           tool("selfcheck", "--mutant", "stale-positions"), 2, "GPU rows did not run")
    check("... before any work", time.monotonic() - t0 < 10, f"{time.monotonic() - t0:.1f} s")

# The Python package.
golden = dsv32.read_golden(DEFAULT)
steps = [{k: v.copy() for k, v in st.expected.items()} for st in golden.steps]
for name, value, words in (("int64", np.array([[2**40]]), "does not fit int32"),
                           ("complex", np.zeros((2, 2)) + 1j, "complex"),
                           ("bool", np.ones((2, 2), dtype=bool), "boolean")):
    bad = [dict(s) for s in steps]
    bad[0]["layer0/topk"] = value
    target = os.path.join(SCRATCH, f"py-{name}.h5")
    try:
        dsv32.write_candidate(target, bad)
        check(f"write_candidate refuses a {name} array", False, "it wrote it")
    except ValueError as e:
        check(f"write_candidate refuses a {name} array", all(w in str(e) for w in
                                                               words.split("|")), str(e))
    left = [n for n in os.listdir(SCRATCH) if n.startswith(f"py-{name}.h5")]
    check(f"... and leaves no file ({name})", left == [], left)


def refused(path, *words, own=None):
    """Whether read_golden refuses `path` naming `words`, and, without the tool's reader in
    front (validate_with_tool=False), by its own checks naming `own` (default `words`)."""
    for validate, want in ((True, words), (False, own or words)):
        try:
            dsv32.read_golden(path, validate_with_tool=validate)
            return False, f"read (validate_with_tool={validate})"
        except dsv32.GoldenFileError as e:
            if not all(w in str(e) for w in want):
                return False, f"validate_with_tool={validate}: {e}"
    return True, ""


fifo = os.path.join(SCRATCH, "py-fifo.h5")
os.mkfifo(fifo)
t0 = time.monotonic()
ok, why = refused(fifo, "FIFO")
check("read_golden refuses a FIFO at once", ok and time.monotonic() - t0 < 5, why)
gap = edit(copy("default", "py-gap"), lambda f: f.move("steps/step3", "steps/step9"))
check("read_golden names a gap in the steps", *refused(gap, "/steps/step3", "missing"))
inf = edit(copy("default", "py-inf"), lambda f: f["steps/step1/expected/layer0/o"].__setitem__(
    (0, 0), np.inf))
check("read_golden refuses an Inf in a golden's tensor", *refused(inf, "layer0/o", "inf"))
true = edit(copy("default", "py-true"), lambda f: f["steps/step0/inputs"].attrs.__setitem__(
    "capture_size", True))
check("read_golden refuses capture_size = true", *refused(true, "capture_size"))


def lazy(f):
    del f["steps/step0/expected/layer0/o"]
    d = f["steps/step0/expected/layer0"].create_dataset("o", shape=(4, 10**9), dtype="f8")
    d.attrs["dtype"] = "float64"


huge = edit(copy("default", "py-lazy"), lazy)
check("read_golden bounds a lazily sized dataset before reading it",
      *refused(huge, "layer0/o", own=("layer0/o", "bytes")))
dupe = copy("default", "py-dup-key")
with h5py.File(dupe, "r+") as f:
    f.attrs["config"] = f.attrs["config"][:-1] + ', "num_layers": 3}'
check("read_golden refuses a config key given twice", *refused(dupe, "num_layers", "twice"))

finish()
