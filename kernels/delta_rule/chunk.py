"""The delta rule in the chunked (WY/UT) form: the shared pieces of `k3c.kernels.delta.chunk`
with no gate (G = 0, so nothing decays). See README.md."""

from __future__ import annotations

import torch

from ..delta.chunk import DEFAULT_CHUNK_SIZE, chunk_delta


def chunk_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """As `chunk_kda` without g. Equals `naive_recurrent_delta_rule`."""
    return chunk_delta(q, k, v, None, beta, gate="none", scale=scale, initial_state=initial_state,
                       chunk_size=chunk_size)
