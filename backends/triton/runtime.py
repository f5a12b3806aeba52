"""What generated Triton modules call besides the kernel templates: the launcher of the
generated elementwise kernels, and the recurrent-op entry points.

Importing this module imports k3c.kernels.common.triton first, which decides the mode
(TRITON_INTERPRET=1 on a machine without CUDA) before any kernel is decorated.
"""

from __future__ import annotations

import torch

from ...kernels.common.triton import DEVICE, INTERPRET
from ...kernels.kda.triton import fused_recurrent

import triton  # isort: skip  (after common.triton has chosen the mode)



def elementwise(kernel, shape: tuple, dtype: torch.dtype, *inputs: torch.Tensor) -> torch.Tensor:
    """Launch a generated elementwise kernel whose inputs all have the result's shape:
    kernel(x0 .. xm-1, y, n, BLOCK) over the flat offsets of contiguous tensors."""
    out, n = _result(shape, dtype, inputs)
    if n:
        args = [x.contiguous() for x in inputs]
        BLOCK = _block(n)
        kernel[(triton.cdiv(n, BLOCK),)](*args, out, n, BLOCK=BLOCK)
    return out


def broadcast(kernel, shape: tuple, dtype: torch.dtype, *inputs: torch.Tensor) -> torch.Tensor:
    """Launch a generated elementwise kernel with broadcast inputs:
    kernel(x0 .. xm-1, y, n, S0 .. Sr-1, s0_0 .. sm-1_r-1, BLOCK) with the result's sizes and
    each input's strides once broadcast to the result (0 along a broadcast dim; same-shape
    inputs are read at the flat offset and made contiguous)."""
    out, n = _result(shape, dtype, inputs)
    if n:
        args, strides = [], []
        for x in inputs:
            if tuple(x.shape) == out.shape and not x.is_contiguous():
                x = x.contiguous()
            strides.extend(x.expand(out.shape).stride())
            args.append(x)
        BLOCK = _block(n)
        kernel[(triton.cdiv(n, BLOCK),)](*args, out, n, *out.shape, *strides, BLOCK=BLOCK)
    return out


def _result(shape: tuple, dtype: torch.dtype, inputs) -> tuple[torch.Tensor, int]:
    device = inputs[0].device if inputs else torch.device(DEVICE)
    out = torch.empty(tuple(int(s) for s in shape), dtype=dtype, device=device)
    return out, out.numel()


def _block(n: int) -> int:
    """Elements per program: 1024 on the GPU; under the interpreter as many as possible
    (its cost is per operation, not per element)."""
    return min(triton.next_power_of_2(n), 1 << 16) if INTERPRET else 1024


# The recurrent ops run token by token: a prefill reaches this backend already rewritten into
# the chunk pieces by the chunk-delta-rule pass (the one place the prefill form is decided).

def kda(q, k, v, g, beta, state, scale):
    """The IR op `kda`: the fused recurrent kernel (g [B, T, H, K])."""
    return fused_recurrent(q, k, v, g, beta, scale, state)


def gated_delta_rule(q, k, v, g, beta, state, scale):
    """The IR op `gated_delta_rule`: the fused recurrent kernel (g [B, T, H])."""
    return fused_recurrent(q, k, v, g, beta, scale, state)


def delta_rule(q, k, v, beta, state, scale):
    """The IR op `delta_rule`: the fused recurrent kernel without decay."""
    return fused_recurrent(q, k, v, None, beta, scale, state)


def linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: torch.Tensor, z: torch.Tensor,
                     scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The IR op `linear_attention`: the normaliser z rides along as an all-ones value column,
    so S and z share one recurrence (no beta, no delta correction); o = (q S) / (q z)."""
    V = v.shape[-1]
    v1 = torch.cat([v.float(), v.new_ones(*v.shape[:-1], 1, dtype=torch.float32)], dim=-1)
    S1 = torch.cat([state.float(), z.float()[..., None]], dim=-1)
    o1, S1 = fused_recurrent(q, k, v1, None, None, scale, S1, out_dtype=torch.float32)
    o = (o1[..., :V] / o1[..., V:]).to(v.dtype)
    return o, S1[..., :V].contiguous(), S1[..., V].contiguous()
