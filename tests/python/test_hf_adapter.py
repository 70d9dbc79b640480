#!/usr/bin/python3
"""Hugging Face transformers' DeepSeek-V3.2 attention (python/examples/hf_deepseek_v32.py), run on
committed goldens with the goldens' own top-k sets: it passes where the cache is bf16, and fails at
`c` under an fp8_ds_mla cache, which it has not (it once passed an fp8 golden).

usage: test_hf_adapter.py FIXTURES_DIR SCRATCH_DIR   (DSV32_TOOL names the dsv32 tool)
Exit 77 (a ctest skip) where transformers has no DeepSeek-V3.2 model (CI's Debian has none; the
GPU machine's transformers 5.17 has)."""
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, ".."))
from checklist import check, finish  # noqa: E402

EXAMPLE = os.path.join(here, "..", "..", "python", "examples", "hf_deepseek_v32.py")
FIXTURES, SCRATCH = sys.argv[1], sys.argv[2]
os.makedirs(SCRATCH, exist_ok=True)


def adapter(case, *flags):
    out = os.path.join(SCRATCH, case + "".join(flags) + ".h5")
    p = subprocess.run([sys.executable, EXAMPLE, os.path.join(FIXTURES, case + ".h5"), "--out",
                        out, *flags], capture_output=True, text=True, timeout=600)
    if p.returncode == 77:
        print(p.stdout.strip())
        sys.exit(77)
    return p.returncode, p.stdout + p.stderr


for case in ("default", "fs-pattern", "precision-fp32"):
    rc, text = adapter(case)
    check(f"transformers' layer with the golden's sets passes {case}", rc == 0, text[-800:])
rc, text = adapter("kv-fp8")
check("... and fails the fp8_ds_mla golden at c, naming the unquantized latent",
      rc == 1 and "FAIL at step0/layer0/c" in text and "was the latent quantized?" in text,
      text[-800:])
finish()
