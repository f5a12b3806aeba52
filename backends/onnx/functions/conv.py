"""Bodies of the causal depthwise short convolution with carried state: `short_conv` and
`short_conv_silu` (the IR's short_conv with activation "none" / "silu").

    xp = [state^T ++ x]                       [B, W-1+T, C]
    y_t = sum_j w[:, j] * xp[t + j]           a Gather of the T windows, no static sizes
    state_out = the last W-1 rows of xp, as [B, C, W-1]
"""

from __future__ import annotations

from ..builder import INT64_MAX, Builder
from . import function


def short_conv(b: Builder, x: str, w: str, state: str, silu: bool) -> list[str]:
    xp = b.Concat(b.Transpose(state, perm=[0, 2, 1]), x, axis=1)  # [B, W-1+T, C]
    T, W = b.shape_of(x, 1), b.shape_of(w, 1)
    zero, one = b.const(0, "i64"), b.const(1, "i64")
    t = b.unsqueeze(b.Range(zero, b.squeeze(T, 0), one), 1)
    j = b.unsqueeze(b.Range(zero, b.squeeze(W, 0), one), 0)
    windows = b.Gather(xp, b.Add(t, j), axis=1)  # [B, T, W, C]
    y = b.ReduceSum(b.Mul(windows, b.Transpose(w, perm=[1, 0])), b.ints([2]), keepdims=0)
    if silu:
        y = b.Mul(y, b.Sigmoid(y))
    tail = b.Slice(xp, T, b.ints([INT64_MAX]), b.ints([1]))  # xp[T:], the last W-1 rows
    return [y, b.Transpose(tail, perm=[0, 2, 1])]


@function("short_conv", "x w state", "y state_out")
def _short_conv(b, x, w, state):
    """Causal depthwise conv over [state ++ x], x [B, T, C], w [C, W], state [B, C, W-1]."""
    return short_conv(b, x, w, state, silu=False)


@function("short_conv_silu", "x w state", "y state_out")
def _short_conv_silu(b, x, w, state):
    """short_conv followed by silu (the KDA and DeltaNet q/k/v convs)."""
    return short_conv(b, x, w, state, silu=True)
