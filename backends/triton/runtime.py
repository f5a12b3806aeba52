"""What generated Triton modules call besides the kernel templates: the launchers of the
generated elementwise kernels. (A recurrent delta-family op calls the family's kernel,
k3c.kernels.delta.triton.recurrent, told its gate kind.)

Importing this module imports k3c.kernels.common.triton first, which decides the mode
(TRITON_INTERPRET=1 on a machine without CUDA) before any kernel is decorated.
"""

from __future__ import annotations

import torch

from ...kernels.common.triton import DEVICE, INTERPRET

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
