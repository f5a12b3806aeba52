"""The delta-rule family's kernels, one folder, one signature per form. Each member (kda,
gated_delta_rule, delta_rule, linear_attention, or an op a user declares with
`defop(..., delta=DeltaForm(gate))`) is picked by its gate kind (ir/ops/delta_family.py);
the members' naive definitions stay in their own folders (kernels/<op>/naive.py, README.md).

    form        where            signature
    recurrent   here             recurrent(q, k, v, g, beta, *, gate, scale, initial_state)
    chunked     chunk.py         chunk_delta(q, k, v, g, beta, *, gate, scale, initial_state, chunk_size);
                                 the pieces chunk_delta_prepare(.., gate) / chunk_linear_prepare,
                                 chunk_state_scan, chunk_output (the IR's chunk_* ops)
    TVM         tvm/             recurrent.delta_recurrent(H, K, V, gate, scale, target),
                                 linear.linear_recurrent(H, K, V, scale, target), chunk.* (gate)
    Triton      triton/          recurrent(q, k, v, g, beta, state, z, *, scale, gate),
                                 chunk_prepare(q, k, v, beta, g, C, gate), chunk_state_scan, chunk_output
"""

from __future__ import annotations

import torch

from ..delta_rule.naive import naive_recurrent_delta_rule
from ..gated_delta_rule.naive import naive_recurrent_gated_delta_rule
from ..kda.naive import naive_recurrent_kda
from ..linear_attention.naive import naive_recurrent_linear_attention
from .chunk import DEFAULT_CHUNK_SIZE, chunk_delta

GATES = ("channel", "head", "none", "linear")


def recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None = None,
              beta: torch.Tensor | None = None, *, gate: str, scale: float | None = None,
              initial_state=None):
    """The recurrent definition of a member by its gate kind: g [B, T, H, K] ("channel"),
    [B, T, H] ("head") or None ("none", "linear"); beta None only for "linear", whose state
    is (S, z). Returns (o, final state) as the member's naive definition does."""
    if gate == "channel":
        return naive_recurrent_kda(q, k, v, g, beta, scale, initial_state)
    if gate == "head":
        return naive_recurrent_gated_delta_rule(q, k, v, g, beta, scale, initial_state)
    if gate == "none":
        return naive_recurrent_delta_rule(q, k, v, beta, scale, initial_state)
    if gate == "linear":
        return naive_recurrent_linear_attention(q, k, v, scale, initial_state)
    raise ValueError(f"delta gate kind must be one of {', '.join(GATES)}, got {gate!r}")


__all__ = ["recurrent", "chunk_delta", "DEFAULT_CHUNK_SIZE", "GATES"]
