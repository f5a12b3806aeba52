"""The definition of the sparse MoE pieces: sigmoid routing and the routed expert GEMMs.

Routing with a bias correction (DeepSeek-V3 / Kimi): select by biased scores, weight by
unbiased ones. The expert GEMMs take the top-k indices, so every shape is static.

    s   = sigmoid(logits)                         logits [N, E] fp32
    idx = topk(s + bias, k)                       [N, k]
    w   = s[idx] / (sum s[idx] + 1e-20) * scale   [N, k]
    gu[n, j]  = w13[idx[n, j]] @ h[n]             w13 [E, 2I, D] (gate rows first)
    y[n]      = sum_j w[n, j] * w2[idx[n, j]] @ a[n, j]     w2 [E, D, I], fp32 accumulate
"""

from __future__ import annotations

import torch

from ..topk import topk


def route(
    logits: torch.Tensor, bias: torch.Tensor, top_k: int, scaling: float, renormalize: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (idx [N, k] int64, weights [N, k] fp32)."""
    s = torch.sigmoid(logits.float())
    idx = topk(s + bias.float(), top_k, -1)[1]
    w = s.gather(-1, idx)
    if renormalize:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return idx, w * scaling


def moe_gate_up(h: torch.Tensor, w13: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """h [N, D], w13 [E, 2I, D], idx [N, k] -> [N, k, 2I]: each (token, slot) through its expert."""
    N, k = idx.shape
    out = h.new_zeros(N, k, w13.shape[1])
    for e in torch.unique(idx).tolist():
        n, j = (idx == e).nonzero(as_tuple=True)
        out[n, j] = h[n] @ w13[e].t()
    return out


def moe_down(a: torch.Tensor, w2: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """a [N, k, I], w2 [E, D, I], idx [N, k], w [N, k] -> y [N, D] = sum_j w_j * expert_j(a_j)."""
    N, k = idx.shape
    y = torch.zeros(N, w2.shape[1], dtype=torch.float32, device=a.device)
    for e in torch.unique(idx).tolist():
        n, j = (idx == e).nonzero(as_tuple=True)
        y.index_add_(0, n, w[n, j, None].float() * (a[n, j].float() @ w2[e].float().t()))
    return y.to(a.dtype)
