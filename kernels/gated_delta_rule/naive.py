"""The definition of the gated delta rule (Gated DeltaNet): KDA with one decay per head.

Shapes: q, k [B, T, H, K], v [B, T, H, V], g [B, T, H] (log-decay, <= 0), beta [B, T, H],
state [B, H, K, V] (fp32).
"""

from __future__ import annotations

import torch

from ..kda.naive import naive_recurrent_kda


def naive_recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """S = exp(g_t) S;  S += beta_t k_t (v_t - k_t^T S)^T;  o_t = scale q_t^T S.

    The scalar gate of a head is the per-channel gate of KDA with every channel equal.
    """
    return naive_recurrent_kda(q, k, v, g[..., None].expand_as(k), beta, scale, initial_state)
