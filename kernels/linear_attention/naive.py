"""The definition of normalised linear attention (Katharopoulos et al. 2020).

The feature map (elu + 1) is applied by the caller; this op sees phi(q), phi(k) > 0.
Shapes: q, k [B, T, H, K], v [B, T, H, V]; state S [B, H, K, V] and normaliser z [B, H, K],
both fp32.
"""

from __future__ import annotations

import torch


def naive_recurrent_linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None = None,
    initial_state: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """for t:  S += k_t v_t^T;  z += k_t;  o_t = (q_t^T S) / (q_t^T z).

    `scale` multiplies q and cancels in the ratio; it is accepted so that every op of the
    family has the same signature. Returns (o, (S, z)).
    """
    B, T, H, K = q.shape
    V, dtype = v.shape[-1], v.dtype
    scale = K**-0.5 if scale is None else scale
    wide = torch.float64 if q.dtype == torch.float64 else torch.float32  # fp64 stays fp64
    q, k, v = (x.to(wide) for x in (q, k, v))
    if initial_state is None:
        S, z = q.new_zeros(B, H, K, V), q.new_zeros(B, H, K)
    else:
        S, z = (x.to(wide).clone() for x in initial_state)
    o = q.new_empty(B, T, H, V)
    for t in range(T):
        S = S + torch.einsum("bhk,bhv->bhkv", k[:, t], v[:, t])
        z = z + k[:, t]
        q_t = scale * q[:, t]
        num = torch.einsum("bhk,bhkv->bhv", q_t, S)
        den = torch.einsum("bhk,bhk->bh", q_t, z)
        o[:, t] = num / den[..., None]
    return o.to(dtype), (S, z)
