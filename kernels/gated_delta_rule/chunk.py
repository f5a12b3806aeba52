"""The gated delta rule in the chunked (WY/UT) form: the shared pieces of
`k3c.kernels.delta.chunk` with one gate per head, whose pairwise decay is a [C, C] matrix
(no per-channel [C, C, K] work). See README.md."""

from __future__ import annotations

import torch

from ..delta.chunk import DEFAULT_CHUNK_SIZE, chunk_delta


def chunk_gated_delta_rule(
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
    """g [B, T, H] (<= 0); otherwise as `chunk_kda`. Equals `naive_recurrent_gated_delta_rule`."""
    return chunk_delta(q, k, v, g, beta, gate="head", scale=scale, initial_state=initial_state,
                       chunk_size=chunk_size)
