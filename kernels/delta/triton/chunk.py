"""Chunked KDA (and the rest of the delta family) in Triton: pieces (a), (b), (c) in a row.

The same split as `k3c.kernels.delta.chunk` and the IR ops `chunk_prepare`,
`chunk_state_scan`, `chunk_output`: a graph the chunk-delta-rule pass has rewritten calls
the pieces one by one; `chunk_delta` runs them in a row (tests, benchmarks).
"""

from __future__ import annotations

import torch

from ..chunk import DEFAULT_CHUNK_SIZE
from .intra import chunk_prepare
from .output import chunk_output
from .scan import chunk_state_scan


def chunk_delta(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None,
                beta: torch.Tensor, *, gate: str, scale: float | None = None,
                initial_state: torch.Tensor | None = None,
                chunk_size: int = DEFAULT_CHUNK_SIZE) -> tuple[torch.Tensor, torch.Tensor]:
    """g [B, T, H, K] (gate "channel": KDA), [B, T, H] ("head") or None ("none").
    Returns (o [B, T, H, V] in v's dtype, final state [B, H, K, V] fp32)."""
    T, K = q.shape[1], q.shape[-1]
    scale = K**-0.5 if scale is None else scale
    q_dec, k_dec, w, u, aqk, decay = chunk_prepare(q, k, v, beta, g, chunk_size, gate)
    v_new, starts, S = chunk_state_scan(w, u, k_dec, decay, initial_state)
    return chunk_output(q_dec, aqk, v_new, starts, scale, T, out_dtype=v.dtype), S


def chunk_kda(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *,
              scale: float | None = None, initial_state: torch.Tensor | None = None,
              chunk_size: int = DEFAULT_CHUNK_SIZE) -> tuple[torch.Tensor, torch.Tensor]:
    """KDA: q, k [B, T, H, K], v [B, T, H, V], g [B, T, H, K] (<= 0), beta [B, T, H]."""
    return chunk_delta(q, k, v, g, beta, gate="channel", scale=scale, initial_state=initial_state,
                       chunk_size=chunk_size)
