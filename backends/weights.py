"""Weights as a backend writes them: one tensor per name, none sharing memory with another.

A graph may hold two weights that are views of one tensor (a layer called twice with tied
weights, or two folded constants cut from one): safetensors refuses to store tensors that
share memory, so each such weight is written as its own copy.
"""

from __future__ import annotations

import torch

from ..ir import Graph


def unshared(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`weights` with every tensor that shares storage with an earlier one replaced by a copy."""
    seen: set[int] = set()
    out = {}
    for name, t in weights.items():
        if t.is_meta:
            out[name] = t
            continue
        key = t.untyped_storage().data_ptr()
        out[name] = t.detach().clone().contiguous() if key in seen else t
        seen.add(key)
    return out


def unshare_weights(graph: Graph) -> Graph:
    """`graph` itself when no two weights share memory, else a copy whose weights do not."""
    weights = unshared(graph.weights)
    if all(weights[k] is graph.weights[k] for k in weights):
        return graph
    g = graph.copy()
    g.weights = weights
    return g
