"""An MXFP4 decoder written from the format's definition (OCP Microscaling spec v1.0;
K3-SPEC.md section 8.1), shared by the tests that check k3c's codec and its re-encodings.

A byte holds two FP4 E2M1 codes, the low nibble for the even k; a code is sign (bit 3),
exponent (bits 2-1, bias 1) and mantissa (bit 0), exponent 0 being subnormal (0 or 0.5); a
group of 32 shares the E8M0 scale 2^(byte - 127), byte 255 being NaN. The decoder computes
that in float64 with numpy, from the bit fields (not from a value table), so it shares nothing
with k3c's.
"""

from __future__ import annotations

import numpy as np


def e2m1_from_bits(code: np.ndarray) -> np.ndarray:
    """E2M1 value of 4-bit codes from the sign / exponent / mantissa fields, float64."""
    sign = np.where(code & 0b1000, -1.0, 1.0)
    exp = (code >> 1) & 0b11
    man = code & 0b1
    normal = (1.0 + man / 2.0) * np.exp2(exp.astype(np.float64) - 1.0)
    subnormal = (man / 2.0) * np.exp2(0.0)  # exponent field 0: 0.m x 2^(1 - bias)
    return sign * np.where(exp == 0, subnormal, normal)


def reference_decode(packed: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """float32 weights [N, K] of packed uint8 [N, K/2] and E8M0 scales uint8 [N, K/32]."""
    lo, hi = packed & 0x0F, packed >> 4
    codes = np.empty((packed.shape[0], packed.shape[1] * 2), dtype=np.uint8)
    codes[:, 0::2], codes[:, 1::2] = lo, hi  # the low nibble is the even k
    s = np.where(scale == 255, np.nan, np.exp2(scale.astype(np.float64) - 127.0))
    with np.errstate(over="ignore", invalid="ignore"):
        return (e2m1_from_bits(codes) * np.repeat(s, 32, axis=1)).astype(np.float32)


def bits(x: np.ndarray) -> np.ndarray:
    """The float32 bit patterns of x (NaN == NaN, -0 != 0)."""
    return np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
