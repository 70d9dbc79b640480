"""Layers nobody here wrote, run on committed goldens with the goldens' own top-k sets: they pass
where the cache is bf16 and fail at `c` under an fp8_ds_mla cache, which neither has (both once
passed an fp8 golden, issue 39).
- `hf`: Hugging Face transformers' DeepSeek-V3.2 attention (python/examples/hf_deepseek_v32.py);
- `deepseek`: DeepSeek's reference demo (python/examples/deepseek_reference.py), from the clone's
  inference/ folder named by $DSV32_DEEPSEEK_REF.

    DSV32_TOOL=build/default/tools/dsv32 python3 -m pytest tests/python/test_foreign_layer.py -k hf
(ctest: Python.TransformersLayerPassesBf16AndFailsFp8AtC with -k hf,
Python.DeepSeekDemoPassesBf16AndFailsFp8AtC with -k deepseek.) A layer skips, with the reason,
where it is not importable (CI's Debian has neither; the GPU machine's transformers 5.17 has the
first, and the second where the clone is carried). $DSV32_FOREIGN_DEVICE: cpu (default) or
cuda."""
import os
import subprocess
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "python", "examples")
LAYERS = ["hf", "deepseek"]


def adapter(which, case, fixtures_dir, scratch):
    """(exit code, output) of the example adapter judging `which` on golden `case`; a skip where
    the layer is not importable (the adapter's exit 77)."""
    if which == "hf":
        example, extra = "hf_deepseek_v32.py", []
    else:
        ref = os.environ.get("DSV32_DEEPSEEK_REF", "")
        if not ref:
            pytest.skip("$DSV32_DEEPSEEK_REF does not name a DeepSeek-V3.2-Exp clone's inference/")
        example, extra = "deepseek_reference.py", ["--ref", ref]
    out = os.path.join(scratch, f"{which}-{case}.h5")
    p = subprocess.run([sys.executable, os.path.join(EXAMPLES, example),
                        os.path.join(fixtures_dir, case + ".h5"), "--out", out, "--device",
                        os.environ.get("DSV32_FOREIGN_DEVICE", "cpu"), *extra],
                       capture_output=True, text=True, timeout=600)
    if p.returncode == 77:
        pytest.skip(p.stdout.strip())
    return p.returncode, p.stdout + p.stderr


@pytest.mark.parametrize("case", ["default", "fs-pattern", "precision-fp32"])
@pytest.mark.parametrize("which", LAYERS)
def test_the_layer_with_the_goldens_sets_passes(which, case, fixtures_dir, scratch):
    rc, text = adapter(which, case, fixtures_dir, scratch)
    assert rc == 0, text[-800:]


@pytest.mark.parametrize("which", LAYERS)
def test_and_fails_the_fp8_ds_mla_golden_at_c_naming_the_unquantized_latent(which, fixtures_dir,
                                                                            scratch):
    rc, text = adapter(which, "kv-fp8", fixtures_dir, scratch)
    assert rc == 1 and "FAIL at step0/layer0/c" in text and "was the latent quantized?" in text, \
        text[-800:]
