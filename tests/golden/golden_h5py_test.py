#!/usr/bin/python3
"""Reads golden files the way PyTorch/vLLM users would: h5py and numpy only.

usage: golden_h5py_test.py WRITER SCRATCH_DIR FIXTURE.h5
  WRITER writes roundtrip tensors (golden_roundtrip_writer); their shapes, dtypes and values
  are checked here, and q_c of step 0 is recomputed from the fixture's inputs and weights.
"""
import json
import os
import subprocess
import sys

try:
    import h5py
    import numpy as np
except ImportError as e:  # ctest reports exit code 77 as a skip, with this reason
    print(f"skipped: {e} (install python3-h5py and python3-numpy)")
    sys.exit(77)


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


def check_roundtrip(writer, scratch):
    path = os.path.join(scratch, "roundtrip.h5")
    subprocess.run([writer, path], check=True)
    with h5py.File(path, "r") as f:
        assert f.attrs["note"] == "roundtrip", f.attrs["note"]
        cases = {"bf16_3x5": ((3, 5), 0.125, "bfloat16", np.uint16, bf16),
                 "f32_2x3x4": ((2, 3, 4), 0.3, "float32", np.float32, lambda a: a),
                 "f64_4x3": ((4, 3), 0.1, "float64", np.float64, lambda a: a),
                 "i32_5x2": ((5, 2), 1.0, "int32", np.int32, lambda a: a),
                 "e4m3_2x6": ((2, 6), 0.5, "float8_e4m3fn", np.uint8, e4m3)}
        for name, (shape, scale, dtype, stored, decode) in cases.items():
            d = f[name]
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
    print("roundtrip: 5 tensors ok")


def rmsnorm(x, g, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g


def check_fixture(path):
    with h5py.File(path, "r") as f:
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
    print(f"fixture: q_c recomputed from inputs and weights, max err {err:.2e}")


def main():
    writer, scratch, fixture = sys.argv[1:4]
    os.makedirs(scratch, exist_ok=True)
    check_roundtrip(writer, scratch)
    check_fixture(fixture)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
