"""dsv32.torch.weights: a golden's weights under Hugging Face's and vLLM's names (docs/TORCH.md,
"Weight names"): exact round trips on every committed golden, vLLM's fused tensors are the HF
tensors stacked, bad state dicts are named, and the HF names and shapes load strictly into
transformers' DeepseekV32Attention where transformers has it (skipped, with the reason, else)."""
import glob
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="dsv32.torch needs torch (Debian: python3-torch)")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import dsv32  # noqa: E402
import example_layers  # noqa: E402
from dsv32.torch import weights as W  # noqa: E402

FIXTURES = os.environ.get("DSV32_FIXTURES", os.path.join(ROOT, "fixtures"))
GOLDENS = sorted(glob.glob(os.path.join(FIXTURES, "*.h5")))


@pytest.mark.parametrize("naming", W.NAMINGS)
@pytest.mark.parametrize("path", GOLDENS, ids=os.path.basename)
def test_round_trip_is_exact(path, naming):
    g = dsv32.read_golden(path)
    back = W.golden_weights(W.state_dict(g, naming), g.config, naming)
    for l, (b, w) in enumerate(zip(back, g.weights)):
        assert set(b) == set(w), f"layer {l}"
        for k in w:
            assert np.array_equal(b[k], w[k]), f"layer {l} {k}"


def test_vllm_fuses_what_hf_keeps_apart():
    g = dsv32.read_golden(os.path.join(FIXTURES, "default.h5"))
    hf, vl = W.state_dict(g, "hf"), W.state_dict(g, "vllm")
    p = "model.layers.0.self_attn."
    assert torch.equal(vl[p + "fused_qkv_a_proj.weight"],
                       torch.cat([hf[p + "q_a_proj.weight"], hf[p + "kv_a_proj_with_mqa.weight"]]))
    assert torch.equal(vl[p + "indexer.wk_weights_proj.weight"],
                       torch.cat([hf[p + "indexer.wk.weight"], hf[p + "indexer.weights_proj.weight"]]))
    assert not any(".indexer." in k for k in hf if k.startswith("model.layers.1."))  # an S layer


def test_a_bad_state_dict_is_named():
    g = dsv32.read_golden(os.path.join(FIXTURES, "default.h5"))
    sd = W.state_dict(g, "vllm")
    del sd["model.layers.2.self_attn.o_proj.weight"]
    with pytest.raises(KeyError, match="model.layers.2.self_attn.o_proj.weight: not in the state"):
        W.golden_weights(sd, g.config, "vllm")
    sd = W.state_dict(g, "vllm")
    k = "model.layers.0.self_attn.indexer.wk_weights_proj.weight"
    sd[k] = sd[k][:-1]
    with pytest.raises(ValueError, match="wk_weights_proj.weight: 131 rows, the config says 132"):
        W.golden_weights(sd, g.config, "vllm")
    with pytest.raises(ValueError, match="naming 'sglang'"):
        W.state_dict(g, "sglang")


def test_hf_names_load_into_transformers():
    hf = pytest.importorskip("transformers.models.deepseek_v32.modeling_deepseek_v32",
                             reason="transformers has no DeepSeek-V3.2 model here")
    hf_config = example_layers.load("hf_deepseek_v32").hf_config
    g = dsv32.read_golden(os.path.join(FIXTURES, "default.h5"))
    cfg, sd = hf_config(g.config), W.state_dict(g, "hf", torch.float32)
    for l in range(g.config["num_layers"]):
        prefix = f"model.layers.{l}."
        attn = hf.DeepseekV32Attention(cfg, l).float()
        mine = {k[len(prefix + "self_attn."):]: v for k, v in sd.items()
                if k.startswith(prefix + "self_attn.")}
        missing, unexpected = attn.load_state_dict(mine, strict=False)
        assert not unexpected, unexpected
        # transformers builds an indexer in every layer; an S layer has none in the golden
        want = [] if g.config["index_topk_pattern"][l] == "F" else \
            sorted(k for k in attn.state_dict() if k.startswith("indexer."))
        assert sorted(missing) == want, (l, missing)
        norm = hf.DeepseekV32RMSNorm(g.config["hidden_size"])
        norm.load_state_dict({"weight": sd[prefix + "input_layernorm.weight"]}, strict=True)
