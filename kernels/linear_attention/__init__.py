"""Normalised linear attention (see README.md)."""

from __future__ import annotations

import torch

from ..validate import check_linear_attention, nothing_to_compute
from .naive import naive_recurrent_linear_attention


def linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: tuple[torch.Tensor, torch.Tensor] | None = None,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """q, k are feature-mapped (> 0). Returns (o, (S [B, H, K, V], z [B, H, K]))."""
    check_linear_attention(q, k, v, initial_state, scale, chunk_size)
    if chunk_size is None or nothing_to_compute(q):
        return naive_recurrent_linear_attention(q, k, v, scale, initial_state)
    from .chunk import chunk_linear_attention

    return chunk_linear_attention(q, k, v, scale=scale, initial_state=initial_state,
                                  chunk_size=chunk_size)


__all__ = ["linear_attention", "naive_recurrent_linear_attention"]
