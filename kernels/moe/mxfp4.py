"""The routed-expert GEMMs on MXFP4 weights: decode one expert at a time, then the GEMM of
`naive.py` (so the result equals the dense GEMM on the decoded weights, bit for bit).

    gu[n, j] = decode(w13_packed[e], w13_scale[e]) @ h[n]          e = idx[n, j]
    y[n]     = sum_j w[n, j] * decode(w2_packed[e], w2_scale[e]) @ a[n, j]    fp32 accumulate

w13_packed [E, 2I, D/2] / w13_scale [E, 2I, D/32] (w1 rows, then w3), w2_packed [E, D, I/2] /
w2_scale [E, D, I/32]; the layout of `kernels/mxfp4`. Only the experts some token picked are
decoded, and only one at a time: the dense weights never exist whole.

Both are also `torch.ops.k3c.moe_gate_up_mxfp4` / `moe_down_mxfp4`, made from their IR op
specs (ir/ops/quant.py), so that torch.export keeps each as one node the way it keeps
`moe_gate_up`.
"""

from __future__ import annotations

import torch

from ..mxfp4.naive import decode

Tensor = torch.Tensor


def moe_gate_up_mxfp4(h: Tensor, w13_packed: Tensor, w13_scale: Tensor, idx: Tensor) -> Tensor:
    """h [N, D], idx [N, k] -> [N, k, 2I] in h's dtype (the expert decoded to h's dtype)."""
    N, k = idx.shape
    out = h.new_zeros(N, k, w13_packed.shape[1])
    for e in torch.unique(idx).tolist():
        n, j = (idx == e).nonzero(as_tuple=True)
        out[n, j] = h[n] @ decode(w13_packed[e], w13_scale[e], h.dtype).t()
    return out


def moe_down_mxfp4(a: Tensor, w2_packed: Tensor, w2_scale: Tensor, idx: Tensor, w: Tensor) -> Tensor:
    """a [N, k, I], idx [N, k], w [N, k] -> y [N, D] in a's dtype, accumulated in fp32."""
    N, k = idx.shape
    y = torch.zeros(N, w2_packed.shape[1], dtype=torch.float32, device=a.device)
    for e in torch.unique(idx).tolist():
        n, j = (idx == e).nonzero(as_tuple=True)
        y.index_add_(0, n, w[n, j, None].float() * (a[n, j].float() @ decode(w2_packed[e], w2_scale[e]).t()))
    return y.to(a.dtype)


__all__ = ["moe_gate_up_mxfp4", "moe_down_mxfp4"]
