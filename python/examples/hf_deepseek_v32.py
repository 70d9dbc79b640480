#!/usr/bin/env python3
"""Hugging Face transformers' DeepSeek-V3.2 attention (`DeepseekV32Attention`), run on a golden's
steps and judged, as a user of transformers would check it.

    python3 python/examples/hf_deepseek_v32.py GOLDEN.h5 [--device cuda] [--own-sets]

The golden's weights are loaded into one `DeepseekV32Attention` per layer (float64), each layer
wrapped as MATH.md's stack is (h <- h + Attn(RMSNorm_in(h))). transformers keeps no paged cache
of latents: each request's earlier tokens are recomputed from their layer inputs, which is what
its own cache of expanded keys and values holds. Its indexer scores in bf16/fp32 with no
Hadamard rotation and no fp8 (its docstring says so), so by default the golden's own top-k sets
are imposed on it (`--own-sets` keeps its indexer's); and it has no fp8 latent cache, so under a
golden with `kv_cache = fp8_ds_mla` its latent `c` is not what that cache reads back, and the
judge fails it at `c` (docs/CANDIDATE.md). Its interleaved RoPE writes the rotated pairs in
half-split order, so `kR` and `qR` are not provided (dot products, and so attention, are the
same). Stages written: `c`, `o`, `y`, `topk` and `output`.

Exit 0: the judge passed; 1: it failed (the first failing stage is printed); 77: transformers
has no DeepSeek-V3.2 model here (the reason is printed)."""
import argparse
import os
import sys

import numpy as np

try:
    import dsv32
except ImportError:  # run from a checkout without the package installed: python/ is beside
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import dsv32

import importlib.util  # noqa: E402

if importlib.util.find_spec("transformers") is None:  # said before torch's import (seconds)
    print("skipped: transformers' DeepSeek-V3.2 model is not importable here (no transformers)")
    sys.exit(77)
try:
    import torch
    from transformers.models.deepseek_v32 import modeling_deepseek_v32 as hf
    from transformers.models.deepseek_v32.configuration_deepseek_v32 import DeepseekV32Config
except ImportError as e:
    print(f"skipped: transformers' DeepSeek-V3.2 model is not importable here ({e})")
    sys.exit(77)


def hf_config(c):
    """A DeepseekV32Config of the golden's config (GOLDEN.md's keys)."""
    rope = {"rope_type": "default", "rope_theta": c["rope_theta"]}
    y = c.get("rope_scaling")
    if y:
        rope = {"rope_type": "yarn", "rope_theta": c["rope_theta"], "factor": y["factor"],
                "original_max_position_embeddings": y["original_max_position_embeddings"],
                "beta_fast": y["beta_fast"], "beta_slow": y["beta_slow"], "mscale": y["mscale"],
                "mscale_all_dim": y["mscale_all_dim"]}
    cfg = DeepseekV32Config(
        hidden_size=c["hidden_size"], num_hidden_layers=c["num_layers"],
        num_attention_heads=c["num_heads"], num_key_value_heads=c["num_heads"],
        q_lora_rank=c["q_lora_rank"], kv_lora_rank=c["kv_lora_rank"],
        qk_nope_head_dim=c["qk_nope_head_dim"], qk_rope_head_dim=c["qk_rope_head_dim"],
        v_head_dim=c["v_head_dim"], index_n_heads=c["index_n_heads"],
        index_head_dim=c["index_head_dim"], index_topk=c["index_topk"],
        rms_norm_eps=c["rms_norm_eps"], rope_parameters=rope, attention_bias=False,
        attention_dropout=0.0, max_position_embeddings=1 << 20)
    cfg.head_dim = c["qk_rope_head_dim"]  # the rotary embedding's width
    cfg._attn_implementation = "eager"
    return cfg


class Layer:
    """One layer: RMSNorm_in and transformers' attention, with the golden's weights."""

    def __init__(self, cfg, c, w, layer, device):
        Rq, L = c["q_lora_rank"], c["kv_lora_rank"]
        t = {k: torch.tensor(v, dtype=torch.float64, device=device) for k, v in w.items()}
        self.norm_in = hf.DeepseekV32RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.attn = hf.DeepseekV32Attention(cfg, layer)
        a = self.attn
        with torch.no_grad():
            self.norm_in.weight.copy_(t["g_in"])
            a.q_a_proj.weight.copy_(t["w_qkv_a"][:Rq])
            a.kv_a_proj_with_mqa.weight.copy_(t["w_qkv_a"][Rq:])
            a.q_a_layernorm.weight.copy_(t["g_q"])
            a.kv_a_layernorm.weight.copy_(t["g_kv"])
            a.q_b_proj.weight.copy_(t["w_q_b"])
            a.kv_b_proj.weight.copy_(t["w_kv_b"])
            a.o_proj.weight.copy_(t["w_o"])
            if "indexer/w_q_b" in t:
                a.indexer.wq_b.weight.copy_(t["indexer/w_q_b"])
                a.indexer.wk.weight.copy_(t["indexer/w_k"])
                a.indexer.weights_proj.weight.copy_(t["indexer/w_w"])
                a.indexer.k_norm.weight.copy_(t["indexer/g_k"])
                a.indexer.k_norm.bias.copy_(t["indexer/b_k"])
        a.q_a_layernorm.variance_epsilon = a.kv_a_layernorm.variance_epsilon = c["rms_norm_eps"]
        a.indexer.k_norm.eps = c["indexer_norm_eps"]
        for m in (self.norm_in, a):
            m.to(device=device, dtype=torch.float64).eval()
        self.seen = {}  # hook outputs of the last call
        a.kv_a_layernorm.register_forward_hook(lambda m, i, o: self.seen.__setitem__("c", o))
        a.o_proj.register_forward_hook(
            lambda m, i, o: self.seen.update(o=i[0], y=o))


def run(golden, device, own_sets):
    c = golden.config
    cfg = hf_config(c)
    K = c["index_topk"]
    layers = [Layer(cfg, c, golden.weights[l], l, device) for l in range(c["num_layers"])]
    rotary = hf.DeepseekV32RotaryEmbedding(cfg).to(device)
    past = {}  # (layer, request id) -> the layer inputs of the request's tokens so far
    steps = []
    for s, step in enumerate(golden.steps):
        inp = step.inputs
        rows_of = step.rows_by_request()
        h = torch.tensor(inp["hidden"], dtype=torch.float64, device=device)
        Ta = h.shape[0]
        out = {}
        for l, layer in enumerate(layers):
            x = layer.norm_in(h)
            got = {k: torch.zeros(Ta, n, dtype=torch.float64, device=device) for k, n in
                   (("c", c["kv_lora_rank"]), ("o", c["num_heads"] * c["v_head_dim"]),
                    ("y", c["hidden_size"]))}
            topk = np.full((Ta, K), -1, dtype=np.int64)
            for rid, rows in rows_of.items():
                X = torch.cat([past.get((l, rid), x[:0]), x[rows]])
                S, q = X.shape[0], len(rows)
                positions = [int(inp["positions"][t]) for t in rows]
                if positions != list(range(S - q, S)):
                    raise ValueError(f"step {s} request {rid}: positions {positions} are not the "
                                     f"request's next {q} of {S}")
                pos = torch.arange(S, device=device)[None]
                cos, sin = rotary(X[None], pos)
                mask = torch.full((1, 1, S, S), torch.finfo(torch.float64).min,
                                  dtype=torch.float64, device=device).triu(1)
                sets = None
                if not own_sets:  # the golden's sets, -1 made a repeat of the row's first pick
                    g = step.expected[f"layer{l}/topk"][rows].astype(np.int64)
                    g = np.where(g < 0, g[:, :1], g)
                    full = np.zeros((S, K), dtype=np.int64)
                    full[S - q:] = g
                    sets = torch.tensor(full[None], dtype=torch.int32, device=device)
                    layer.attn.indexer.forward = lambda *a, _s=sets, **k: _s
                with torch.no_grad():
                    layer.attn(X[None], (cos, sin), mask, position_ids=pos)
                for k in got:
                    got[k][rows] = layer.seen[k][0, S - q:].reshape(q, -1)
                if not own_sets:
                    topk[rows] = step.expected[f"layer{l}/topk"][rows]
                past[(l, rid)] = X
            h = h + got["y"]
            out.update({f"layer{l}/{k}": v.cpu().numpy() for k, v in got.items()})
            if not own_sets:
                out[f"layer{l}/topk"] = topk
        out["output"] = h.cpu().numpy()
        steps.append(out)
    return steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("golden")
    ap.add_argument("--out", help="the candidate file (default: beside the golden's name)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--own-sets", action="store_true",
                    help="keep transformers' own indexer's sets instead of the golden's")
    a = ap.parse_args()
    golden = dsv32.read_golden(a.golden)
    out = a.out or os.path.splitext(os.path.basename(a.golden))[0] + ".hf-candidate.h5"
    dsv32.write_candidate(out, run(golden, a.device, a.own_sets))
    verdict = dsv32.judge(out, a.golden)
    print(verdict.text, end="")
    return 0 if verdict.passed else 1


if __name__ == "__main__":
    sys.exit(main())
