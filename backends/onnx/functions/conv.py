"""Bodies of the causal depthwise short convolution with carried state: `short_conv` and
`short_conv_silu` (the IR's short_conv with activation "none" / "silu").

    xp = [state ++ x^T]                       [B, C, W-1+T], channels first
    y = Conv(xp, w[:, None, :], group = C)    the standard depthwise Conv, [B, C, T] -> [B, T, C]
    state_out = the last W-1 columns of xp    [B, C, W-1]

C is the node's `channels` attribute (a Conv's group is an attribute, not a tensor; the
lowering writes the weight's static C). The Conv replaced a Gather of the T windows of xp
([B, T, W, C], a copy W times the input's size) multiplied and summed: at T = 1024, C = 512,
W = 4 a quarter of a user's KDA layer's time in onnxruntime's profile.
"""

from __future__ import annotations

from ..builder import INT64_MAX, Builder
from . import function


def short_conv(b: Builder, x: str, w: str, state: str, channels, silu: bool) -> list[str]:
    xp = b.Concat(state, b.Transpose(x, perm=[0, 2, 1]), axis=2)  # [B, C, W-1+T]
    y = b.Transpose(b.Conv(xp, b.unsqueeze(w, 1), group=channels), perm=[0, 2, 1])  # [B, T, C]
    if silu:
        y = b.Mul(y, b.Sigmoid(y))
    tail = b.Slice(xp, b.shape_of(x, 1), b.ints([INT64_MAX]), b.ints([2]))  # xp[..., T:], the last W-1
    return [y, tail]


@function("short_conv", "x w state", "y state_out", {"channels": "int"})
def _short_conv(b, x, w, state, channels):
    """Causal depthwise conv over [state ++ x], x [B, T, C], w [C, W], state [B, C, W-1]."""
    return short_conv(b, x, w, state, channels, silu=False)


@function("short_conv_silu", "x w state", "y state_out", {"channels": "int"})
def _short_conv_silu(b, x, w, state, channels):
    """short_conv followed by silu (the KDA and DeltaNet q/k/v convs)."""
    return short_conv(b, x, w, state, channels, silu=True)
