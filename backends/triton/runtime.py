"""What generated Triton modules call besides the kernel templates: the launcher of the
generated elementwise kernels, and the recurrent-op entry points that choose between the
recurrent and the chunked kernels by length.

Importing this module imports k3c.kernels.common.triton first, which decides the mode
(TRITON_INTERPRET=1 on a machine without CUDA) before any kernel is decorated.
"""

from __future__ import annotations

import torch

from ...kernels.common.triton import DEVICE, INTERPRET
from ...kernels.kda.triton import chunk_output, chunk_prepare, chunk_state_scan, fused_recurrent

import triton  # isort: skip  (after common.triton has chosen the mode)

# Up to this many steps a recurrent op runs token by token (decode is T = 1); longer inputs
# run chunked: (a) intra-chunk, (b) the state scan, (c) the output.
RECURRENT_MAX_T = 16
CHUNK_SIZE = 64  # the chunk of prefill when the graph was not chunked by a pass (as eager)


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


def _gate(g: torch.Tensor | None) -> str:
    return "none" if g is None else ("head" if g.dim() == 3 else "channel")


def delta_family(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None, beta: torch.Tensor,
                 state: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """KDA (g [B, T, H, K]), the gated delta rule (g [B, T, H]) or the delta rule (g None):
    token by token up to RECURRENT_MAX_T steps, else the three chunked pieces."""
    T = q.shape[1]
    if T <= RECURRENT_MAX_T:
        return fused_recurrent(q, k, v, g, beta, scale, state)
    pieces = chunk_prepare(q, k, v, beta, g, CHUNK_SIZE, _gate(g))
    q_dec, k_dec, w, u, aqk, decay = pieces
    v_new, starts, S = chunk_state_scan(w, u, k_dec, decay, state)
    return chunk_output(q_dec, aqk, v_new, starts, scale, T, out_dtype=v.dtype), S


def kda(q, k, v, g, beta, state, scale):
    """The IR op `kda` (see delta_family)."""
    return delta_family(q, k, v, g, beta, state, scale)


def gated_delta_rule(q, k, v, g, beta, state, scale):
    """The IR op `gated_delta_rule` (see delta_family)."""
    return delta_family(q, k, v, g, beta, state, scale)


def delta_rule(q, k, v, beta, state, scale):
    """The IR op `delta_rule` (see delta_family)."""
    return delta_family(q, k, v, None, beta, state, scale)


def linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: torch.Tensor, z: torch.Tensor,
                     scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The IR op `linear_attention`: the normaliser z rides along as an all-ones value column,
    so S and z share one recurrence (no beta, no delta correction); o = (q S) / (q z)."""
    T, V = q.shape[1], v.shape[-1]
    v1 = torch.cat([v.float(), v.new_ones(*v.shape[:-1], 1, dtype=torch.float32)], dim=-1)
    S1 = torch.cat([state.float(), z.float()[..., None]], dim=-1)
    if T <= RECURRENT_MAX_T:
        o1, S1 = fused_recurrent(q, k, v1, None, None, scale, S1, out_dtype=torch.float32)
    else:
        q_dec, k_dec, w, u, aqk, decay = chunk_prepare(q, k, v1, None, None, CHUNK_SIZE, "linear")
        v_new, starts, S1 = chunk_state_scan(w, u, k_dec, decay, S1)
        o1 = chunk_output(q_dec, aqk, v_new, starts, scale, T)
    o = (o1[..., :V] / o1[..., V:]).to(v.dtype)
    return o, S1[..., :V].contiguous(), S1[..., V].contiguous()
