"""The definition of the Block Attention Residual mixing op (AttnRes).

V [N, B, T, d] candidates (the committed blocks, then the partial sum), a learned
pseudo-query w [d] and norm weight n [d]:

    scores = (V / sqrt(mean(V^2, -1) + eps)) . (n * w)     [N, B, T]
    out    = sum_N softmax_N(scores) * V                     raw V, fp32
"""

from __future__ import annotations

import torch


def attn_res_mix(
    V: torch.Tensor, w: torch.Tensor, n: torch.Tensor, eps: float = 1e-5
) -> torch.Tensor:
    Vf = V.float()
    keys = Vf * torch.rsqrt(Vf.pow(2).mean(-1, keepdim=True) + eps)
    scores = (keys * (n.float() * w.float().reshape(-1))).sum(-1)
    p = torch.softmax(scores, dim=0)
    return (p[..., None] * Vf).sum(0).to(V.dtype)
