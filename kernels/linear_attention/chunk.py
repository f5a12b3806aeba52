"""Normalised linear attention in chunked form: no WY transform (A = I, beta = 1, nothing
subtracted), the normaliser z carried as an extra all-ones value column, so S and z share
one scan. Uses the pieces of `k3c.kernels.delta.chunk`; see README.md."""

from __future__ import annotations

import torch

from ..delta.chunk import DEFAULT_CHUNK_SIZE, chunk_linear_prepare, chunk_output, chunk_state_scan


def chunk_linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: tuple[torch.Tensor, torch.Tensor] | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """phi(q), phi(k) [B, T, H, K] (> 0), v [B, T, H, V], state (S [B, H, K, V], z [B, H, K])
    -> (o [B, T, H, V] in v's dtype, (S, z) fp32). Equals `naive_recurrent_linear_attention`.
    """
    T, K, V = q.shape[1], q.shape[-1], v.shape[-1]
    scale = K**-0.5 if scale is None else scale
    v1 = torch.cat([v.float(), v.new_ones(*v.shape[:-1], 1, dtype=torch.float32)], dim=-1)
    S1 = None
    if initial_state is not None:
        S, z = initial_state
        S1 = torch.cat([S.float(), z.float()[..., None]], dim=-1)  # [B, H, K, V + 1]
    p = chunk_linear_prepare(q, k, v1, chunk_size)
    v_new, starts, S1 = chunk_state_scan(p.w, p.u, p.k_decayed, p.decay_last, S1)
    o1 = chunk_output(p.q_decayed, p.aqk, v_new, starts, scale, T)  # [B, T, H, V + 1]
    o = o1[..., :V] / o1[..., V:]
    return o.to(v.dtype), (S1[..., :V].contiguous(), S1[..., V].contiguous())
