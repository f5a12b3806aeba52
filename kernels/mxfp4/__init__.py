"""MXFP4 (E2M1 codes + E8M0 scales, groups of 32): the codec of K3's routed experts.

    packed, scale = encode(w)           # w [..., K] -> uint8 [..., K/2], uint8 [..., K/32]
    w = decode(packed, scale, dtype)    # exact
"""

from .naive import (
    E2M1_MAGNITUDES,
    GROUP_SIZE,
    check_shapes,
    decode,
    e2m1_table,
    e8m0_to_float,
    encode,
    pack_codes,
    unpack_codes,
)

__all__ = ["GROUP_SIZE", "E2M1_MAGNITUDES", "e2m1_table", "e8m0_to_float", "unpack_codes", "pack_codes",
           "decode", "encode", "check_shapes"]
