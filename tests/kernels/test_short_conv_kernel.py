"""short_conv: the causal depthwise convolution with carried state, against torch's conv1d."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kernel_inputs import randn

from k3c.kernels import short_conv
from k3c.numerics import assert_close

C, W = 24, 4


def conv1d_reference(x: torch.Tensor, weight: torch.Tensor, activation: str | None) -> torch.Tensor:
    """Depthwise conv1d over time, left-padded by W - 1 zeros: output t sees inputs <= t."""
    y = F.conv1d(F.pad(x.transpose(1, 2), (W - 1, 0)), weight[:, None, :], groups=C)
    y = y.transpose(1, 2)
    return F.silu(y) if activation == "silu" else y


@pytest.mark.parametrize("activation", [None, "silu"], ids=["linear", "silu"])
@pytest.mark.parametrize("T", [1, 2, 5, 17], ids=lambda t: f"T{t}")
def test_matches_conv1d(T, activation):
    x, weight = randn(2, T, C, seed=1), randn(C, W, seed=2)
    y, state = short_conv(x, weight, None, activation)
    assert_close(y, conv1d_reference(x, weight, activation), what="y")
    tail = F.pad(x.transpose(1, 2), (W - 1, 0))[..., -(W - 1):]  # the last W - 1 inputs seen
    assert torch.equal(state, tail)


@pytest.mark.parametrize("s", [1, 2, 3, 9], ids=lambda s: f"split{s}")
def test_split_resume(s):
    T = 12
    x, weight = randn(2, T, C, seed=1), randn(C, W, seed=2)
    y1, st = short_conv(x[:, :s], weight, None, "silu")
    y2, st = short_conv(x[:, s:], weight, st, "silu")
    y, st_ref = short_conv(x, weight, None, "silu")
    assert_close(torch.cat([y1, y2], dim=1), y, what="y")
    assert torch.equal(st, st_ref)


def test_unknown_activation_is_named():
    with pytest.raises(ValueError, match="gelu"):
        short_conv(randn(1, 3, C), randn(C, W), None, "gelu")
