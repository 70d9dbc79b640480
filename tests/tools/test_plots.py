"""tools/plot_bench.py makes every figure from the committed benchmark JSON (docs/), each a PNG
of plausible size, and refuses a JSON of another mode by naming the missing key.

usage: test_plots.py DOCS_DIR SCRATCH_DIR   (exit 77, a ctest skip, without matplotlib)"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklist import check, finish  # noqa: E402

try:
    import matplotlib  # noqa: F401
except ImportError as e:
    print(f"skipped: {e} (install python3-matplotlib)")
    sys.exit(77)

DOCS, SCRATCH = sys.argv[1], sys.argv[2]
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "plot_bench.py")
os.makedirs(SCRATCH, exist_ok=True)


def plot(*args):
    return subprocess.run([sys.executable, SCRIPT, "--out", SCRATCH, *args],
                          capture_output=True, text=True)


inputs = {"whatif": os.path.join(DOCS, "bench-gpu-whatif.json"),
          "per-op": os.path.join(DOCS, "bench-gpu-per-op-decode.json"),
          "memory": os.path.join(DOCS, "bench-gpu-memory.json")}
for flag, path in inputs.items():
    name = os.path.basename(path)
    png = os.path.join(SCRATCH, flag + ".png")
    if os.path.exists(png):
        os.remove(png)
    extra = ["--preset", "dsv32"] if flag == "per-op" else []
    r = plot(f"--{flag}", path, *extra)
    ok = r.returncode == 0 and os.path.exists(png)
    with open(png, "rb") if ok else open(os.devnull, "rb") as f:
        head = f.read(8)
    check(f"{name}: {flag}.png", ok and head == b"\x89PNG\r\n\x1a\n" and
          os.path.getsize(png) > 10000, r.stderr.strip())

# A JSON of another mode: the key it lacks is named, nothing is drawn.
png = os.path.join(SCRATCH, "memory.png")
os.remove(png)
r = plot("--memory", inputs["per-op"])
check("a per-op JSON given as --memory is refused by name",
      r.returncode != 0 and "'runs'" in r.stderr and not os.path.exists(png), r.stderr.strip())
r = plot("--whatif", os.path.join(SCRATCH, "no-such.json"))
check("a missing file is refused by name", r.returncode != 0 and "no-such.json" in r.stderr,
      r.stderr.strip())

finish()
