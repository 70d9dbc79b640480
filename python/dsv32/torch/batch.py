"""A golden's steps as a serving engine hands them to an attention layer (docs/TORCH.md).

`Batch` holds one step's tensors on the chosen device, padded to the capture size T:
- `hidden_states` (T, D): the residual stream entering layer 0 (padded rows 0);
- `positions` (T) int64 (padded rows 0); `slot_mapping` (T) int64 (padded rows -1);
- `query_start_loc` (R+1) int32, `seq_lens` (R) int32, `block_table` (R, NB) int32 (-1 past a
  request's blocks), `token_to_req` (T) int64 (padded rows name a padded request of length 0);
  R is fixed (`max_reqs`) so that a captured graph's shapes do not change: requests past
  `num_reqs` are padding;
- host metadata, read again by eager ops at every replay and baked into a graph at capture:
  `num_tokens` (T_a), `num_reqs`, `num_padded` (T), and the bounds `max_seq_len` (the golden's
  longest sequence, a whole number of blocks) and `block_size`, constant over the run;
- `caches`: one `LayerCache` a layer, persistent across steps (the same tensors every step).

The caches, in the golden's layout (`kv_cache`): per layer
- `kv` (num_blocks + 1, B, Lkv + dr) in the storage dtype (bf16, or fp32 for `precision = fp32`),
  or uint8 (num_blocks + 1, B, Lkv + 4 ceil(Lkv/128) + 2 dr) for `fp8_ds_mla` (dsv32.torch.fp8);
- `index_k` (num_blocks + 1, B, dI) uint8 e4m3 codes and `index_k_scale` (num_blocks + 1, B)
  fp32 for F layers.
The last block is scratch (`scratch_slot` is its first slot): a padded row's slot is -1, and a
capture-safe layer writes it there rather than branching on the host. Real block tables never
name it. Slots no request references hold NaN (bf16/fp32) or 0xFF codes, so reading one shows.

A golden's given prefixes (GOLDEN.md, "Given prefix"; `golden.prefix`) are the harness's to
store: `Inputs.store_given(s)`, called before step s runs (check() does, in every mode), writes
the prefix of each request that first appears at step s into every layer's caches at the slots
its block table names, in the layout above, as if the layer had written them.
"""
from dataclasses import dataclass, field

import numpy as np
import torch

from . import fp8


@dataclass
class LayerCache:
    kv: torch.Tensor
    index_k: torch.Tensor = None
    index_k_scale: torch.Tensor = None


@dataclass
class Batch:
    config: dict
    hidden_states: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    token_to_req: torch.Tensor
    caches: list
    num_tokens: int
    num_reqs: int
    max_seq_len: int
    block_size: int
    scratch_slot: int
    step: int = -1
    meta: dict = field(default_factory=dict)

    @property
    def num_padded(self):
        return int(self.hidden_states.shape[0])

    @property
    def max_reqs(self):
        return int(self.seq_lens.shape[0])

    def copy_from(self, other):
        """Writes `other`'s tensors and host metadata into this batch's static tensors (a
        replay's input update); the caches are shared, not copied."""
        for name in ("hidden_states", "positions", "slot_mapping", "query_start_loc", "seq_lens",
                     "block_table", "token_to_req"):
            getattr(self, name).copy_(getattr(other, name))
        self.num_tokens, self.num_reqs, self.step = other.num_tokens, other.num_reqs, other.step


def storage_dtype(config):
    return torch.float32 if config["precision"] == "fp32" else torch.bfloat16


class Inputs:
    """Builds `Batch`es of a golden's steps on `device`, with `dtype` hidden states (default
    float64: the golden's values exactly), over caches made once for the whole run."""

    def __init__(self, golden, device="cpu", dtype=torch.float64):
        self.golden, self.device, self.dtype = golden, torch.device(device), dtype
        c = golden.config
        self.B = c["block_size"]
        tables = [s.inputs["block_table"] for s in golden.steps]
        self.num_blocks = max(int(np.max(t)) for t in tables) + 1 if tables else 1
        self.NB = max(t.shape[1] for t in tables)
        longest = max(int(np.max(s.inputs["ctx_len"] + s.inputs["q_len"])) for s in golden.steps)
        self.max_seq_len = -(-longest // self.B) * self.B
        self.caches = [self._layer_cache(c, l) for l in range(c["num_layers"])]
        self.given = {}  # step -> the given prefixes of the requests that first appear there
        for p in getattr(golden, "prefix", {}).values():
            self.given.setdefault(p.first_step, []).append(p)

    def store_given(self, s):
        """Stores the given prefixes of the requests that first appear at step s into every
        layer's caches (at `Prefix.slots`), in the caches' layout: [latent ; k_rope] in the
        storage dtype, or fp8_ds_mla rows of the file's codes, tile scales and bf16 rope; F
        layers' index codes and scales. Returns the request ids stored. Writes on the current
        stream, which a replay waits for."""
        c, done = self.golden.config, []
        for p in self.given.get(s, ()):
            if p.slots.size and (p.slots.min() < 0 or p.slots.max() >= self.num_blocks * self.B):
                raise ValueError(f"given prefix of request {p.request_id}: slots outside the "
                                 f"cache's {self.num_blocks * self.B}")
            slot = torch.as_tensor(p.slots, dtype=torch.int64, device=self.device)
            for l, (layer, cache) in enumerate(zip(p.layers, self.caches)):
                part = {k: torch.as_tensor(v, device=self.device) for k, v in layer.items()}
                kv = cache.kv.view(-1, cache.kv.shape[-1])
                if c["kv_cache"] == "fp8_ds_mla":
                    kv[slot] = fp8.ds_mla_rows(part["latent"], part["latent_scale"],
                                               part["k_rope"])
                else:
                    kv[slot] = torch.cat([part["latent"], part["k_rope"]], -1).to(kv.dtype)
                if cache.index_k is not None:
                    cache.index_k.view(-1, cache.index_k.shape[-1])[slot] = part["index_k"]
                    cache.index_k_scale.view(-1)[slot] = part["index_scale"]
            done.append(p.request_id)
        return done

    def _layer_cache(self, c, l):
        n, B, dev = self.num_blocks + 1, self.B, self.device
        Lkv, dr = c["kv_lora_rank"], c["qk_rope_head_dim"]
        if c["kv_cache"] == "fp8_ds_mla":
            kv = torch.full((n, B, fp8.ds_mla_width(Lkv, dr)), 0xFF, dtype=torch.uint8, device=dev)
        else:
            kv = torch.full((n, B, Lkv + dr), float("nan"), dtype=storage_dtype(c), device=dev)
        cache = LayerCache(kv)
        if c["index_topk_pattern"][l] == "F":
            cache.index_k = torch.full((n, B, c["index_head_dim"]), 0xFF, dtype=torch.uint8,
                                       device=dev)
            cache.index_k_scale = torch.full((n, B), float("nan"), dtype=torch.float32,
                                             device=dev)
        return cache

    def capture_size(self, s):
        return int(self.golden.steps[s].capture_size)

    def step(self, s, padded_to=None):
        """Step s as a Batch of `padded_to` rows (default: its own T_a, no padding)."""
        inp = self.golden.steps[s].inputs
        Ta, R = int(inp["hidden"].shape[0]), int(inp["ctx_len"].shape[0])
        T = padded_to or Ta
        if T < Ta:
            raise ValueError(f"step {s}: {Ta} tokens do not fit a capture size of {T}")
        qs = np.asarray(inp["q_len"], dtype=np.int64)
        req_of = np.full(T, T if padded_to else R, dtype=np.int64)  # padded rows: a padded request
        req_of[:Ta] = inp["request_of_token"]
        return self._batch(s, inp["hidden"], inp["positions"], inp["slots"], req_of, qs,
                           inp["ctx_len"] + qs, inp["block_table"], T, padded_to is not None)

    def dummy(self, T):
        """What a graph is captured with: one real token at position 0 with no cache slot and no
        blocks, the rest padding (so that any host value baked at capture is wrong later)."""
        D = self.golden.config["hidden_size"]
        return self._batch(-1, np.zeros((1, D)), [0], [-1], np.r_[0, np.full(T - 1, T)],
                           np.array([1]), np.array([1]), np.full((1, 1), -1), T, True)

    def _batch(self, s, hidden, positions, slots, req_of, q_len, seq_len, table, T, static):
        Ta, R = len(positions), len(q_len)
        Rmax = T + 1 if static else R  # a capture size's batches: room for any step of T rows
        dev, i32, i64 = self.device, torch.int32, torch.int64
        h = torch.zeros((T, self.golden.config["hidden_size"]), dtype=self.dtype, device=dev)
        h[:Ta] = torch.as_tensor(np.asarray(hidden), dtype=self.dtype)
        pos = torch.zeros(T, dtype=i64, device=dev)
        pos[:Ta] = torch.as_tensor(np.asarray(positions, dtype=np.int64))
        slot = torch.full((T,), -1, dtype=i64, device=dev)
        slot[:Ta] = torch.as_tensor(np.asarray(slots, dtype=np.int64))
        qsl = torch.full((Rmax + 1,), Ta, dtype=i32, device=dev)
        qsl[:R + 1] = torch.as_tensor(np.r_[0, np.cumsum(q_len)].astype(np.int32))
        sl = torch.zeros(Rmax, dtype=i32, device=dev)
        sl[:R] = torch.as_tensor(np.asarray(seq_len, dtype=np.int32))
        bt = torch.full((Rmax, self.NB), -1, dtype=i32, device=dev)
        table = np.asarray(table)
        bt[:R, :table.shape[1]] = torch.as_tensor(table.astype(np.int32))
        return Batch(self.golden.config, h, pos, slot, qsl, sl, bt,
                     torch.as_tensor(np.asarray(req_of, dtype=np.int64), device=dev),
                     self.caches, Ta, R, self.max_seq_len, self.B, self.num_blocks * self.B, s)
