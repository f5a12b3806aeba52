"""Top-k with a defined order: the k largest along a dim, sorted, ties broken by the lower index.

torch.topk leaves the order of equal values open; ONNX's TopK and TVM's topk put the lower
index first. Routing reads the indices (which experts a token goes to), so an exact tie must
pick the same experts on every backend: this is the definition all of them follow.
"""

from __future__ import annotations

import torch


def topk(x: torch.Tensor, k: int, dim: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) of the k largest entries of `x` along `dim`, largest first; among equal
    values the lower index comes first (a stable descending sort, cut to k)."""
    values, indices = torch.sort(x, dim=dim, descending=True, stable=True)
    return values.narrow(dim, 0, k).contiguous(), indices.narrow(dim, 0, k).contiguous()
