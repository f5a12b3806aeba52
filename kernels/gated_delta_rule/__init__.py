"""The gated delta rule (Gated DeltaNet): one decay per head (see README.md)."""

from __future__ import annotations

import torch

from ..exporting import exporting, scale_of, start_state
from ..validate import check_delta_rule, nothing_to_compute
from .naive import naive_recurrent_gated_delta_rule


def gated_delta_rule(
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
    """g [B, T, H]; otherwise as `k3c.kernels.kda`."""
    check_delta_rule("gated_delta_rule", q, k, v, g, beta, initial_state, scale, chunk_size, gate="head")
    if exporting():  # one k3c.gated_delta_rule node, T left dynamic (kernels/exporting.py)
        return torch.ops.k3c.gated_delta_rule(q, k, v, g, beta, start_state(q, v, initial_state), scale_of(q, scale))
    if chunk_size is None or nothing_to_compute(q):
        return naive_recurrent_gated_delta_rule(q, k, v, g, beta, scale, initial_state)
    from ..delta.chunk import chunk_delta  # the family's chunked form, for this gate kind

    return chunk_delta(q, k, v, g, beta, gate="head", scale=scale, initial_state=initial_state,
                       chunk_size=chunk_size)


__all__ = ["gated_delta_rule", "naive_recurrent_gated_delta_rule"]
