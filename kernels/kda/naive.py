"""The definition of KDA (Kimi Delta Attention): the per-token recurrence, in fp32.

Shapes follow fla: q, k [B, T, H, K], v [B, T, H, V], g [B, T, H, K] (log-decay, <= 0),
beta [B, T, H], state [B, H, K, V] (fp32).
"""

from __future__ import annotations

import torch


def naive_recurrent_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-by-token KDA; returns (o [B, T, H, V] in v's dtype, final state [B, H, K, V] fp32).

    Computed in fp32, or in fp64 when an input is fp64 (then the state is fp64 too): the float64
    yardstick of a stress run must not round through fp32.

    for t:  S = exp(g_t)[:, None] * S;  S += beta_t k_t (v_t - k_t^T S)^T;  o_t = scale q_t^T S
    """
    B, T, H, K = q.shape
    V, dtype = v.shape[-1], v.dtype
    scale = K**-0.5 if scale is None else scale
    wide = torch.float64 if torch.float64 in (q.dtype, k.dtype, v.dtype, g.dtype, beta.dtype) else torch.float32
    q, k, v, g, beta = (x.to(wide) for x in (q, k, v, g, beta))
    if initial_state is None:
        S = q.new_zeros(B, H, K, V)
    else:
        S = initial_state.to(wide).clone()
    o = q.new_empty(B, T, H, V)
    for t in range(T):
        S = S * g[:, t].exp()[..., None]
        k_t = k[:, t]
        v_old = torch.einsum("bhk,bhkv->bhv", k_t, S)
        u_t = beta[:, t, :, None] * (v[:, t] - v_old)
        S = S + torch.einsum("bhk,bhv->bhkv", k_t, u_t)
        o[:, t] = scale * torch.einsum("bhk,bhkv->bhv", q[:, t], S)
    return o.to(dtype), S
