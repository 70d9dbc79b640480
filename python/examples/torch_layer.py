#!/usr/bin/env python3
"""The DeepSeek-V3.2 attention stack in plain PyTorch, written from docs/spec/MATH.md alone and
shaped as a serving engine runs it: it reads `dsv32.torch.Batch` (padded rows, slot mapping,
block tables, paged caches in the golden's layout), has no host reads, so it can be captured,
and marks BOUNDARIES.md's ops so that a plan can run them eagerly between graph segments.

    python3 python/examples/torch_layer.py fixtures/default.h5 --mode narrow --device cuda
        [--bug baked-scalar|fresh-output|padded-cache-write]

It computes in float64 (the golden's bf16 weights exactly) and stores into the caches in their
storage formats. `--bug` plants one classic boundary bug, each harmless when the layer runs
eagerly (unpadded) and wrong under capture:
- `baked-scalar`: the residual add covers rows [0, batch.num_tokens), a host value that a graph
  keeps from capture (one token) at every replay;
- `fresh-output`: the eager `uv_proj` returns a tensor of its own instead of writing the buffer
  the graphs hold (the graph segment after it reads the capture-time one);
- `padded-cache-write`: a padded row's slot -1 is clamped to slot 0 (a real token's) instead of
  the scratch slot.
Exit 0: the judge passed; 1: it failed (the first failing stage is printed); 77: no torch.
"""
import argparse
import math
import os
import sys

try:
    import torch
except ImportError as e:
    print(f"skipped: torch is not importable here ({e})")
    sys.exit(77)

try:
    import dsv32
except ImportError:  # run from a checkout without the package installed: python/ is beside
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import dsv32
import dsv32.torch as dt  # noqa: E402
from dsv32.torch import fp8  # noqa: E402

BUGS = ("baked-scalar", "fresh-output", "padded-cache-write")
F64 = torch.float64


def rmsnorm(x, g, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * g


def layernorm(x, g, b, eps):
    mu = x.mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + eps) * g + b


def rope(x, cos, sin, layout):
    """x's last axis rotated by the angles (cos, sin broadcast over the axes before it)."""
    n = x.shape[-1] // 2
    if layout == "interleaved":
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack([a * cos - b * sin, a * sin + b * cos], -1).flatten(-2)
    a, b = x[..., :n], x[..., n:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], -1)


def hadamard(v):
    n = v.shape[-1]
    h = torch.ones(1, 1, dtype=v.dtype, device=v.device)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)])
    return v @ h / n ** 0.5


def quantize(v):
    """fp8 values of each 128-vector of v with a ue8m0 scale: (values, scales)."""
    s = fp8.ue8m0(v.abs().amax(-1))
    return fp8.e4m3(v / s[..., None]), s


def into(out, value):
    out.copy_(value)
    return out


class Stack(torch.nn.Module):
    """The golden's layers over the batch's paged caches (MATH.md sections 2-3)."""

    def __init__(self, golden, device="cpu", bug=None):
        super().__init__()
        c = self.config = dict(golden.config)
        self.bug, dev = bug, torch.device(device)
        self.w = [{k: torch.tensor(v, dtype=F64, device=dev) for k, v in w.items()}
                  for w in golden.weights]
        dr, theta = c["qk_rope_head_dim"], c["rope_theta"]
        i = torch.arange(dr // 2, dtype=F64)
        f = theta ** (-2.0 * i / dr)
        y = c.get("rope_scaling")
        self.m = 1.0
        if y:  # YaRN (MATH.md section 1)
            def corr(n):
                L0 = y["original_max_position_embeddings"]
                return dr * math.log(L0 / (2 * math.pi * n)) / (2 * math.log(theta))
            lo = max(math.floor(corr(y["beta_fast"])), 0.0)
            hi = min(math.ceil(corr(y["beta_slow"])), dr - 1.0)
            hi += 0.001 if hi == lo else 0.0
            ramp = ((i - lo) / (hi - lo)).clamp(0, 1)
            f = f * (1 - ramp) + f / y["factor"] * ramp
            self.m = 0.1 * y["mscale_all_dim"] * math.log(y["factor"]) + 1
        self.freq = f.float().to(dev)  # the model's fp32 frequencies
        self.sigma = (c["qk_nope_head_dim"] + dr) ** -0.5 * self.m * self.m

    def rope_table(self, positions):
        angle = positions.float()[:, None] * self.freq[None]  # one fp32 multiply
        cos, sin = torch.cos(angle.double()).float(), torch.sin(angle.double()).float()
        if self.config["rope_table"] == "bf16":
            cos, sin = cos.bfloat16(), sin.bfloat16()
        return cos.double(), sin.double()

    def forward(self, batch):
        h = batch.hidden_states.to(F64)
        cos, sin = self.rope_table(batch.positions)
        topk = None
        for l in range(self.config["num_layers"]):
            h, topk = self.layer(l, h, batch, cos, sin, topk)
        dt.record("output", h)
        return h

    def slots(self, batch):
        s = batch.slot_mapping
        fill = 0 if self.bug == "padded-cache-write" else batch.scratch_slot
        return torch.where(s < 0, torch.full_like(s, fill), s)

    def layer(self, l, h, batch, cos, sin, topk):
        c, w, T = self.config, self.w[l], h.shape[0]
        H, L, dn, dr, dv = (c["num_heads"], c["kv_lora_rank"], c["qk_nope_head_dim"],
                            c["qk_rope_head_dim"], c["v_head_dim"])
        full = c["index_topk_pattern"][l] == "F"
        x = rmsnorm(h, w["g_in"], c["rms_norm_eps"])  # input_norm
        a = x @ w["w_qkv_a"].T  # qkv_a_proj
        kw = (x @ w["indexer/w_k"].T, x @ w["indexer/w_w"].T) if full else None  # indexer_wk_proj
        q_c = self.norm_rope_cache(l, batch, a, kw, cos, sin, torch.empty(T, c["q_lora_rank"],
                                                                             dtype=F64, device=h.device))
        q = self.q_b_proj(l, q_c, torch.empty(T, H, dn + dr, dtype=F64, device=h.device))
        ql = self.uk_absorb(l, q, torch.empty(T, H, L, dtype=F64, device=h.device))
        if full:
            qI = self.indexer_wq_b(l, q_c, torch.empty(T, c["index_n_heads"], c["index_head_dim"],
                                                       dtype=F64, device=h.device))
        qR = torch.empty(T, H, dr, dtype=F64, device=h.device)
        qI8 = omega = None
        if full:
            qI8 = torch.empty_like(qI)
            omega = torch.empty(T, c["index_n_heads"], dtype=F64, device=h.device)
        self.fused_q(l, q, qI if full else None, kw, cos, sin, qR, qI8, omega)
        if full:
            topk = self.indexer_topk(l, batch, qI8, omega,
                                     torch.empty(T, c["index_topk"], dtype=torch.int64, device=h.device))
        else:  # S layers read the nearest F layer's rows of this forward
            dt.record(f"layer{l}/topk", topk)
        olat = torch.empty(T, H, L, dtype=F64, device=h.device)
        lse = torch.empty(T, H, dtype=F64, device=h.device)
        self.sparse_mqa(l, batch, ql, qR, topk, olat, lse)
        o = self.uv_proj(l, olat, torch.empty(T, H * dv, dtype=F64, device=h.device))
        y = o @ w["w_o"].T  # o_proj
        dt.record(f"layer{l}/y", y)
        if self.bug == "baked-scalar":  # residual_add over the real rows, counted on the host
            n, out = batch.num_tokens, torch.zeros_like(h)
            out[:n] = h[:n] + y[:n]
            return out, topk
        return h + y, topk

    @dt.op("norm_rope_cache")
    def norm_rope_cache(self, l, batch, a, kw, cos, sin, q_c):
        c, w, cache = self.config, self.w[l], batch.caches[l]
        Rq, L, eps = c["q_lora_rank"], c["kv_lora_rank"], c["rms_norm_eps"]
        into(q_c, rmsnorm(a[:, :Rq], w["g_q"], eps))
        ckv = rmsnorm(a[:, Rq:Rq + L], w["g_kv"], eps)
        kR = rope(a[:, Rq + L:], cos, sin, "interleaved")
        slot = self.slots(batch)
        kv = cache.kv.view(-1, cache.kv.shape[-1])
        if c["kv_cache"] == "fp8_ds_mla":
            kv[slot] = fp8.ds_mla_pack(ckv, kR)
            c_read, _ = fp8.ds_mla_unpack(kv[slot], L, kR.shape[-1], F64)
        else:
            kv[slot] = torch.cat([ckv, kR], -1).to(kv.dtype)
            c_read = kv[slot][:, :L].to(F64)  # the token reads itself back from the cache
        for name, t in (("q_c", q_c), ("c", c_read), ("kR", kR)):
            dt.record(f"layer{l}/{name}", t)
        if kw is not None:
            kI = layernorm(kw[0], w["indexer/g_k"], w["indexer/b_k"], c["indexer_norm_eps"])
            dr = c["qk_rope_head_dim"]
            kI = torch.cat([rope(kI[:, :dr], cos, sin, c["indexer_rope"]), kI[:, dr:]], -1)
            if c["hadamard"] == "on":
                kI = hadamard(kI)
            k8, ks = quantize(kI)
            cache.index_k.view(-1, kI.shape[-1])[slot] = fp8.e4m3_encode(k8)
            cache.index_k_scale.view(-1)[slot] = ks.float()
            dt.record(f"layer{l}/kI8", k8)
            dt.record(f"layer{l}/kI_scale", ks)
        return q_c

    def w_kv_b(self, l):
        """W_kv_b viewed (H, dn + dv, Lkv): per head W_UK's dn rows, then W_UV's dv (MATH.md 4)."""
        c = self.config
        return self.w[l]["w_kv_b"].view(c["num_heads"], c["qk_nope_head_dim"] + c["v_head_dim"], -1)

    @dt.op("q_b_proj")
    def q_b_proj(self, l, q_c, out):
        return into(out, (q_c @ self.w[l]["w_q_b"].T).view(out.shape))

    @dt.op("uk_absorb")
    def uk_absorb(self, l, q, out):
        dn = self.config["qk_nope_head_dim"]
        into(out, torch.einsum("thn,hnl->thl", q[..., :dn], self.w_kv_b(l)[:, :dn]))
        dt.record(f"layer{l}/ql", out)
        return out

    @dt.op("indexer_wq_b")
    def indexer_wq_b(self, l, q_c, out):
        return into(out, (q_c @ self.w[l]["indexer/w_q_b"].T).view(out.shape))

    @dt.op("fused_q")
    def fused_q(self, l, q, qI, kw, cos, sin, qR, qI8, omega):
        c = self.config
        dn, dr = c["qk_nope_head_dim"], c["qk_rope_head_dim"]
        into(qR, rope(q[..., dn:], cos[:, None], sin[:, None], "interleaved"))
        dt.record(f"layer{l}/qR", qR)
        if qI is None:
            return
        v = torch.cat([rope(qI[..., :dr], cos[:, None], sin[:, None], c["indexer_rope"]),
                       qI[..., dr:]], -1)
        if c["hadamard"] == "on":
            v = hadamard(v)
        q8, qs = quantize(v)
        into(qI8, q8)
        HI, dI = c["index_n_heads"], c["index_head_dim"]
        into(omega, kw[1] * qs * dI ** -0.5 * HI ** -0.5)
        for name, t in (("qI8", qI8), ("qI_scale", qs), ("omega", omega)):
            dt.record(f"layer{l}/{name}", t)

    def key_slots(self, batch, req, j):
        """Slots of request-local positions j (T, n) of each row's request; -1 past its blocks."""
        B = batch.block_size
        blocks = batch.block_table.long()[req[:, None], (j // B).clamp(max=batch.block_table.shape[1] - 1)]
        return torch.where(blocks >= 0, blocks * B + j % B, torch.full_like(blocks, -1))

    @dt.op("indexer_topk")
    def indexer_topk(self, l, batch, qI8, omega, out):
        c, cache = self.config, batch.caches[l]
        K, S, dev = c["index_topk"], batch.max_seq_len, qI8.device
        pos, req = batch.positions, batch.token_to_req
        j = torch.arange(S, device=dev)[None].expand(pos.shape[0], S)
        slot = self.key_slots(batch, req, j)
        valid = (j <= pos[:, None]) & (slot >= 0)
        safe = torch.where(valid, slot, torch.zeros_like(slot))
        k8 = fp8.e4m3_decode(cache.index_k.view(-1, qI8.shape[-1])[safe])  # (T, S, dI)
        ks = cache.index_k_scale.view(-1)[safe].double()
        dots = torch.einsum("tsd,thd->tsh", k8, qI8).clamp(min=0)
        score = ks * (dots @ omega[:, :, None]).squeeze(-1)
        score = torch.where(valid, score, torch.full_like(score, -float("inf")))
        order = torch.sort(score, dim=1, descending=True, stable=True).indices  # ties: smaller j
        n = min(K, S)
        pick = order[:, :n]
        keep = torch.arange(n, device=dev)[None] < torch.clamp(pos[:, None] + 1, max=K)
        pick = torch.sort(torch.where(keep, pick, torch.full_like(pick, S)), dim=1).values
        sel = torch.full_like(out, -1)
        sel[:, :n] = torch.where(pick < S, pick, torch.full_like(pick, -1))
        into(out, sel)
        dt.record(f"layer{l}/topk", out)
        return out

    @dt.op("sparse_mqa")
    def sparse_mqa(self, l, batch, ql, qR, topk, olat, lse):
        c, cache = self.config, batch.caches[l]
        L, dr = c["kv_lora_rank"], c["qk_rope_head_dim"]
        slot = self.key_slots(batch, batch.token_to_req, topk.clamp(min=0))
        valid = (topk >= 0) & (slot >= 0)
        rows = cache.kv.view(-1, cache.kv.shape[-1])[torch.where(valid, slot, torch.zeros_like(slot))]
        if c["kv_cache"] == "fp8_ds_mla":
            ck, kR = fp8.ds_mla_unpack(rows, L, dr, F64)
        else:
            ck, kR = rows[..., :L].to(F64), rows[..., L:].to(F64)
        z = self.sigma * (torch.einsum("thl,tkl->thk", ql, ck) + torch.einsum("thr,tkr->thk", qR, kR))
        z = torch.where(valid[:, None], z, torch.full_like(z, -float("inf")))
        zmax = z.amax(-1, keepdim=True)
        any_ = torch.isfinite(zmax)
        e = torch.exp(z - torch.where(any_, zmax, torch.zeros_like(zmax)))
        ssum = e.sum(-1, keepdim=True)
        a = torch.where(any_, e / torch.where(any_, ssum, torch.ones_like(ssum)), torch.zeros_like(e))
        into(olat, torch.einsum("thk,tkl->thl", a, torch.where(valid[..., None], ck, torch.zeros_like(ck))))
        into(lse, torch.where(any_, zmax + torch.log(ssum), zmax).squeeze(-1))
        dt.record(f"layer{l}/olat", olat)
        dt.record(f"layer{l}/lse", lse)

    @dt.op("uv_proj")
    def uv_proj(self, l, olat, out):
        o = torch.einsum("hvl,thl->thv", self.w_kv_b(l)[:, self.config["qk_nope_head_dim"]:],
                         olat).reshape(out.shape)
        if self.bug == "fresh-output":
            out = o.clone()  # the bug: a buffer of its own, not the one the graphs hold
        else:
            into(out, o)
        dt.record(f"layer{l}/o", out)
        return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("golden")
    ap.add_argument("--mode", default="eager", choices=dt.MODES)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--bug", choices=BUGS)
    ap.add_argument("--out", help="the candidate file (default: a temporary file)")
    a = ap.parse_args()
    golden = dsv32.read_golden(a.golden)
    verdict = dt.check(Stack(golden, a.device, a.bug), golden, a.mode, a.device, out=a.out)
    print(verdict.text, end="")
    if not verdict.passed:
        print(dt.failure_text(verdict))
    return 0 if verdict.passed else 1


if __name__ == "__main__":
    sys.exit(main())
