#!/usr/bin/env python3
"""The DeepSeek-V3.2 attention stack in numpy, written from docs/spec/MATH.md alone (it does
not call the oracle): a worked example of checking an implementation against golden files.

    python3 python/examples/numpy_layer.py fixtures/default.h5 [--defect NAME]

runs the golden's steps, writes every stage as a candidate file and judges it (`dsv32 judge`
through the Python package). It computes in float64 with the model's own quantizers (MATH.md's
`exact` mode), so it is judged against T0 like any implementation. `--defect` puts in one
deliberate bug: `rope-pairs` (MLA RoPE on half-split pairs instead of interleaved ones),
`topk-off-by-one` (the causal range stops one short of the diagonal), `stale-cache` (a token's
latent is not written to the cache in the steps after the first).
"""
import argparse
import os
import sys

import numpy as np

try:
    import dsv32
except ImportError:  # run from a checkout without the package installed: python/ is beside
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import dsv32

DEFECTS = ("rope-pairs", "topk-off-by-one", "stale-cache")


# Number formats (MATH.md section 4).
def bf16(x):
    return dsv32.bf16_values(dsv32.bf16_bits(x)).astype(np.float64)


def e4m3(x):
    """float8_e4m3fn: round to nearest even, saturate to +-448."""
    x = np.asarray(x, dtype=np.float64)
    a = np.minimum(np.abs(x), 448.0)
    _, ex = np.frexp(np.where(a > 0, a, 1.0))
    q = np.exp2(np.maximum(ex - 1, -6) - 3)  # the quantum of a's binade (subnormals below 2^-6)
    r = np.minimum(np.round(a / q) * q, 448.0)  # np.round: half to even
    return np.copysign(r, x)


def ue8m0(amax):
    """The smallest power of two 2^e with max(amax, 1e-4) <= 448 * 2^e (exact compares)."""
    a = max(float(amax), 1e-4)
    if not np.isfinite(a):
        return 2.0 ** 127  # garbage in (a NaN row): any scale, the values are NaN anyway
    e = int(np.ceil(np.log2(a / 448.0)))
    while 448.0 * 2.0 ** e < a:
        e += 1
    while 448.0 * 2.0 ** (e - 1) >= a:
        e -= 1
    return 2.0 ** e


def rmsnorm(x, g, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g


def layernorm(x, g, b, eps):
    mu = np.mean(x, axis=-1, keepdims=True)
    var = np.mean((x - mu) ** 2, axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


# RoPE (MATH.md section 1): the cos/sin table of the model.
def rope_table(cfg, positions):
    dr, theta = cfg["qk_rope_head_dim"], cfg["rope_theta"]
    i = np.arange(dr // 2, dtype=np.float64)
    f = theta ** (-2.0 * i / dr)
    ys = cfg.get("rope_scaling")
    if ys and ys.get("type") == "yarn":
        s, l0 = ys["factor"], ys["original_max_position_embeddings"]

        def corr(n):
            return dr * np.log(l0 / (2 * np.pi * n)) / (2 * np.log(theta))
        lo = max(np.floor(corr(ys["beta_fast"])), 0.0)
        hi = min(np.ceil(corr(ys["beta_slow"])), dr - 1.0)
        if hi == lo:
            hi += 0.001
        ramp = np.clip((i - lo) / (hi - lo), 0.0, 1.0)
        f = f * (1 - ramp) + (f / s) * ramp
    w = f.astype(np.float32)
    angle = np.asarray(positions, dtype=np.float32)[:, None] * w[None, :]  # one fp32 multiply
    cos = np.cos(angle.astype(np.float64)).astype(np.float32).astype(np.float64)
    sin = np.sin(angle.astype(np.float64)).astype(np.float32).astype(np.float64)
    if cfg["rope_table"] == "bf16":
        cos, sin = bf16(cos), bf16(sin)
    return cos, sin


def rope(x, cos, sin, layout):
    """Rotates the last axis of x (2 * len(cos) values) by the position's angles; cos and sin
    broadcast over the axes between the token and the last one."""
    n = x.shape[-1] // 2
    a, b = (x[..., 0::2], x[..., 1::2]) if layout == "interleaved" else (x[..., :n], x[..., n:])
    ra, rb = a * cos - b * sin, a * sin + b * cos
    out = np.empty_like(x)
    if layout == "interleaved":
        out[..., 0::2], out[..., 1::2] = ra, rb
    else:
        out[..., :n], out[..., n:] = ra, rb
    return out


def hadamard(v):
    """v (..., 128) times the normalized Sylvester Hadamard matrix."""
    v = v.copy()
    h = 1
    while h < v.shape[-1]:
        v = v.reshape(*v.shape[:-1], -1, 2, h)
        a, b = v[..., 0, :].copy(), v[..., 1, :].copy()
        v[..., 0, :], v[..., 1, :] = a + b, a - b
        v = v.reshape(*v.shape[:-3], -1)
        h *= 2
    return v / np.sqrt(v.shape[-1])


def quantize(v):
    """fp8 of each 128-vector of v (last axis) with a ue8m0 scale: (values, scales)."""
    flat = v.reshape(-1, v.shape[-1])
    scales = np.array([ue8m0(np.max(np.abs(row))) for row in flat])
    return e4m3(flat / scales[:, None]).reshape(v.shape), scales.reshape(v.shape[:-1])


class Stack:
    """The layers over persistent paged caches (MATH.md sections 2-3), float64 math."""

    def __init__(self, golden, defect=None):
        self.cfg, self.w, self.defect = golden.config, golden.weights, defect
        slots = max(int(np.max(s.inputs["block_table"])) for s in golden.steps) + 1
        slots *= self.cfg["block_size"]
        L, dr, dI = self.cfg["kv_lora_rank"], self.cfg["qk_rope_head_dim"], self.cfg["index_head_dim"]
        n = self.cfg["num_layers"]
        self.latent = [np.full((slots, L), np.nan) for _ in range(n)]
        self.rope_k = [np.full((slots, dr), np.nan) for _ in range(n)]
        self.index_k = [np.full((slots, dI), np.nan) for _ in range(n)]
        self.index_s = [np.full(slots, np.nan) for _ in range(n)]
        self.steps_run = 0

    def store_latent(self, l, slot, c):
        if self.cfg["kv_cache"] != "fp8_ds_mla":
            self.latent[l][slot] = c
            return
        # fp8_ds_mla: tiles of 128, scale = max(fp32(amax) / 448 in fp32, FLT_MIN), codes of
        # c / scale in fp32, read back as value * scale in fp32.
        for t0 in range(0, c.shape[-1], 128):
            tile = c[t0:t0 + 128]
            scale = max(np.float32(np.max(np.abs(tile))) / np.float32(448),
                        np.finfo(np.float32).tiny)
            codes = e4m3((tile.astype(np.float32) / np.float32(scale)).astype(np.float64))
            self.latent[l][slot, t0:t0 + 128] = (codes.astype(np.float32) * np.float32(scale))

    def step(self, inputs):
        cfg = self.cfg
        D, H, Rq, L = cfg["hidden_size"], cfg["num_heads"], cfg["q_lora_rank"], cfg["kv_lora_rank"]
        dn, dr, dv = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
        HI, dI, K, B = cfg["index_n_heads"], cfg["index_head_dim"], cfg["index_topk"], cfg["block_size"]
        eps, ieps = cfg["rms_norm_eps"], cfg["indexer_norm_eps"]
        ys = cfg.get("rope_scaling")
        m = 0.1 * ys["mscale_all_dim"] * np.log(ys["factor"]) + 1 if ys else 1.0
        sigma = (dn + dr) ** -0.5 * m * m
        h = inputs["hidden"].astype(np.float64)
        pos, slots = inputs["positions"].astype(int), inputs["slots"].astype(int)
        req, table = inputs["request_of_token"].astype(int), inputs["block_table"].astype(int)
        T = h.shape[0]
        cos, sin = rope_table(cfg, pos)
        out, topk = {}, None
        for l in range(cfg["num_layers"]):
            w = self.w[l]
            full = cfg["index_topk_pattern"][l] == "F"
            x = rmsnorm(h, w["g_in"], eps)
            a = x @ w["w_qkv_a"].T
            cq, ckv, kpe = a[:, :Rq], a[:, Rq:Rq + L], a[:, Rq + L:]
            q_c = rmsnorm(cq, w["g_q"], eps)
            c = rmsnorm(ckv, w["g_kv"], eps)
            mla_layout = "neox" if self.defect == "rope-pairs" else "interleaved"
            kR = rope(kpe, cos, sin, mla_layout)
            for t in range(T):
                if self.defect == "stale-cache" and self.steps_run > 0 and t == T - 1:
                    continue  # the bug: this token's latent never reaches the cache
                self.store_latent(l, slots[t], c[t])
                self.rope_k[l][slots[t]] = kR[t]
            q = (q_c @ w["w_q_b"].T).reshape(T, H, dn + dr)
            qR = rope(q[..., dn:], cos[:, None], sin[:, None], mla_layout)
            wkv = w["w_kv_b"].reshape(H, dn + dv, L)
            uk, uv = wkv[:, :dn], wkv[:, dn:]
            ql = np.einsum("thn,hnl->thl", q[..., :dn], uk)
            st = {"q_c": q_c, "c": self.latent[l][slots], "kR": kR, "ql": ql, "qR": qR}
            if full:
                qI = (q_c @ w["indexer/w_q_b"].T).reshape(T, HI, dI)
                kI = layernorm(x @ w["indexer/w_k"].T, w["indexer/g_k"], w["indexer/b_k"], ieps)
                wts = x @ w["indexer/w_w"].T
                layout = cfg["indexer_rope"]
                qI[..., :dr] = rope(qI[..., :dr], cos[:, None], sin[:, None], layout)
                kI[..., :dr] = rope(kI[..., :dr], cos, sin, layout)
                if cfg["hadamard"] == "on":
                    qI, kI = hadamard(qI), hadamard(kI)
                q8, qs = quantize(qI)
                k8, ks = quantize(kI)
                omega = wts * qs * dI ** -0.5 * HI ** -0.5
                for t in range(T):
                    self.index_k[l][slots[t]], self.index_s[l][slots[t]] = k8[t], ks[t]
                topk = np.full((T, K), -1, dtype=np.int64)
                for t in range(T):
                    p = pos[t] + (0 if self.defect == "topk-off-by-one" else 1)  # keys 0..p(t)
                    if p <= K:
                        topk[t, :p] = np.arange(p)
                        continue
                    ks_ = slots_of(table[req[t]], np.arange(p), B)
                    dots = self.index_k[l][ks_] @ q8[t].T  # (keys, HI)
                    score = self.index_s[l][ks_] * (np.maximum(dots, 0) @ omega[t])
                    order = np.lexsort((np.arange(p), -score))[:K]  # best first; ties: smaller j
                    topk[t] = np.sort(order)
                st.update({"qI8": q8, "qI_scale": qs, "kI8": k8, "kI_scale": ks, "omega": omega})
            olat = np.zeros((T, H, L))
            lse = np.full((T, H), -np.inf)
            for t in range(T):
                sel = topk[t][topk[t] >= 0]
                if sel.size == 0:
                    continue
                ks_ = slots_of(table[req[t]], sel, B)
                keys = np.concatenate([self.latent[l][ks_], self.rope_k[l][ks_]], axis=1)
                z = sigma * (np.concatenate([ql[t], qR[t]], axis=1) @ keys.T)  # (H, selected)
                zmax = np.max(z, axis=1, keepdims=True)
                e = np.exp(z - zmax)
                olat[t] = (e / e.sum(axis=1, keepdims=True)) @ self.latent[l][ks_]
                lse[t] = zmax[:, 0] + np.log(e.sum(axis=1))
            o = np.einsum("hvl,thl->thv", uv, olat).reshape(T, H * dv)
            y = o @ w["w_o"].T
            h = h + y
            st.update({"topk": topk, "olat": olat, "lse": lse, "o": o, "y": y})
            out.update({f"layer{l}/{k}": v for k, v in st.items()})
        out["output"] = h
        self.steps_run += 1
        return out


def slots_of(table_row, positions, B):
    positions = np.asarray(positions)
    return table_row[positions // B] * B + positions % B


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("golden")
    ap.add_argument("--defect", choices=DEFECTS)
    ap.add_argument("--out", default="numpy-candidate.h5")
    args = ap.parse_args()
    golden = dsv32.read_golden(args.golden)
    stack = Stack(golden, args.defect)
    dsv32.write_candidate(args.out, [stack.step(s.inputs) for s in golden.steps])
    verdict = dsv32.judge(args.out, args.golden)
    print(verdict.text)
    sys.exit(0 if verdict.passed else 1)


if __name__ == "__main__":
    main()
