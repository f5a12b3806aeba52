"""The causal depthwise short convolution with carried state (see naive.py)."""

from __future__ import annotations

import torch

from ..validate import check_short_conv
from .naive import naive_short_conv


def short_conv(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor | None = None,
               activation: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [B, T, C], weight [C, W], state [B, C, W-1] -> (y [B, T, C], new state [B, C, W-1])."""
    check_short_conv(x, weight, state, activation)
    return naive_short_conv(x, weight, state, activation)


__all__ = ["short_conv", "naive_short_conv"]
