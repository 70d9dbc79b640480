"""A golden's weights under the names serving code loads them by (docs/TORCH.md, "Weight names"):
Hugging Face's (transformers' DeepseekV32 modules, DeepSeek's released checkpoints) and vLLM's
(its DeepseekV2MLAAttention, which fuses two pairs of projections). All names sit under
`model.layers.{l}.`; the golden's names are GOLDEN.md's.

| golden (layer l) | Hugging Face | vLLM |
|---|---|---|
| `g_in` | `input_layernorm.weight` | `input_layernorm.weight` |
| `w_qkv_a` rows [0, Rq) | `self_attn.q_a_proj.weight` | `self_attn.fused_qkv_a_proj.weight` (all rows) |
| `w_qkv_a` rows [Rq, Rq+Lkv+dr) | `self_attn.kv_a_proj_with_mqa.weight` | (fused above) |
| `g_q` | `self_attn.q_a_layernorm.weight` | same |
| `g_kv` | `self_attn.kv_a_layernorm.weight` | same |
| `w_q_b` | `self_attn.q_b_proj.weight` | same |
| `w_kv_b` | `self_attn.kv_b_proj.weight` | same |
| `w_o` | `self_attn.o_proj.weight` | same |
| `indexer/w_q_b` | `self_attn.indexer.wq_b.weight` | same |
| `indexer/w_k` | `self_attn.indexer.wk.weight` | `self_attn.indexer.wk_weights_proj.weight` rows [0, dI) |
| `indexer/w_w` | `self_attn.indexer.weights_proj.weight` | (fused above, rows [dI, dI+HI)) |
| `indexer/g_k`, `indexer/b_k` | `self_attn.indexer.k_norm.weight`, `.bias` | same |
"""
import numpy as np
import torch

NAMINGS = ("hf", "vllm")

# golden name -> the name both use, where they agree
_SHARED = {"g_in": "input_layernorm.weight", "g_q": "self_attn.q_a_layernorm.weight",
           "g_kv": "self_attn.kv_a_layernorm.weight", "w_q_b": "self_attn.q_b_proj.weight",
           "w_kv_b": "self_attn.kv_b_proj.weight", "w_o": "self_attn.o_proj.weight",
           "indexer/w_q_b": "self_attn.indexer.wq_b.weight",
           "indexer/g_k": "self_attn.indexer.k_norm.weight",
           "indexer/b_k": "self_attn.indexer.k_norm.bias"}


def layer_names(config, layer, naming):
    """{serving name: [(golden name, first row, row count or None for all)]} of one layer: a
    serving tensor is the golden tensors' rows, stacked in that order; a golden tensor split
    over several serving tensors comes in row order."""
    if naming not in NAMINGS:
        raise ValueError(f"naming {naming!r}: one of {', '.join(NAMINGS)}")
    Rq = config["q_lora_rank"]
    rest = config["kv_lora_rank"] + config["qk_rope_head_dim"]
    full = config["index_topk_pattern"][layer] == "F"
    out = {v: [(k, 0, None)] for k, v in _SHARED.items() if full or not k.startswith("indexer/")}
    if naming == "hf":
        out["self_attn.q_a_proj.weight"] = [("w_qkv_a", 0, Rq)]
        out["self_attn.kv_a_proj_with_mqa.weight"] = [("w_qkv_a", Rq, rest)]
        if full:
            out["self_attn.indexer.wk.weight"] = [("indexer/w_k", 0, None)]
            out["self_attn.indexer.weights_proj.weight"] = [("indexer/w_w", 0, None)]
    else:
        out["self_attn.fused_qkv_a_proj.weight"] = [("w_qkv_a", 0, None)]
        if full:
            out["self_attn.indexer.wk_weights_proj.weight"] = [
                ("indexer/w_k", 0, config["index_head_dim"]),
                ("indexer/w_w", 0, config["index_n_heads"])]
    return out


def state_dict(golden, naming="hf", dtype=torch.bfloat16, device="cpu"):
    """Every layer's weights as {"model.layers.{l}.<name>": tensor} (bf16 by default: the
    golden's weights are bf16 values, so nothing rounds)."""
    sd = {}
    for l, w in enumerate(golden.weights):
        for name, parts in layer_names(golden.config, l, naming).items():
            rows = [np.asarray(w[g])[r0:None if n is None else r0 + n] for g, r0, n in parts]
            sd[f"model.layers.{l}.{name}"] = torch.tensor(np.concatenate(rows), dtype=dtype,
                                                          device=device)
    return sd


def golden_weights(sd, config, naming="hf"):
    """The inverse: per layer {golden name: float64 numpy array} from a state dict of
    `naming`'s names (extra keys are ignored; a missing one is a KeyError naming it)."""
    layers = []
    for l in range(config["num_layers"]):
        parts_of = {}
        for name, parts in layer_names(config, l, naming).items():
            key = f"model.layers.{l}.{name}"
            if key not in sd:
                raise KeyError(f"{key}: not in the state dict ({naming} names)")
            t = sd[key].detach().to("cpu", torch.float64).numpy()
            r = 0
            for g, _, n in parts:
                n = t.shape[0] - r if n is None else n
                parts_of.setdefault(g, []).append(t[r:r + n])
                r += n
            if r != t.shape[0]:
                raise ValueError(f"{key}: {t.shape[0]} rows, the config says {r}")
        layers.append({g: np.concatenate(v) for g, v in parts_of.items()})
    return layers
