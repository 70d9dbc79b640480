"""GOLDEN.md's stored formats: bfloat16 as uint16 bits, float8_e4m3fn as uint8 codes."""
import numpy as np


def bf16_values(bits):
    """float32 values of bfloat16 bit patterns (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def bf16_bits(values):
    """bfloat16 bit patterns of values, rounded to nearest even from float32 (NaN canonical)."""
    f = np.ascontiguousarray(np.asarray(values, dtype=np.float32))
    u = f.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(f), np.uint16(0x7FFF), rounded).astype(np.uint16)


def e4m3_values(codes):
    """float64 values of float8_e4m3fn codes (0x7F and 0xFF are NaN)."""
    u = np.asarray(codes, dtype=np.uint8)
    e = ((u >> 3) & 0xF).astype(np.int64)
    m = (u & 7).astype(np.float64)
    mag = np.where(e == 0, m * 2.0 ** -9, (1 + m / 8) * np.exp2(e - 7))
    mag = np.where((u & 0x7F) == 0x7F, np.nan, mag)
    return np.where(u & 0x80, -mag, mag)


def decode(dataset):
    """A dataset's values as float64 (int32 for int32), by its `dtype` attribute."""
    dtype = dataset.attrs["dtype"]
    if isinstance(dtype, bytes):
        dtype = dtype.decode()
    raw = dataset[()]
    if dtype == "bfloat16":
        return bf16_values(raw).astype(np.float64)
    if dtype == "float8_e4m3fn":
        return e4m3_values(raw)
    if dtype == "int32":
        return np.asarray(raw, dtype=np.int64).astype(np.int32)
    if dtype in ("float32", "float64"):
        return np.asarray(raw, dtype=np.float64)
    raise ValueError(f"{dataset.name}: unknown dtype {dtype!r}")
