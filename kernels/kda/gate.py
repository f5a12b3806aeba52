"""The two forms of the KDA forget gate, and the l2norm applied to q and k.

f [B, T, H, K] (f_b_proj(f_a_proj(x)) viewed per head), A_log [H], dt_bias [H*K]:
    kimi-linear:  g = -exp(A_log[h]) * softplus(f + dt_bias)               g <= 0
    k3:           g = lb * sigmoid(exp(A_log[h]) * (f + dt_bias)), lb=-5    g in [lb, 0)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def kda_gate_softplus(f: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    H, K = f.shape[-2:]
    x = f.float() + dt_bias.float().view(H, K)
    return -A_log.float().exp().view(H, 1) * F.softplus(x)


def kda_gate_sigmoid(
    f: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float = -5.0
) -> torch.Tensor:
    H, K = f.shape[-2:]
    x = f.float() + dt_bias.float().view(H, K)
    return lower_bound * torch.sigmoid(A_log.float().exp().view(H, 1) * x)


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum x^2 + eps) over the last dim, in fp32."""
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) + eps)
