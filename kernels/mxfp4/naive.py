"""The MXFP4 weight format: E2M1 codes, two per byte, with one E8M0 scale per group of 32.

This is the format of K3's routed experts (compressed-tensors `mxfp4-pack-quantized`, the
OCP Microscaling spec v1.0, element type FP4 E2M1, scale type E8M0, block size 32):

    packed [..., K/2] uint8    byte j holds k = 2j in its low nibble, k = 2j + 1 in its high one
    scale  [..., K/32] uint8   E8M0: the group's scale is 2^(byte - 127); 255 is NaN
    code (4 bits)              bit 3 the sign, bits 0-2 index {0, 0.5, 1, 1.5, 2, 3, 4, 6}
    w[..., k] = (-1)^sign * E2M1[code & 7] * 2^(scale[..., k // 32] - 127)

`decode` is exact: a code times a power of two has at most two significant bits, so every
value is a float32 (and a bfloat16) unless it leaves float32's range (6 * 2^127 is inf).
`encode` follows the spec's conversion: the group's shared exponent is
floor(log2(max |w|)) - 2 (2 = the largest E2M1 exponent), elements round to the nearest E2M1
value (ties to the even code) and saturate at +-6, so values already in the format come back
unchanged.
"""

from __future__ import annotations

import torch

GROUP_SIZE = 32
E8M0_BIAS = 127
E8M0_NAN = 255
E2M1_EMAX = 2  # 6 = 1.5 * 2^2
# Magnitudes of the eight E2M1 codes 0..7 (bits 0-2); bit 3 is the sign.
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Midpoints between neighbouring magnitudes, and whether a tie there goes up: a tie goes to
# the even code (0.25 -> 0, 0.75 -> 1.0 (code 2), 1.25 -> 1.0, 1.75 -> 2.0, ...).
_MIDPOINTS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True),
              (5.0, False))


def e2m1_table(dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> torch.Tensor:
    """The 16 values of the 4-bit codes, indexed by code (codes 8..15 are the negatives)."""
    mags = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=device)
    return torch.cat([mags, -mags]).to(dtype)


def e8m0_to_float(scale: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes -> float32 2^(byte - 127), built from the bits (exact; 255 -> NaN).

    Byte s >= 1 is the float32 with exponent field s and a zero mantissa; s = 0 is 2^-127,
    the float32 subnormal with mantissa 0x400000.
    """
    _check_uint8(scale, "scale")
    s = scale.to(torch.int32)
    bits = torch.where(s == 0, torch.full_like(s, 0x00400000), s << 23)
    bits = torch.where(s == E8M0_NAN, torch.full_like(s, 0x7FC00000), bits)
    return bits.view(torch.float32)


def unpack_codes(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K/2] -> the 4-bit codes [..., K] as uint8, low nibble first."""
    _check_uint8(packed, "packed")
    lo, hi = packed & 0x0F, packed >> 4
    return torch.stack([lo, hi], dim=-1).flatten(-2)


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """4-bit codes [..., K] (K even) -> uint8 [..., K/2], the even k in the low nibble."""
    if codes.shape[-1] % 2:
        raise ValueError(f"mxfp4: an odd number of codes ({codes.shape[-1]}) cannot be packed two a byte")
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def decode(packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The weights [..., K] of MXFP4 `packed` [..., K/2] and `scale` [..., K/32], in `dtype`.

    Computed in float32 (exact, see the module docstring), then cast.
    """
    check_shapes(packed, scale)
    codes = unpack_codes(packed).to(torch.int64)
    values = e2m1_table(device=packed.device)[codes]  # [..., K]
    K = values.shape[-1]
    scales = e8m0_to_float(scale).repeat_interleave(GROUP_SIZE, dim=-1)[..., :K]
    return (values * scales).to(dtype)


def encode(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 of floating `w` [..., K] (K a multiple of 32): (packed [..., K/2], scale [..., K/32]).

    Finite inputs only. A group of zeros gets the smallest scale (byte 0).
    """
    if not w.is_floating_point():
        raise ValueError(f"mxfp4.encode takes floating weights, got {w.dtype}")
    K = w.shape[-1] if w.dim() else 0
    if w.dim() == 0 or K % GROUP_SIZE:
        raise ValueError(f"mxfp4.encode: the last dim ({K}) must be a multiple of {GROUP_SIZE}")
    wf = w.float()
    if not torch.isfinite(wf).all():
        raise ValueError("mxfp4.encode: the weights hold inf or NaN")
    groups = wf.reshape(*wf.shape[:-1], K // GROUP_SIZE, GROUP_SIZE)
    amax = groups.abs().amax(-1)
    # floor(log2(amax)) from the float's exponent field (exact, no log rounding); frexp gives
    # amax = m * 2^e with m in [0.5, 1), so floor(log2 amax) = e - 1.
    _, e = torch.frexp(amax)
    shared = torch.where(amax > 0, e.to(torch.int32) - 1 - E2M1_EMAX, torch.full_like(e, -E8M0_BIAS, dtype=torch.int32))
    byte = (shared + E8M0_BIAS).clamp(0, 254)
    x = groups / e8m0_to_float(byte.to(torch.uint8))[..., None]  # a power of two: exact
    mag = x.abs()
    code = torch.zeros_like(mag, dtype=torch.int32)
    for mid, tie_up in _MIDPOINTS:
        code += (mag >= mid if tie_up else mag > mid).to(torch.int32)
    code = code | (torch.signbit(x).to(torch.int32) << 3)
    return pack_codes(code.reshape(wf.shape)), byte.to(torch.uint8)


def check_shapes(packed: torch.Tensor, scale: torch.Tensor) -> None:
    """Raise ValueError unless `packed` [..., K/2] and `scale` [..., K/32] fit one another."""
    _check_uint8(packed, "packed")
    _check_uint8(scale, "scale")
    if packed.dim() == 0 or packed.shape[:-1] != scale.shape[:-1]:
        raise ValueError(f"mxfp4: packed {list(packed.shape)} and scale {list(scale.shape)} differ before the last dim")
    K = 2 * packed.shape[-1]
    if K % GROUP_SIZE or scale.shape[-1] != K // GROUP_SIZE:
        raise ValueError(f"mxfp4: packed {list(packed.shape)} holds K = {K} codes a row, which needs K a "
                         f"multiple of {GROUP_SIZE} and K/{GROUP_SIZE} scales; scale has {scale.shape[-1]}")


def _check_uint8(t: torch.Tensor, what: str) -> None:
    if t.dtype != torch.uint8:
        raise ValueError(f"mxfp4: {what} must be uint8, got {t.dtype}")


__all__ = ["GROUP_SIZE", "E2M1_MAGNITUDES", "e2m1_table", "e8m0_to_float", "unpack_codes", "pack_codes",
           "decode", "encode", "check_shapes"]
