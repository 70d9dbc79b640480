"""Given-prefix goldens (GOLDEN.md, "Given prefix") through the package: `read_golden` reads
/prefix into `golden.prefix` as the tool reads it (and refuses what the tool refuses, naming the
dataset), and dsv32.torch stores each prefix into its caches before the request's first step,
so the example layer passes exactly as on an ordinary golden, and fails, at the step that first
reads a prefix, when nothing (or the wrong thing) is stored there.

The goldens are generated here from case files by `dsv32 golden --spec` (tiny sizes, K = 8, FS
layers, a bf16 and an fp8_ds_mla cache): request 0 starts with 200 given positions at step 0
beside request 1 (a 12-token prefill, no prefix), request 2 with 150 at step 1.

    DSV32_TOOL=build/default/tools/dsv32 python3 -m pytest tests/python/test_given_prefix.py
(the package installed; ctest runs it as Python.GivenPrefix*, DSV32_SCRATCH set.)"""
import json
import os
import shutil
import subprocess

import h5py
import numpy as np
import pytest

import dsv32
from dsv32 import _tool

try:
    import torch
except ImportError:
    torch = None

KV = ("bf16", "fp8_ds_mla")
GIVEN = {0: (200, 0), 2: (150, 1)}  # request id -> (given positions, its first step)


def case(kv):
    return {
        "name": f"given-prefix-{kv.replace('_', '-')}",
        "description": "given prefixes beside a request without one (tests/python)",
        "config": {"preset": "tiny", "num_layers": 2, "index_topk_pattern": "FS",
                   "index_topk": 8, "kv_cache": kv},
        "cache": {"num_blocks": 96},
        "steps": [
            {"requests": [{"id": 0, "new_tokens": 3, "given_prefix": 200},
                          {"id": 1, "new_tokens": 12}], "capture_size": 16},
            {"requests": [{"id": 0, "new_tokens": 1}, {"id": 1, "new_tokens": 1},
                          {"id": 2, "new_tokens": 2, "given_prefix": 150}], "capture_size": 8},
            {"requests": [{"id": 0, "new_tokens": 1}, {"id": 2, "new_tokens": 1}]},
        ],
    }


@pytest.fixture(scope="module")
def goldens(scratch):
    """kv_cache -> the path of its given-prefix golden, generated into the scratch folder."""
    out = {}
    for kv in KV:
        spec = os.path.join(scratch, f"{kv}.json")
        with open(spec, "w", encoding="utf-8") as f:
            json.dump(case(kv), f)
        p = subprocess.run([_tool.find_tool(), "golden", "--spec", spec, "--out", scratch],
                           capture_output=True, text=True, stdin=subprocess.DEVNULL)
        assert p.returncode == 0, p.stdout + p.stderr
        out[kv] = os.path.join(scratch, case(kv)["name"] + ".h5")
    return out


# --- the reader ----------------------------------------------------------------------------

@pytest.mark.parametrize("with_tool", [True, False], ids=["tool", "package-only"])
@pytest.mark.parametrize("kv", KV)
def test_reader_view_of_the_prefix(goldens, kv, with_tool):
    g = dsv32.read_golden(goldens[kv], validate_with_tool=with_tool)
    c = g.config
    L, dr, dI, B = c["kv_lora_rank"], c["qk_rope_head_dim"], c["index_head_dim"], c["block_size"]
    assert int(g.attrs["schema_version"]) == 2
    assert sorted(g.prefix) == sorted(GIVEN)
    fp8 = kv == "fp8_ds_mla"
    with h5py.File(goldens[kv], "r") as f:
        for rid, (P, first) in GIVEN.items():
            p = g.prefix[rid]
            assert isinstance(p, dsv32.Prefix)
            assert (p.request_id, p.length, p.first_step) == (rid, P, first)
            inp = g.steps[first].inputs
            row = list(inp["request_id"]).index(rid)
            assert int(inp["ctx_len"][row]) == P  # the request's first step starts after it
            assert rid not in set(int(i) for s in g.steps[:first] for i in s.inputs["request_id"])
            pos = np.arange(P)
            assert p.slots.dtype == np.int64 and p.slots.shape == (P,)
            np.testing.assert_array_equal(p.slots, inp["block_table"][row][pos // B] * B + pos % B)
            assert len(set(p.slots.tolist())) == P
            assert not set(p.slots.tolist()) & set(inp["slots"].tolist())  # the step's own
            assert len(p.layers) == c["num_layers"]
            for l, layer in enumerate(p.layers):
                full = c["index_topk_pattern"][l] == "F"
                want = {"latent": ((P, L), np.uint8 if fp8 else np.float32),
                        "k_rope": ((P, dr), np.float32)}
                if fp8:
                    want["latent_scale"] = ((P, -(-L // 128)), np.float32)
                if full:
                    want.update(index_k=((P, dI), np.uint8), index_scale=((P,), np.float32))
                assert {k: (a.shape, a.dtype) for k, a in layer.items()} == \
                    {k: (s, np.dtype(t)) for k, (s, t) in want.items()}
                raw = f[f"prefix/request{rid}/layer{l}"]
                assert int(f[f"prefix/request{rid}"].attrs["length"]) == P
                # as the file stores them: codes bit for bit, bf16 values exactly
                if fp8:
                    np.testing.assert_array_equal(layer["latent"], raw["latent"][()])
                    np.testing.assert_array_equal(layer["latent_scale"], raw["latent_scale"][()])
                    assert (layer["latent_scale"] > 0).all()
                else:
                    np.testing.assert_array_equal(layer["latent"],
                                                  dsv32.bf16_values(raw["latent"][()]))
                np.testing.assert_array_equal(layer["k_rope"], dsv32.bf16_values(raw["k_rope"][()]))
                assert np.isfinite(layer["k_rope"]).all() and layer["k_rope"].std() > 0.5
                if full:
                    np.testing.assert_array_equal(layer["index_k"], raw["index_k"][()])
                    mant, _ = np.frexp(layer["index_scale"])
                    assert (mant == 0.5).all()
                    assert np.isfinite(dsv32.e4m3_values(layer["index_k"])).all()
    # request 1 starts without a context and without a prefix
    assert 1 not in g.prefix and int(g.steps[0].inputs["ctx_len"][1]) == 0


def test_an_ordinary_golden_has_no_prefix(fixtures_dir):
    g = dsv32.read_golden(os.path.join(fixtures_dir, "kv-fp8.h5"))
    assert g.prefix == {} and int(g.attrs["schema_version"]) == 1


def edited(goldens, tmp_path, name, fn):
    path = str(tmp_path / f"{name}.h5")
    shutil.copy(goldens["fp8_ds_mla"], path)
    with h5py.File(path, "r+") as f:
        fn(f)
    return path


def setitem(path, index, value):
    def fn(f):
        d = f[path]
        a = d[()]
        a[index] = value
        d[...] = a
    return fn


def set_attr(path, key, value):
    def fn(f):
        f[path].attrs[key] = value
    return fn


def reshaped(path, rows):
    def fn(f):
        a, dtype = f[path][()], f[path].attrs["dtype"]
        del f[path]
        f.create_dataset(path, data=a[:rows])
        f[path].attrs["dtype"] = dtype
    return fn


def renamed(src, dst):
    def fn(f):
        f.move(src, dst)
    return fn


def deleted(path):
    def fn(f):
        del f[path]
    return fn


L0 = "prefix/request0/layer0"
# An edit of the fp8 golden, and what the package's own message must name (the tool's names the
# same dataset or group; both readers refuse every one).
DEFECTS = {
    "version-1": (set_attr("/", "schema_version", np.int64(1)), "/prefix", "schema_version"),
    "nan-code": (setitem(f"{L0}/latent", (3, 5), 0x7F), f"{L0}/latent", "no finite e4m3"),
    "nan-index-code": (setitem(f"{L0}/index_k", (0, 0), 0xFF), f"{L0}/index_k", "no finite e4m3"),
    "zero-tile-scale": (setitem(f"{L0}/latent_scale", (7, 0), 0.0), f"{L0}/latent_scale",
                        "positive"),
    "index-scale-not-power-of-two": (setitem(f"{L0}/index_scale", 9, 3.0),
                                     f"{L0}/index_scale", "power of two"),
    "k-rope-nan": (setitem("prefix/request0/layer1/k_rope", (0, 0), 0x7FC0),
                   "prefix/request0/layer1/k_rope", "nan"),
    "short-latent": (reshaped(f"{L0}/latent", 199), f"{L0}/latent", "shape"),
    "missing-index-k": (deleted(f"{L0}/index_k"), f"{L0}/index_k", "missing"),
    "length-off": (set_attr("prefix/request2", "length", np.int64(149)), "step1/inputs",
                   "149"),
    "prefix-missing": (deleted("prefix/request2"), "step1/inputs", "/prefix/request2"),
    "prefix-of-no-request": (renamed("prefix/request2", "prefix/request7"),
                             "prefix/request7", "no step starts"),
    "not-a-request": (renamed("prefix/request2", "prefix/req2"), "prefix/req2", "not a request"),
}


@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_a_bad_prefix_is_refused_by_name(goldens, tmp_path, defect):
    fn, where, what = DEFECTS[defect]
    path = edited(goldens, tmp_path, defect, fn)
    with pytest.raises(dsv32.GoldenFileError) as tool:
        dsv32.read_golden(path)
    with pytest.raises(dsv32.GoldenFileError) as mine:
        dsv32.read_golden(path, validate_with_tool=False)
    assert where in str(mine.value) and what in str(mine.value).lower(), str(mine.value)
    assert "prefix" in str(tool.value) or where in str(tool.value), str(tool.value)


# --- dsv32.torch -----------------------------------------------------------------------------

def needs_torch(mode="eager"):
    if torch is None:
        pytest.skip("dsv32.torch needs torch (Debian: python3-torch)")
    if mode != "eager" and not torch.cuda.is_available():
        pytest.skip(f"mode {mode} captures CUDA graphs: no CUDA device here")


def stack(g, device, bug=None):
    import example_layers
    return example_layers.load("torch_layer").Stack(g, device, bug)


def device():
    return "cuda" if torch.cuda.is_available() else "cpu"


MODES = ("eager", "full", "narrow", "wide")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kv", KV)
def test_example_layer_passes_on_a_given_prefix(goldens, kv, mode, scratch):
    needs_torch(mode)
    import dsv32.torch as dt
    g = dsv32.read_golden(goldens[kv])
    v = dt.check(stack(g, device()), g, mode, device(),
                 out=os.path.join(scratch, f"torch-{kv}-{mode}.h5"))
    assert v.passed, dt.failure_text(v)
    assert not v.notes
    assert len(v.stages) > 0


def test_the_harness_stores_the_prefix_in_the_caches_layout(goldens):
    """After store_given, each prefix slot reads back the file's entry through the layout's own
    readers (fp8.ds_mla_unpack, e4m3_decode), and no other slot changed."""
    needs_torch()
    import dsv32.torch as dt
    for kv in KV:
        g = dsv32.read_golden(goldens[kv])
        inputs = dt.Inputs(g, "cpu")
        before = [c.kv.clone() for c in inputs.caches]
        assert inputs.store_given(0) == [0]
        assert inputs.store_given(1) == [2]
        L, dr = g.config["kv_lora_rank"], g.config["qk_rope_head_dim"]
        mine = np.concatenate([g.prefix[r].slots for r in GIVEN])
        for l, cache in enumerate(inputs.caches):
            kv_rows = cache.kv.view(-1, cache.kv.shape[-1])
            for rid in GIVEN:
                p = g.prefix[rid]
                layer, rows = p.layers[l], kv_rows[torch.as_tensor(p.slots)]
                if kv == "fp8_ds_mla":
                    c, kR = dt.fp8.ds_mla_unpack(rows, L, dr, torch.float64)
                    tile = np.arange(L) // 128
                    want = (dsv32.e4m3_values(layer["latent"]).astype(np.float32) *
                            layer["latent_scale"][:, tile]).astype(np.float64)
                    np.testing.assert_array_equal(c.numpy(), want)
                else:
                    c, kR = rows[:, :L].double(), rows[:, L:].double()
                    np.testing.assert_array_equal(c.numpy(), layer["latent"])
                np.testing.assert_array_equal(kR.numpy(), layer["k_rope"])
                if cache.index_k is not None:
                    idx = cache.index_k.view(-1, cache.index_k.shape[-1])[torch.as_tensor(p.slots)]
                    np.testing.assert_array_equal(idx.numpy(), layer["index_k"])
                    np.testing.assert_array_equal(
                        cache.index_k_scale.view(-1)[torch.as_tensor(p.slots)].numpy(),
                        layer["index_scale"])
                else:
                    assert "index_k" not in layer
            untouched = np.setdiff1d(np.arange(kv_rows.shape[0]), mine)
            a = kv_rows[torch.as_tensor(untouched)]
            b = before[l].view(-1, before[l].shape[-1])[torch.as_tensor(untouched)]
            assert torch.equal(a.view(torch.uint8) if a.dtype != torch.uint8 else a,
                               b.view(torch.uint8) if b.dtype != torch.uint8 else b)


def _store(how):
    """A replacement for Inputs.store_given that goes wrong in one way."""
    import dsv32.torch as dt
    real = dt.Inputs.store_given

    def none(self, s):
        return []

    def first_step_only(self, s):
        return real(self, s) if s == 0 else []

    def misplaced(self, s):  # position p at slot p: the block table ignored
        for p in self.given.get(s, ()):
            kept, p.slots = p.slots, np.arange(p.length, dtype=np.int64)
            try:
                real(self, s)
            finally:
                p.slots = kept
        return []

    def zeroed(self, s):  # stored, then the caches emptied: a layer with caches of its own
        real(self, s)
        for c in self.caches:
            c.kv.zero_()
            if c.index_k is not None:
                c.index_k.zero_()
                c.index_k_scale.fill_(1.0)
        return []
    return {"none": none, "first-step-only": first_step_only, "misplaced": misplaced,
            "zeroed": zeroed}[how]


# how the prefix goes missing -> the step that first reads what is missing
UNSTORED = {"none": 0, "first-step-only": 1, "misplaced": 0, "zeroed": 0}


@pytest.mark.parametrize("how", sorted(UNSTORED))
@pytest.mark.parametrize("kv", KV)
def test_a_prefix_not_stored_fails(goldens, kv, how, monkeypatch):
    """The example layer, with the harness storing no prefix, the second step's not, prefixes at
    slots p instead of the block table's, or caches zeroed at every step (what a layer that keeps
    caches of its own and never reads the harness's sees): the verdict fails, at the step that
    first reads what is missing. With finite wrong keys (zeroed), the judge names layer 0's topk:
    the indexer is the first stage that reads the cache's older positions."""
    needs_torch()
    import dsv32.torch as dt
    monkeypatch.setattr(dt.Inputs, "store_given", _store(how))
    g = dsv32.read_golden(goldens[kv])
    v = dt.check(stack(g, "cpu"), g, "eager", "cpu")
    assert not v.passed, f"{how}: passed without the prefix"
    f = v.first_failure
    assert f["step"] == UNSTORED[how], dt.failure_text(v)
    if how == "zeroed" or (kv == "bf16" and how != "first-step-only"):
        assert (f["layer"], f["stage"]) == (0, "topk"), dt.failure_text(v)
    shutil.rmtree(os.path.dirname(v.candidate), ignore_errors=True)
