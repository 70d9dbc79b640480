#!/usr/bin/python3
"""Layers nobody here wrote, run on committed goldens with the goldens' own top-k sets: they pass
where the cache is bf16 and fail at `c` under an fp8_ds_mla cache, which neither has (both once
passed an fp8 golden, issue 39).
- `hf`: Hugging Face transformers' DeepSeek-V3.2 attention (python/examples/hf_deepseek_v32.py);
- `deepseek`: DeepSeek's reference demo (python/examples/deepseek_reference.py), from the clone's
  inference/ folder named by $DSV32_DEEPSEEK_REF.

usage: test_foreign_layer.py hf|deepseek FIXTURES_DIR SCRATCH_DIR  (DSV32_TOOL names the tool)
Exit 77 (a ctest skip) where the layer is not importable (CI's Debian has neither; the GPU
machine's transformers 5.17 has the first, and the second where the clone is carried)."""
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "tools"))
from checklist import check, finish  # noqa: E402

EXAMPLES = os.path.join(here, "..", "..", "python", "examples")
WHICH, FIXTURES, SCRATCH = sys.argv[1], sys.argv[2], sys.argv[3]
if WHICH == "hf":
    example, extra = "hf_deepseek_v32.py", []
else:
    ref = os.environ.get("DSV32_DEEPSEEK_REF", "")
    if not ref:
        print("skipped: $DSV32_DEEPSEEK_REF does not name a DeepSeek-V3.2-Exp clone's inference/")
        sys.exit(77)
    example, extra = "deepseek_reference.py", ["--ref", ref]
device = os.environ.get("DSV32_FOREIGN_DEVICE", "cpu")
os.makedirs(SCRATCH, exist_ok=True)


def adapter(case):
    out = os.path.join(SCRATCH, f"{WHICH}-{case}.h5")
    p = subprocess.run([sys.executable, os.path.join(EXAMPLES, example),
                        os.path.join(FIXTURES, case + ".h5"), "--out", out, "--device", device,
                        *extra], capture_output=True, text=True, timeout=600)
    if p.returncode == 77:
        print(p.stdout.strip())
        sys.exit(77)
    return p.returncode, p.stdout + p.stderr


for case in ("default", "fs-pattern", "precision-fp32"):
    rc, text = adapter(case)
    check(f"{WHICH}: the layer with the golden's sets passes {case}", rc == 0, text[-800:])
rc, text = adapter("kv-fp8")
check(f"{WHICH}: ... and fails the fp8_ds_mla golden at c, naming the unquantized latent",
      rc == 1 and "FAIL at step0/layer0/c" in text and "was the latent quantized?" in text,
      text[-800:])
finish()
