"""The definition of SiTU, the gated activation of K3 (replaces SiLU-GLU).

    a   = beta * tanh(gate / beta) * sigmoid(gate)
    up  = linear_beta * tanh(up / linear_beta)      (identity when linear_beta is None)
    out = a * up                                     computed in fp32, cast back
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def situ(
    gate: torch.Tensor, up: torch.Tensor, beta: float = 4.0, linear_beta: float | None = 25.0
) -> torch.Tensor:
    """SiTU of a gate and an up projection of the same shape [..., I]."""
    g, u = gate.float(), up.float()
    a = beta * torch.tanh(g / beta) * torch.sigmoid(g)
    if linear_beta is not None:
        u = linear_beta * torch.tanh(u / linear_beta)
    return (a * u).to(gate.dtype)


def situ_packed(x: torch.Tensor, beta: float = 4.0, linear_beta: float | None = 25.0) -> torch.Tensor:
    """SiTU of x = cat(gate, up) on the last dim, gate first: [..., 2I] -> [..., I]."""
    I = x.shape[-1] // 2
    return situ(x[..., :I], x[..., I:], beta, linear_beta)


def silu_glu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The activation SiTU replaces: silu(gate) * up."""
    return F.silu(gate) * up
