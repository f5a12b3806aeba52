"""The definition of causal softmax attention with a cache (bottom-right aligned mask).

q [B, T, H, D], k [B, S, H, D], v [B, S, H, Dv] with S >= T: the queries are the last T
positions of the S keys, so query t sees keys 0 .. S - T + t.
"""

from __future__ import annotations

import torch


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None
) -> torch.Tensor:
    """Returns o [B, T, H, Dv] in v's dtype; scores and softmax in fp32."""
    T, S, D = q.shape[1], k.shape[1], q.shape[-1]
    scale = D**-0.5 if scale is None else scale
    scores = torch.einsum("bthd,bshd->bhts", q.float(), k.float()) * scale
    t = torch.arange(T, device=q.device)[:, None]
    s = torch.arange(S, device=q.device)[None, :]
    scores = scores.masked_fill(s > t + (S - T), float("-inf"))
    p = torch.softmax(scores, dim=-1)
    return torch.einsum("bhts,bshv->bthv", p, v.float()).to(v.dtype)
