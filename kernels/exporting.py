"""The public recurrent kernels under torch.export: one `torch.ops.k3c` node each.

`k3c.kernels.kda(...)` and its siblings run a Python loop over T (or over chunks) eagerly;
traced by torch.export that loop unrolls, pins T and leaves dozens of copy/slice nodes the
frontend does not take. While an export traces, they call their custom op instead (the op a
zoo model calls, with its state made explicit), so a user's module that calls the public
kernel is captured as one `kda` node with a dynamic T, exactly as a zoo layer is.
"""

from __future__ import annotations

import torch


def exporting() -> bool:
    """Whether torch.export (or torch.compile) is tracing the caller."""
    return torch.compiler.is_exporting() or torch.compiler.is_compiling()


def start_state(q: torch.Tensor, v: torch.Tensor, initial_state: torch.Tensor | None) -> torch.Tensor:
    """The initial state the op takes: the given one, or zeros [B, H, K, V] in float32 (the
    definitions' state dtype)."""
    if initial_state is not None:
        return initial_state
    B, _, H, K = q.shape
    return q.new_zeros(B, H, K, v.shape[-1], dtype=torch.float32)


def scale_of(q: torch.Tensor, scale: float | None) -> float:
    return q.shape[-1] ** -0.5 if scale is None else float(scale)
