"""Row norms over the last dim in Triton: RMSNorm, optionally weighted and gated, and l2norm.

    rms_norm:  y = x / sqrt(mean(x^2) + eps) * w * sigmoid(gate)     fp32 inside, x's dtype out
    l2norm:    y = x / sqrt(sum(x^2) + eps)

One program normalises BR rows of width D (a [BR, BD] block, BD the power of two >= D).
The gated form is KDA's output norm; without the gate it is the model's RMSNorm; l2norm is
what KDA and DeltaNet apply to q and k.
"""

from __future__ import annotations

import torch

from ...common.triton import block, check_device, rows_per_program

import triton  # isort: skip  (after common.triton has chosen the mode)
import triton.language as tl  # isort: skip


@triton.jit
def rmsnorm_kernel(x, w, gate, y, R, eps, D: tl.constexpr, BD: tl.constexpr, BR: tl.constexpr,
                   HAS_W: tl.constexpr, HAS_GATE: tl.constexpr, MEAN: tl.constexpr):
    o_r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    o_d = tl.arange(0, BD)
    m_r, m_d = o_r < R, o_d < D
    m = m_r[:, None] & m_d[None, :]
    p = o_r[:, None] * D + o_d[None, :]
    b_x = tl.load(x + p, mask=m, other=0.).to(tl.float32)
    b_ss = tl.sum(b_x * b_x, axis=1)
    if MEAN:
        b_ss = b_ss / D
    b_y = b_x * tl.rsqrt(b_ss + eps)[:, None]
    if HAS_W:
        b_y = b_y * tl.load(w + o_d, mask=m_d, other=0.).to(tl.float32)[None, :]
    if HAS_GATE:
        b_y = b_y * tl.sigmoid(tl.load(gate + p, mask=m, other=0.).to(tl.float32))
    tl.store(y + p, b_y.to(y.dtype.element_ty), mask=m)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, gate: torch.Tensor | None = None,
             out_dtype: torch.dtype | None = None, mean: bool = True) -> torch.Tensor:
    """rmsnorm(x) * weight [* sigmoid(gate)] over the last dim; x, gate [..., D], weight [D].
    mean=False divides by sqrt(sum(x^2) + eps) instead (see l2norm)."""
    check_device("rms_norm", x, weight, gate)
    D = x.shape[-1]
    if weight is not None and tuple(weight.shape) != (D,):
        raise ValueError(f"rms_norm: weight must be [{D}], got {list(weight.shape)}")
    if gate is not None and gate.shape != x.shape:
        raise ValueError(f"gated rms_norm: gate {list(gate.shape)} must match x {list(x.shape)}")
    x = x.contiguous()
    y = torch.empty(x.shape, dtype=out_dtype or x.dtype, device=x.device)
    R = x.numel() // max(D, 1)
    BD = block(D, 1)
    # rows per program by the width, not autotuned: a memory-bound row kernel needs only a
    # block that fills the threads without spilling (64 rows of a 7168-wide model would not)
    BR, num_warps = rows_per_program(R, BD)
    rmsnorm_kernel[(triton.cdiv(R, BR),)](x, weight if weight is not None else x,
                                          gate.contiguous() if gate is not None else x, y, R, float(eps), D=D, BD=BD,
                                          BR=BR, HAS_W=weight is not None, HAS_GATE=gate is not None, MEAN=mean,
                                          num_warps=num_warps)
    return y


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim, as `k3c.kernels.kda.gate.l2norm` (x's dtype)."""
    return rms_norm(x, None, eps, mean=False)


def gated_rmsnorm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """KDA's output norm: rmsnorm(x) * weight * sigmoid(gate), as `..naive.gated_rmsnorm` (the
    IR op's order: x, gate, weight)."""
    return rms_norm(x, weight, eps, gate)
