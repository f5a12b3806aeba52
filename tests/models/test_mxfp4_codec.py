"""k3c's MXFP4 codec against a decoder written from the format's definition.

The definition (OCP Microscaling spec v1.0; K3-SPEC.md section 8.1): a byte holds two FP4
E2M1 codes, the low nibble for the even k; a code is sign (bit 3), exponent (bits 2-1, bias 1)
and mantissa (bit 0), exponent 0 being subnormal (0 or 0.5); a group of 32 shares the E8M0
scale 2^(byte - 127), byte 255 being NaN. The decoder (tests/mxfp4_reference.py) computes
that in float64 with numpy, from the bit fields (not from a value table), so it shares nothing
with k3c's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from mxfp4_reference import bits, reference_decode

from k3c.kernels import mxfp4


def test_decoder_matches_the_definition_for_every_byte_and_random_scales():
    rng = np.random.default_rng(0)
    # every byte value in every position of a group, against scales over the whole E8M0 range
    packed = np.tile(np.arange(256, dtype=np.uint8), (64, 1))  # [64, 256]: K = 512, 16 groups a row
    packed = np.concatenate([packed, rng.permuted(packed, axis=1)])
    scale = rng.integers(0, 255, size=(packed.shape[0], 16), dtype=np.uint8)
    scale[0], scale[1] = 0, 254  # the subnormal scale 2^-127 and the largest one
    want = reference_decode(packed, scale)
    got = mxfp4.decode(torch.from_numpy(packed), torch.from_numpy(scale)).numpy()
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.array_equal(bits(got), bits(want)), "decode differs from the definition"
    assert np.isinf(got[1]).any() and (got[0] != 0).any()  # both ends of the range were reached


def test_nan_scale_and_nibble_order():
    packed = torch.tensor([[0x21] + [0] * 15], dtype=torch.uint8)  # low nibble 1 (0.5), high 2 (1.0)
    w = mxfp4.decode(packed, torch.tensor([[127]], dtype=torch.uint8))
    assert w[0, 0] == 0.5 and w[0, 1] == 1.0  # even k from the low nibble
    assert torch.isnan(mxfp4.decode(packed, torch.tensor([[255]], dtype=torch.uint8))).all()


def test_bfloat16_decode_is_the_float32_decode():
    rng = np.random.default_rng(1)
    packed = torch.from_numpy(rng.integers(0, 256, size=(8, 64), dtype=np.uint8))
    scale = torch.from_numpy(rng.integers(100, 150, size=(8, 4), dtype=np.uint8))
    f32 = mxfp4.decode(packed, scale)
    assert torch.equal(mxfp4.decode(packed, scale, torch.bfloat16).float(), f32)  # two significant bits: exact


def test_encode_then_decode_is_exact_on_representable_values():
    rng = np.random.default_rng(2)
    packed = rng.integers(0, 256, size=(40, 64), dtype=np.uint8)
    scale = rng.integers(1, 250, size=(40, 4), dtype=np.uint8)
    scale[:4] = 0  # groups at the bottom of the scale range
    w = torch.from_numpy(reference_decode(packed, scale))
    p2, s2 = mxfp4.encode(w)
    assert p2.dtype == s2.dtype == torch.uint8 and p2.shape == (40, 64) and s2.shape == (40, 4)
    assert np.array_equal(bits(mxfp4.decode(p2, s2).numpy()), bits(w.numpy()))


def test_encode_rounds_to_the_nearest_value_of_the_group_grid():
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(16, 96, generator=gen) * torch.logspace(-3, 3, 16)[:, None]
    packed, scale = mxfp4.encode(w)
    got = mxfp4.decode(packed, scale).double()
    # the group's grid: E2M1 magnitudes times 2^(floor(log2 amax) - 2), from the definition
    groups = w.double().reshape(16, 3, 32)
    step = torch.exp2(torch.floor(torch.log2(groups.abs().amax(-1))) - 2)
    grid = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=torch.float64)
    cand = torch.cat([grid, -grid])[None, None, None, :] * step[..., None, None]  # [16, 3, 1, 16]
    best = (groups[..., None] - cand).abs().min(-1).values
    assert torch.allclose((got.reshape(16, 3, 32) - groups).abs(), best, rtol=0, atol=1e-12)


@pytest.mark.parametrize("bad", [torch.ones(4, 31), torch.tensor([[float("nan")] * 32]), torch.ones(2, 32).long()])
def test_encode_refuses_what_it_cannot_encode(bad):
    with pytest.raises(ValueError, match="mxfp4"):
        mxfp4.encode(bad)


def test_decode_refuses_mismatched_scales():
    with pytest.raises(ValueError, match="scale"):
        mxfp4.decode(torch.zeros(2, 16, dtype=torch.uint8), torch.zeros(2, 2, dtype=torch.uint8))
    with pytest.raises(ValueError, match="uint8"):
        mxfp4.decode(torch.zeros(2, 16, dtype=torch.int32), torch.zeros(2, 1, dtype=torch.uint8))
