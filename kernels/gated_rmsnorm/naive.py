"""The definition of the gated RMSNorm at the output of KDA.

o [..., V], gate [..., V], weight [V]:  rmsnorm(o) * weight * sigmoid(gate), in fp32, in the
order of the IR op `gated_rms_norm(x, gate, w)`, whose reference this is.
"""

from __future__ import annotations

import torch


def gated_rmsnorm(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5
) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return (y * torch.sigmoid(gate.float())).to(x.dtype)
