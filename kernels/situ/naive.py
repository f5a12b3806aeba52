"""The definition of SiTU, the gated activation of K3 (replaces SiLU-GLU).

    a   = beta * tanh(gate / beta) * sigmoid(gate)
    up  = linear_beta * tanh(up / linear_beta)      (identity when linear_beta is None)
    out = a * up                                     computed in fp32, cast back
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# K3's SiTU(4, 25): the defaults of every SiTU in k3c (kernels, IR ops, models).
BETA = 4.0
LINEAR_BETA = 25.0
ACTIVATIONS = ("situ", "silu")  # the gated activations: SiTU, and the SiLU-GLU it replaces


def situ(
    gate: torch.Tensor, up: torch.Tensor, beta: float = BETA, linear_beta: float | None = LINEAR_BETA
) -> torch.Tensor:
    """SiTU of a gate and an up projection of the same shape [..., I]."""
    g, u = gate.float(), up.float()
    a = beta * torch.tanh(g / beta) * torch.sigmoid(g)
    if linear_beta is not None:
        u = linear_beta * torch.tanh(u / linear_beta)
    return (a * u).to(gate.dtype)


def situ_packed(x: torch.Tensor, beta: float = BETA, linear_beta: float | None = LINEAR_BETA) -> torch.Tensor:
    """SiTU of x = cat(gate, up) on the last dim, gate first: [..., 2I] -> [..., I]."""
    I = x.shape[-1] // 2
    return situ(x[..., :I], x[..., I:], beta, linear_beta)


def silu_glu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The activation SiTU replaces: silu(gate) * up."""
    return F.silu(gate) * up


def activation(gate: torch.Tensor, up: torch.Tensor, act: str, beta: float = BETA,
               linear_beta: float | None = LINEAR_BETA) -> torch.Tensor:
    """The gated activation `act` (one of ACTIVATIONS) of a gate and an up projection."""
    if act == "situ":
        return situ(gate, up, beta, linear_beta)
    if act == "silu":
        return silu_glu(gate, up)
    raise ValueError(f"unknown gated activation {act!r}; known: {', '.join(ACTIVATIONS)}")
