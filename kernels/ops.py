"""The `torch.ops.k3c.*` ops that models call, by name: `ops.kda(q, k, v, g, beta, S, scale)`.

Each is made from its IR op spec (ir/ops/torch_ops.py): the spec holds the signature, the
shape inference the fake runs, and the eager implementation (for the delta rules, the chunked
form in prefill). This module only looks them up, so a model reads `ops.kda(...)`.
"""

from __future__ import annotations


def __getattr__(name: str):
    import torch

    from ..ir import ops as _specs  # noqa: F401  (declares the ops, which registers them)

    if name.startswith("__") or not hasattr(torch.ops.k3c, name):
        raise AttributeError(f"k3c has no torch op {name!r}")
    return getattr(torch.ops.k3c, name)
