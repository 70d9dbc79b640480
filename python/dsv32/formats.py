"""GOLDEN.md's stored formats: bfloat16 as uint16 bits, float8_e4m3fn as uint8 codes."""
import numpy as np


def _codes(x, dtype, what):
    """x as an array of `dtype` codes, each an integer in its range (a ValueError otherwise:
    numpy's cast would wrap 300 to 44 and truncate 1.7 to 1)."""
    a = np.asarray(x)
    info = np.iinfo(dtype)
    if a.dtype.kind not in "iu" and not (a.dtype.kind == "f" and np.all(a == np.floor(a))):
        raise ValueError(f"{what} takes integer codes, not {a.dtype} values")
    if a.size and (a.min() < info.min or a.max() > info.max):
        raise ValueError(f"{what} takes codes in [{info.min}, {info.max}]; "
                         f"{a.min() if a.min() < info.min else a.max()} is not one")
    return a.astype(dtype)


def bf16_values(bits):
    """float32 values of bfloat16 bit patterns (exact)."""
    a = _codes(bits, np.uint16, "bf16_values")
    return (np.atleast_1d(a).astype(np.uint32) << 16).view(np.float32).reshape(a.shape)


def bf16_bits(values):
    """bfloat16 bit patterns of values, rounded to nearest even from float32 (NaN canonical)."""
    f = np.ascontiguousarray(np.asarray(values, dtype=np.float32))
    u = f.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(f), np.uint16(0x7FFF), rounded).astype(np.uint16)


def e4m3_values(codes):
    """float64 values of float8_e4m3fn codes (0x7F and 0xFF are NaN)."""
    u = _codes(codes, np.uint8, "e4m3_values")
    e = ((u >> 3) & 0xF).astype(np.int64)
    m = (u & 7).astype(np.float64)
    mag = np.where(e == 0, m * 2.0 ** -9, (1 + m / 8) * np.exp2(e - 7))
    mag = np.where((u & 0x7F) == 0x7F, np.nan, mag)
    return np.where(u & 0x80, -mag, mag)


def dtype_attribute(dataset):
    """A dataset's logical dtype (its `dtype` attribute) as a str; a KeyError without one, a
    ValueError when it is not a string."""
    dtype = dataset.attrs["dtype"]
    if isinstance(dtype, np.ndarray) and dtype.shape == ():
        dtype = dtype[()]
    if isinstance(dtype, bytes):
        dtype = dtype.decode(errors="replace")
    if not isinstance(dtype, str):
        raise ValueError(f"its dtype attribute is {dtype!r}, not a string")
    return dtype


def decode(dataset):
    """A dataset's values as float64 (int32 for int32), by its `dtype` attribute, stored as
    GOLDEN.md and the tool's reader have it: bfloat16 as uint16 bits, float8_e4m3fn as uint8
    codes, int32 as any integer type (each value in range), float32 and float64 as any float
    type (float32 values exactly float32). Anything else is a ValueError naming the value:
    numpy's casts would wrap 2^32+1 to 1 and truncate 1.5 to 1."""
    dtype = dtype_attribute(dataset)
    stored = dataset.dtype
    want = {"bfloat16": np.dtype(np.uint16), "float8_e4m3fn": np.dtype(np.uint8)}.get(dtype)
    kind = {"int32": "iu", "float32": "f", "float64": "f"}.get(dtype)
    if want is None and kind is None:
        raise ValueError(f"unknown dtype {dtype!r}")
    if (want is not None and stored.newbyteorder("=") != want) or \
            (kind is not None and stored.kind not in kind):
        raise ValueError(f"stored as {stored}, which does not hold dtype {dtype}")
    raw = dataset[()]
    if dtype == "bfloat16":
        return bf16_values(raw).astype(np.float64)
    if dtype == "float8_e4m3fn":
        return e4m3_values(raw)
    if dtype == "int32":
        a = np.asarray(raw)
        if a.size and (a.min() < np.iinfo(np.int32).min or a.max() > np.iinfo(np.int32).max):
            i = np.unravel_index(int(np.flatnonzero((a < np.iinfo(np.int32).min) |
                                                    (a > np.iinfo(np.int32).max))[0]), a.shape)
            raise ValueError(f"int32 value {int(a[i])} out of range at {tuple(map(int, i))}")
        return a.astype(np.int32)
    a = np.asarray(raw, dtype=np.float64)
    if dtype == "float32":
        off = ~np.isnan(a) & (a.astype(np.float32).astype(np.float64) != a)
        if off.any():
            i = np.unravel_index(int(np.flatnonzero(off)[0]), a.shape)
            raise ValueError(f"dtype float32, but the value {a[i]!r} at {tuple(map(int, i))} is "
                             "not a float32")
    return a
