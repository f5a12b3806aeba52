"""The definition of the delta rule (DeltaNet): KDA without decay.

Shapes: q, k [B, T, H, K], v [B, T, H, V], beta [B, T, H], state [B, H, K, V] (fp32).
"""

from __future__ import annotations

import torch

from ..kda.naive import naive_recurrent_kda


def naive_recurrent_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """S += beta_t k_t (v_t - k_t^T S)^T;  o_t = scale q_t^T S  (gate g = 0 everywhere)."""
    return naive_recurrent_kda(q, k, v, torch.zeros_like(k), beta, scale, initial_state)
