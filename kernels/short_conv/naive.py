"""The definition of the causal depthwise short convolution with carried state.

x [B, T, C], weight [C, W], state [B, C, W-1] (the last W-1 inputs seen, oldest first).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def naive_short_conv(
    x: torch.Tensor,
    weight: torch.Tensor,
    state: torch.Tensor | None = None,
    activation: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """y_t[c] = sum_j weight[c, j] * x_{t - (W-1) + j}[c]; inputs before the sequence come
    from `state` (zeros when absent). Returns (y [B, T, C], new state [B, C, W-1])."""
    B, T, C = x.shape
    W = weight.shape[-1]
    if state is None:
        state = x.new_zeros(B, C, W - 1)
    xp = torch.cat([state.to(x.dtype), x.transpose(1, 2)], dim=-1)  # [B, C, W-1+T]
    windows = xp.unfold(-1, W, 1)  # [B, C, T, W]
    y = (windows.float() * weight.float()[None, :, None, :]).sum(-1).transpose(1, 2)
    if activation == "silu":
        y = F.silu(y)
    elif activation not in (None, "none"):
        raise ValueError(f"short_conv: unknown activation {activation!r} (expected 'silu' or None)")
    return y.to(x.dtype), xp[..., xp.shape[-1] - (W - 1):].contiguous()
