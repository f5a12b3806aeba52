"""KDA: the gated delta rule with a per-channel decay (see README.md)."""

from __future__ import annotations

import torch

from ..exporting import exporting, scale_of, start_state
from ..validate import check_delta_rule, nothing_to_compute
from .gate import kda_gate_sigmoid, kda_gate_softplus, l2norm
from .naive import naive_recurrent_kda


def kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """KDA over [B, T, H, K] inputs -> (o [B, T, H, V], final state [B, H, K, V] fp32).

    chunk_size None runs the recurrent definition; an int runs the chunked (WY/UT) form.
    """
    check_delta_rule("kda", q, k, v, g, beta, initial_state, scale, chunk_size, gate="channel")
    if exporting():  # one k3c.kda node, T left dynamic (kernels/exporting.py)
        return torch.ops.k3c.kda(q, k, v, g, beta, start_state(q, v, initial_state), scale_of(q, scale))
    if chunk_size is None or nothing_to_compute(q):
        return naive_recurrent_kda(q, k, v, g, beta, scale, initial_state)
    from .chunk import chunk_kda

    return chunk_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                     chunk_size=chunk_size)


__all__ = ["kda", "naive_recurrent_kda", "kda_gate_softplus", "kda_gate_sigmoid", "l2norm"]
