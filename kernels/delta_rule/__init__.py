"""The delta rule (DeltaNet): no decay (see README.md)."""

from __future__ import annotations

import torch

from ..exporting import exporting, scale_of, start_state
from ..validate import check_delta_rule, nothing_to_compute
from .naive import naive_recurrent_delta_rule


def delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """As `k3c.kernels.kda` without a gate."""
    check_delta_rule("delta_rule", q, k, v, None, beta, initial_state, scale, chunk_size, gate=None)
    if exporting():  # one k3c.delta_rule node, T left dynamic (kernels/exporting.py)
        return torch.ops.k3c.delta_rule(q, k, v, beta, start_state(q, v, initial_state), scale_of(q, scale))
    if chunk_size is None or nothing_to_compute(q):
        return naive_recurrent_delta_rule(q, k, v, beta, scale, initial_state)
    from ..delta.chunk import chunk_delta  # the family's chunked form, for this gate kind

    return chunk_delta(q, k, v, None, beta, gate="none", scale=scale, initial_state=initial_state,
                       chunk_size=chunk_size)


__all__ = ["delta_rule", "naive_recurrent_delta_rule"]
