"""MATH.md's quantizers and the caches' byte layouts, in torch ops any torch has (no float8
dtype is needed: codes are uint8), on any device, capture-safe (no host reads).

- `e4m3(x)`: float8_e4m3fn values of x (round to nearest even, saturate to +-448), in x's dtype;
- `e4m3_encode(v)` / `e4m3_decode(codes)`: the codes of such values and back (0x7F is NaN);
- `ue8m0(amax)`: the smallest power of two 2^e with max(amax, 1e-4) <= 448 * 2^e, exactly;
- `ds_mla_pack(c, kR)` / `ds_mla_unpack(row, Lkv, dr)`: the fp8_ds_mla cache row of a token:
  Lkv e4m3 codes, ceil(Lkv / 128) fp32 tile scales, dr bf16 rope values, as bytes (656 B a
  token at DSv3.2's Lkv = 512, dr = 64); read back as code value * tile scale (fp32);
  `ds_mla_rows(codes, scales, kR)` lays out such rows of parts already quantized (a given
  prefix's).
"""
import math

import torch

FP8_MAX = 448.0


def e4m3(x):
    """float8_e4m3fn values of x: the quantum of |x|'s binade is 2^(e-4) for |x| = m 2^e,
    m in [0.5, 1), and 2^-9 below 2^-6 (subnormals); torch.round is half to even."""
    a = x.abs().clamp(max=FP8_MAX)
    _, ex = torch.frexp(torch.where(a > 0, a, torch.ones_like(a)))
    q = torch.pow(2.0, (torch.clamp(ex, min=-5) - 4).to(x.dtype))
    return torch.copysign(torch.clamp(torch.round(a / q) * q, max=FP8_MAX), x)


def e4m3_encode(v):
    """uint8 codes of values that are float8_e4m3fn values already (e4m3(x))."""
    a = v.abs().double()
    m, ex = torch.frexp(torch.where(a > 0, a, torch.ones_like(a)))
    normal = a >= 2.0 ** -6
    e_bits = torch.where(normal, ex + 6, torch.zeros_like(ex))  # biased exponent (bias 7)
    mant = torch.where(normal, (m * 16 - 8), a * 512).round().long()
    code = (e_bits.long() << 3) | mant
    code = torch.where(a > 0, code, torch.zeros_like(code)) | (torch.signbit(v).long() << 7)
    return torch.where(torch.isnan(v), torch.full_like(code, 0x7F), code).to(torch.uint8)


def e4m3_decode(codes, dtype=torch.float64):
    """Values of float8_e4m3fn codes (uint8) in `dtype`."""
    u = codes.long()
    e = (u >> 3) & 0xF
    m = (u & 7).to(dtype)
    mag = torch.where(e == 0, m * 2.0 ** -9, (1 + m / 8) * torch.pow(2.0, (e - 7).to(dtype)))
    mag = torch.where((u & 0x7F) == 0x7F, torch.full_like(mag, math.nan), mag)
    return torch.where((u & 0x80) != 0, -mag, mag)


def ue8m0(amax):
    """The smallest power of two 2^e with a <= 448 * 2^e, a = max(amax, 1e-4): with
    a = m 2^x (m in [0.5, 1)) and 448 = 0.875 2^9, e = x - 9 if m <= 0.875 else x - 8."""
    a = amax.clamp(min=1e-4)
    m, x = torch.frexp(a)
    e = torch.where(m <= 0.875, x - 9, x - 8)
    return torch.pow(2.0, e.to(amax.dtype))


def _bytes_of(t):
    """The bytes of a tensor's last axis (little-endian, as the device holds them)."""
    return t.contiguous().view(torch.uint8).reshape(*t.shape[:-1], -1)


def ds_mla_width(Lkv, dr):
    return Lkv + 4 * ((Lkv + 127) // 128) + 2 * dr


def ds_mla_pack(c, kR):
    """fp8_ds_mla rows of latents c (N, Lkv) and rope keys kR (N, dr): uint8 (N, width).
    Tile scale = max(fp32(amax) / 448 in fp32, FLT_MIN); code = e4m3(c / scale) in fp32."""
    N, Lkv = c.shape
    tiles = (Lkv + 127) // 128
    cf = torch.nn.functional.pad(c.float(), (0, tiles * 128 - Lkv)).reshape(N, tiles, 128)
    amax = cf.abs().amax(-1).float()
    scale = torch.clamp(amax / FP8_MAX, min=torch.finfo(torch.float32).tiny)
    codes = e4m3_encode(e4m3(cf / scale[..., None])).reshape(N, -1)[:, :Lkv]
    return ds_mla_rows(codes, scale, kR)


def ds_mla_rows(codes, scales, kR):
    """fp8_ds_mla rows (N, width) uint8 of given parts: `codes` (N, Lkv) uint8 e4m3 codes,
    `scales` (N, ceil(Lkv / 128)) tile scales (stored as fp32), `kR` (N, dr) (stored as bf16)."""
    return torch.cat([codes.to(torch.uint8), _bytes_of(scales.to(torch.float32)),
                      _bytes_of(kR.to(torch.bfloat16))], dim=1)


def ds_mla_unpack(rows, Lkv, dr, dtype=torch.float32):
    """(c, kR) read back from fp8_ds_mla rows (..., width): c = code value * tile scale (fp32)."""
    tiles = (Lkv + 127) // 128
    lead = rows.shape[:-1]
    codes = rows[..., :Lkv]
    scale = rows[..., Lkv:Lkv + 4 * tiles].contiguous().view(torch.float32)
    rope = rows[..., Lkv + 4 * tiles:Lkv + 4 * tiles + 2 * dr].contiguous().view(torch.bfloat16)
    tile_of = torch.arange(Lkv, device=rows.device) // 128
    c = e4m3_decode(codes, torch.float32) * scale[..., tile_of]
    return c.to(dtype).reshape(*lead, Lkv), rope.to(dtype).reshape(*lead, dr)
