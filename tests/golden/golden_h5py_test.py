"""Reads golden files the way PyTorch/vLLM users would: h5py and numpy only.

    DSV32_ROUNDTRIP_WRITER=build/default/tests/golden/golden_roundtrip_writer \
        python3 -m pytest tests/golden/golden_h5py_test.py
The writer (golden_roundtrip_writer) writes roundtrip tensors; their shapes, dtypes and values
are checked here, and q_c of step 0 is recomputed from a golden's inputs and weights
($DSV32_FIXTURES/default.h5, default: the checkout's fixtures/). ctest: Golden.ReadWithH5py.
Skips without numpy or h5py."""
import json
import os
import subprocess

import pytest

h5py = pytest.importorskip("h5py", reason="install python3-h5py")
np = pytest.importorskip("numpy", reason="install python3-numpy")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURE = os.path.join(os.environ.get("DSV32_FIXTURES") or os.path.join(ROOT, "fixtures"),
                       "default.h5")


def bf16(u16):
    return (np.asarray(u16, dtype=np.uint32) << 16).view(np.float32)


def e4m3(u8):
    u8 = np.asarray(u8, dtype=np.uint8)
    e = (u8 >> 3) & 0xF
    m = (u8 & 7).astype(np.float64)
    mag = np.where(e == 0, m * 2.0**-9, (1 + m / 8) * 2.0 ** (e.astype(np.float64) - 7))
    return np.where(u8 & 0x80, -mag, mag)


def formula(shape, scale):
    n = np.arange(int(np.prod(shape)), dtype=np.float64)
    return (scale * ((n % 37) - 11.0)).reshape(shape)


# name: (shape, scale, the dtype attribute, the stored numpy dtype, the decoding)
ROUNDTRIP = {"bf16_3x5": ((3, 5), 0.125, "bfloat16", np.uint16, bf16),
             "f32_2x3x4": ((2, 3, 4), 0.3, "float32", np.float32, lambda a: a),
             "f64_4x3": ((4, 3), 0.1, "float64", np.float64, lambda a: a),
             "i32_5x2": ((5, 2), 1.0, "int32", np.int32, lambda a: a),
             "e4m3_2x6": ((2, 6), 0.5, "float8_e4m3fn", np.uint8, e4m3)}


@pytest.fixture(scope="module")
def roundtrip(tmp_path_factory):
    writer = os.environ.get("DSV32_ROUNDTRIP_WRITER")
    if not writer:
        pytest.skip("$DSV32_ROUNDTRIP_WRITER does not name golden_roundtrip_writer")
    scratch = os.environ.get("DSV32_SCRATCH") or str(tmp_path_factory.mktemp("h5py"))
    os.makedirs(scratch, exist_ok=True)
    path = os.path.join(scratch, "roundtrip.h5")
    subprocess.run([writer, path], check=True)
    with h5py.File(path, "r") as f:
        yield f


def test_the_roundtrip_file_is_the_writers(roundtrip):
    assert roundtrip.attrs["note"] == "roundtrip", roundtrip.attrs["note"]


@pytest.mark.parametrize("name", list(ROUNDTRIP))
def test_a_roundtrip_tensor_reads_back(roundtrip, name):
    shape, scale, dtype, stored, decode = ROUNDTRIP[name]
    d = roundtrip[name]
    assert d.shape == shape, (name, d.shape)
    assert d.dtype == stored, (name, d.dtype)
    assert d.attrs["dtype"] == dtype, (name, d.attrs["dtype"])
    got = decode(d[()]).astype(np.float64)
    want = formula(shape, scale)
    if dtype == "float32":
        want = want.astype(np.float32).astype(np.float64)
    assert np.array_equal(got, want), (name, got, want)
    # Row-major: element (0, 1) is the second value written, not the (1, 0) one.
    assert got.reshape(-1)[1] == want.reshape(-1)[1] != want.reshape(-1)[shape[-1]]


def rmsnorm(x, g, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g


def test_q_c_is_recomputed_from_a_goldens_inputs_and_weights():
    with h5py.File(FIXTURE, "r") as f:
        assert f.attrs["schema"] == "dsv32-golden"
        cfg = json.loads(f.attrs["config"])
        w = f["weights/layer0"]
        inp = f["steps/step0/inputs"]
        assert inp["hidden"].attrs["dtype"] == "bfloat16"
        hidden = bf16(inp["hidden"][()]).astype(np.float64)
        g_in = bf16(w["g_in"][()]).astype(np.float64)
        w_qkv_a = bf16(w["w_qkv_a"][()]).astype(np.float64)
        g_q = bf16(w["g_q"][()]).astype(np.float64)
        eps = cfg["rms_norm_eps"]
        x = rmsnorm(hidden, g_in, eps)
        cq = (x @ w_qkv_a.T)[:, : cfg["q_lora_rank"]]
        q_c = rmsnorm(cq, g_q, eps)
        want = f["steps/step0/expected/layer0/q_c"][()]
        assert want.shape == q_c.shape, (want.shape, q_c.shape)
        err = np.max(np.abs(q_c - want))
        assert err < 1e-12, err
        emu = bf16(f["steps/step0/emulated/layer0/q_c"][()]).astype(np.float64)
        assert 0 < np.max(np.abs(emu - want)) < 0.05
