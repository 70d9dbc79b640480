#!/usr/bin/python3
"""Bad input never passes, never crashes, never eats the machine (issue 29, docs/BAD_INPUT.md):
one check per defect found by a hostile user, each run through the dsv32 tool as a user would,
under a memory bound (4 GiB of address space) and a time bound (60 s). Each expects an exit code
and words of the message that name the file, dataset, key or flag.

usage: test_bad_input.py FIXTURES_DIR SCRATCH_DIR   (DSV32_TOOL names the dsv32 tool)
Exit 77 (a ctest skip) without numpy or h5py."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bad_input_tool import (DEFAULT, FIXTURES, SCRATCH, TOOL, bounded, copy, edit,  # noqa: E402
                            expect, poke, set_config, tool)
from checklist import check, finish  # noqa: E402

import h5py  # noqa: E402  (bad_input_tool has made sure of both)
import numpy as np  # noqa: E402

# 1. An Inf in a reference golden's expected tensor turned its gate off.
inf = edit(copy("default", "inf-expected"),
           lambda f: poke(f, "steps/step2/expected/layer1/o", 5, np.inf))
random_cand = edit(copy("default", "random-candidate"),
                   lambda f: f["steps/step2/expected/layer1/o"].__setitem__(
                       Ellipsis, np.random.default_rng(1).normal(
                           size=f["steps/step2/expected/layer1/o"].shape)))
expect("1. Inf in a reference's expected tensor is refused by diff",
       tool("diff", random_cand, inf), 2, "/steps/step2/expected/layer1/o: +Inf at (0, 5)")
poisoned = os.path.join(SCRATCH, "poisoned-fixtures")
shutil.copytree(FIXTURES, poisoned)
shutil.copy(inf, os.path.join(poisoned, "default.h5"))
expect("1. selfcheck fails a fixture with an Inf", tool("selfcheck", "--fixtures", poisoned), 1,
       "FAIL", "+Inf at (0, 5)")

# 2. A full disk while writing: SIGSEGV in HDF5's exit-time cleanup; a manifest left empty.
out = os.path.join(SCRATCH, "full-disk")
os.makedirs(out)
code, text = tool("golden", "--case", "mixed", "--out", out, fsize=200 * 1024)
expect("2. a size limit while writing a golden is an error naming the file", (code, text), 2,
       "cannot write", "mixed.h5.", ".tmp", "File too large")
check("2. ... and leaves no file behind", os.listdir(out) == [], os.listdir(out))
manifest = os.path.join(out, "MANIFEST.json")
big = {"cases": [{"case": f"other-{i:05d}", "file": "x.h5", "padding": "p" * 200}
                 for i in range(6000)], "schema_version": 1}
with open(manifest, "w") as f:
    json.dump(big, f)
before = open(manifest, "rb").read()
code, text = tool("golden", "--case", "kv-fp8", "--out", out, fsize=len(before) - 4096)
expect("2. a manifest that cannot be written is an error", (code, text), 2, "cannot write",
       "MANIFEST.json")
check("2. ... and the old manifest is left whole", open(manifest, "rb").read() == before)

# 3. A corrupted string attribute (global-heap object length 2^40) crashed the reader.
heap = copy("default", "heap-length")
data = bytearray(open(heap, "rb").read())
at = data.find(b"GCOL")
data[at + 24:at + 32] = (1 << 40).to_bytes(8, "little")
open(heap, "wb").write(bytes(data))
expect("3. a damaged global heap is refused, not a crash", tool("diff", heap, DEFAULT), 2,
       "heap-length.h5")

# 4. No bounds on sizes.
cap = edit(copy("default", "capture-huge"),
           lambda f: f["steps/step0/inputs"].attrs.__setitem__("capture_size", 20000000))
t0 = time.monotonic()
expect("4. capture_size 20000000 is refused by name", tool("diff", cap, DEFAULT), 2,
       "/steps/step0/inputs: attribute capture_size = 20000000 is outside")
check("4. ... at once", time.monotonic() - t0 < 10, f"{time.monotonic() - t0:.1f} s")
cap2 = edit(copy("default", "capture-max"),
            lambda f: f["steps/step0/inputs"].attrs.__setitem__("capture_size", 2**31 - 1))
expect("4. capture_size 2^31-1 is refused by name", tool("diff", cap2, DEFAULT), 2,
       "capture_size = 2147483647")


def lazy_table(f):
    g = f["steps/step1/inputs"]
    R = g["block_table"].shape[0]
    del g["block_table"]
    d = g.create_dataset("block_table", shape=(R, 400_000_000), dtype="int32",
                         chunks=(1, 1 << 20), fillvalue=-1)
    d.attrs["dtype"] = "int32"


lazy = edit(copy("default", "lazy-table"), lazy_table)
expect("4. a lazily allocated (R, 4e8) block_table is refused before it is read",
       tool("diff", lazy, DEFAULT), 2, "/steps/step1/inputs/block_table: shape (")

# 5. Ignored write failures.
expect("5. diff --json into a missing directory is an error",
       tool("diff", "--json", "/nonexistent/x.json", DEFAULT, DEFAULT), 2,
       "/nonexistent/x.json", "No such file or directory")

# 6. The reader stopped at the first missing step.
gap = edit(copy("default", "gap"), lambda f: f.__delitem__("steps/step1"))
expect("6. a missing middle step is named", tool("diff", gap, gap), 2,
       "/steps/step1: missing group")
no0 = edit(copy("default", "no-step0"), lambda f: f.__delitem__("steps/step0"))
expect("6. a missing step0 is named", tool("diff", no0, no0), 2, "/steps/step0: missing group")

# 7. Integers truncated instead of refused.
for value, word in ((2**32 + 64, "fits in int32"), (64.9, "expected an integer"),
                    (True, "expected an integer")):
    p = set_config(copy("default", f"hidden-{value}"), "hidden_size", value)
    expect(f"7. config hidden_size {value!r} is refused", tool("diff", p, p), 2,
           "key 'hidden_size'", word)
p = edit(copy("default", "capture-wrap"),
         lambda f: f["steps/step0/inputs"].attrs.__setitem__("capture_size", 2**32 + 16))
expect("7. capture_size 2^32+16 is refused", tool("diff", p, p), 2, "capture_size = 4294967312")
p = edit(copy("default", "blocks-wrap"), lambda f: f.attrs.__setitem__("num_blocks", 2**32 + 64))
expect("7. num_blocks 2^32+64 is refused", tool("diff", p, p), 2, "num_blocks = 4294967360")

# 8. ctx_len 2^31-1 overflowed.
p = edit(copy("default", "ctx-max"),
         lambda f: poke(f, "steps/step1/inputs/ctx_len", 0, 2**31 - 1))
expect("8. ctx_len 2^31-1 is refused naming ctx_len", tool("diff", p, p), 2,
       "/steps/step1/inputs/ctx_len: entry 0 = 2147483647")
expect("8. bench-oracle --context 2147483647 is refused", tool("bench-oracle", "--context",
                                                               2**31 - 1), 2, "--context")


# 9. block_table: other negatives taken as padding, holes compacted, ids never range-checked.
def table_edit(fn):
    def go(f):
        d = f["steps/step1/inputs/block_table"]
        a = d[()]
        fn(a)
        d[...] = a
    return go


p = edit(copy("default", "table-minus2"), table_edit(lambda a: a.__setitem__((0, a.shape[1] - 1), -2)))
expect("9. a block id of -2 is refused", tool("diff", p, p), 2, "block_table: entry (0,", "= -2")
p = edit(copy("default", "table-hole"), table_edit(lambda a: a.__setitem__((0, 0), -1)))
expect("9. a hole in a block table is refused", tool("diff", p, p), 2, "follows -1",
       "no holes")


def past(f):
    """A column more, -1 except an id past the cache in row 0: past the blocks it needs."""
    g = f["steps/step1/inputs"]
    a = g["block_table"][()]
    wider = np.full((a.shape[0], a.shape[1] + 1), -1, dtype=np.int32)
    wider[:, :-1] = a
    wider[0, int((a[0] >= 0).sum())] = 5000
    del g["block_table"]
    g.create_dataset("block_table", data=wider).attrs["dtype"] = "int32"


p = edit(copy("default", "table-past"), past)
expect("9. a block id past the cache is refused", tool("diff", p, p), 2, "= 5000",
       "outside the cache's")

# 10. An interrupted writer left NAME.h5.PID-N.tmp: signalled the moment a temporary file appears.
for sig in (signal.SIGTERM, signal.SIGINT):
    out = os.path.join(SCRATCH, f"interrupted-{sig.name}")
    os.makedirs(out)
    proc = subprocess.Popen([TOOL, "golden", "--case", "wide", "--out", out],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=bounded())
    seen = False
    while proc.poll() is None:
        if any(n.startswith("wide.h5.") and n.endswith(".tmp") for n in os.listdir(out)):
            proc.send_signal(sig)
            seen = True
            break
        time.sleep(0.0005)
    proc.wait()
    left = sorted(os.listdir(out))

    def whole(name):  # what is left is whole (the signal may land just after a rename)
        try:
            if name.endswith(".h5"):
                with h5py.File(os.path.join(out, name), "r") as f:
                    return "steps" in f
            with open(os.path.join(out, name)) as f:
                return isinstance(json.load(f), dict)
        except Exception:  # noqa: BLE001
            return False
    check(f"10. {sig.name} while writing leaves no temporary file",
          not any(n.endswith(".tmp") for n in left) and all(whole(n) for n in left),
          f"left {left} (signalled: {seen}, exit {proc.returncode})")

# 11. A FIFO given as a golden blocked forever.
fifo = os.path.join(SCRATCH, "fifo.h5")
os.mkfifo(fifo)
expect("11. a FIFO is refused at once", tool("diff", fifo, DEFAULT, timeout=20), 2, "FIFO")
expect("11. a directory is refused", tool("judge", SCRATCH, "--golden", DEFAULT, timeout=20), 2,
       "directory")

# 12. Smaller ones.
p = edit(copy("default", "weights-inf"),
         lambda f: poke(f, "weights/layer1/w_o", 7, 0x7F80))  # bf16 +Inf
expect("12. Inf in weights is refused", tool("diff", p, p), 2, "/weights/layer1/w_o: +Inf")
p = edit(copy("default", "weights-nan"),
         lambda f: poke(f, "weights/layer0/g_q", 3, 0x7FC0))  # bf16 NaN
expect("12. NaN in weights is refused", tool("diff", p, p), 2, "/weights/layer0/g_q: NaN")
expect("12. different configs name the field",
       tool("diff", os.path.join(FIXTURES, "kv-fp8.h5"), os.path.join(FIXTURES, "hadamard-on.h5")),
       2, "different configs: hadamard")
p = edit(copy("default", "config-array"),
         lambda f: f.attrs.__setitem__("config", json.dumps([json.loads(f.attrs["config"])])))
expect("12. a config that is a JSON array is named", tool("diff", p, p), 2,
       "config JSON: expected an object", "array")
code, text = tool("resource-spec", "-o", SCRATCH)
expect("12. resource-spec -o DIR is refused", (code, text), 2, "is a directory")
check("12. ... without saying Success", "Success" not in text, text)
code, text = tool("bench-oracle", "--repeats", "0")
expect("12. --repeats 0 is refused with its range", (code, text), 2, "--repeats",
       "0 is outside [1,")
check("12. ... without a 309-digit bound", len(max(text.split(), key=len)) < 40, text)
expect("12. --tp two is not an integer", tool("judge", DEFAULT, "--golden", DEFAULT, "--tp", "two"),
       2, "'two' is not an integer")
blocked = os.path.join(SCRATCH, "write-label")
os.makedirs(os.path.join(blocked, "kv-fp8.h5", "inside"))
expect("12. a write failure is labelled as one", tool("golden", "--case", "kv-fp8", "--out",
                                                       blocked), 2, "cannot write", "kv-fp8.h5")
code, text = tool("golden", "--case", "kv-fp8", "--case", "kv-fp8", "--out",
                  os.path.join(SCRATCH, "twice"))
expect("12. --case X --case X is refused", (code, text), 2, "kv-fp8 is asked for twice")
expect("12. a missing --fixtures directory is a usage error",
       tool("selfcheck", "--fixtures", os.path.join(SCRATCH, "no-such-dir")), 2, "--fixtures")

# Found in review: a candidate's members are numbered as strictly as a golden's steps.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import dsv32  # noqa: E402

golden = dsv32.read_golden(DEFAULT)
cand = os.path.join(SCRATCH, "candidate.h5")
dsv32.write_candidate(cand, [{k: v.copy() for k, v in st.expected.items()} for st in golden.steps])
for bad in ("layer01", "layer99999999999"):
    p = os.path.join(SCRATCH, f"candidate-{bad}.h5")
    shutil.copy(cand, p)
    edit(p, lambda f: f.move("steps/step0/expected/layer1", f"steps/step0/expected/{bad}"))
    expect(f"a candidate's {bad} is refused, not ignored", tool("judge", p, "--golden", DEFAULT),
           2, f"/steps/step0/expected/{bad}: not a member of a candidate step")

finish()
