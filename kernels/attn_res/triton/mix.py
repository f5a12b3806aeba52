"""The Block Attention Residual mix (AttnRes) in Triton.

For each row (b, t) and the N candidates V[0..N-1] of width d:

    score_n = (V_n / sqrt(mean(V_n^2) + eps)) . (n * w);   out = sum_n softmax_n(score) V_n

One program takes BR rows and walks the candidates once with an online softmax (running
max, running sum, fp32 accumulator), so each candidate is read once.
"""

from __future__ import annotations

import torch

from ...common.triton import block, check_device, rows_per_program

import triton  # isort: skip  (after common.triton has chosen the mode)
import triton.language as tl  # isort: skip


@triton.jit
def attn_res_mix_kernel(V, w, nw, out, N, R, eps, D: tl.constexpr, BD: tl.constexpr, BR: tl.constexpr):
    o_r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    o_d = tl.arange(0, BD)
    m_r, m_d = o_r < R, o_d < D
    m = m_r[:, None] & m_d[None, :]
    b_q = (tl.load(w + o_d, mask=m_d, other=0.).to(tl.float32)
           * tl.load(nw + o_d, mask=m_d, other=0.).to(tl.float32))  # the pseudo-query times the norm weight

    b_max = tl.full([BR], float("-inf"), dtype=tl.float32)
    b_sum = tl.zeros([BR], dtype=tl.float32)
    b_acc = tl.zeros([BR, BD], dtype=tl.float32)
    for i_n in range(N):
        b_v = tl.load(V + (i_n * R + o_r[:, None]) * D + o_d[None, :], mask=m, other=0.).to(tl.float32)
        b_s = tl.sum(b_v * b_q[None, :], axis=1) * tl.rsqrt(tl.sum(b_v * b_v, axis=1) / D + eps)
        b_new = tl.maximum(b_max, b_s)
        b_old = tl.exp(b_max - b_new)  # 0 at the first candidate
        b_p = tl.exp(b_s - b_new)
        b_sum = b_sum * b_old + b_p
        b_acc = b_acc * b_old[:, None] + b_p[:, None] * b_v
        b_max = b_new
    tl.store(out + o_r[:, None] * D + o_d[None, :], (b_acc / b_sum[:, None]).to(out.dtype.element_ty), mask=m)


def attn_res_mix(V: torch.Tensor, w: torch.Tensor, n: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """V [N, ..., d] candidates, w, n [d] -> [..., d] in V's dtype (as `..naive.attn_res_mix`)."""
    check_device("attn_res_mix", V, w, n)
    d = V.shape[-1]
    w, n = w.reshape(-1), n.reshape(-1)
    if w.numel() != d or n.numel() != d:
        raise ValueError(f"attn_res_mix: w and n must have {d} elements, got {w.numel()} and {n.numel()}")
    V = V.contiguous()
    N = V.shape[0]
    R = V[0].numel() // d
    out = V.new_empty(V.shape[1:])
    BD = block(d, 1)
    BR, num_warps = rows_per_program(R, BD)  # by the width (see rms_norm): two [BR, BD] blocks live
    attn_res_mix_kernel[(triton.cdiv(R, BR),)](V, w.contiguous(), n.contiguous(), out, N, R, float(eps), D=d, BD=BD,
                                               BR=BR, num_warps=num_warps)
    return out
