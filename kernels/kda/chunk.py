"""KDA in the chunked (WY/UT) form: the shared pieces of `k3c.kernels.delta.chunk` with a
per-channel gate. See README.md for the math and which function is which piece."""

from __future__ import annotations

import torch

from ..delta.chunk import DEFAULT_CHUNK_SIZE, chunk_delta


def chunk_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k [B, T, H, K], v [B, T, H, V], g [B, T, H, K] (<= 0), beta [B, T, H], state
    [B, H, K, V] -> (o [B, T, H, V] in v's dtype, final state [B, H, K, V] fp32).

    Equals `naive_recurrent_kda`; any T (padded to a multiple of chunk_size inside).
    """
    return chunk_delta(q, k, v, g, beta, gate="channel", scale=scale, initial_state=initial_state,
                       chunk_size=chunk_size)
