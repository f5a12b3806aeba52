"""SiTU in Triton: the activation as a device function, the standalone elementwise kernel
(the IR op `situ`) and the gate/up GEMM with SiTU (or SiLU-GLU) fused into its epilogue
(the IR op `gated_mlp`).

    a = beta tanh(gate / beta) sigmoid(gate);  up = linear_beta tanh(up / linear_beta);  out = a up

The gated GEMM keeps two fp32 accumulators, x W_gate^T and x W_up^T, for one [BM, BN] tile
of the output and applies the activation before the only store: the [M, 2I] GEMM result
never reaches memory.
"""

from __future__ import annotations

import torch

from ...common.triton import ByRows, autotune, check_device, dot_precision, dots_in_fp32, prune_rows
from ..naive import ACTIVATIONS, BETA, LINEAR_BETA

import triton  # isort: skip  (after common.triton has chosen the mode)
import triton.language as tl  # isort: skip


@triton.jit
def tanh(x):
    """tanh to fp32 accuracy: (1 - e) / (1 + e) with e = exp(-2|x|) (never overflows), and for
    |x| < 0.3, where 1 - e would cancel, its odd Taylor series to x^9 (error < 1e-7 relative)."""
    a = tl.abs(x)
    e = tl.exp(-2. * a)
    big = (1. - e) / (1. + e)
    x2 = a * a
    small = a * (1. + x2 * (-1. / 3 + x2 * (2. / 15 + x2 * (-17. / 315 + x2 * (62. / 2835)))))
    return tl.where(x < 0, -1., 1.) * tl.where(a < 0.3, small, big)


@triton.jit
def gated_act(b_gate, b_up, beta, linear_beta, ACT: tl.constexpr, LINEAR_TANH: tl.constexpr):
    """ACT 0: SiTU(beta, linear_beta); ACT 1: SiLU-GLU. fp32 in, fp32 out."""
    if ACT == 0:
        b_a = beta * tanh(b_gate / beta) * tl.sigmoid(b_gate)
        if LINEAR_TANH:
            b_up = linear_beta * tanh(b_up / linear_beta)
    else:
        b_a = b_gate * tl.sigmoid(b_gate)
    return b_a * b_up


ACT_IDS = {act: i for i, act in enumerate(ACTIVATIONS)}  # "situ": 0, "silu": 1 (the kernels' ACT)


@autotune(configs=[triton.Config({"BLOCK": 4096}, num_warps=4), triton.Config({"BLOCK": 1024}, num_warps=4)],
          key=["I"])
@triton.jit
def situ_kernel(gate, up, out, n, I, s_gate, s_up, beta, linear_beta, ACT: tl.constexpr, LINEAR_TANH: tl.constexpr,
                BLOCK: tl.constexpr):
    o = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    o_row, o_col = o // I, o % I
    b_g = tl.load(gate + o_row * s_gate + o_col, mask=m, other=0.).to(tl.float32)
    b_u = tl.load(up + o_row * s_up + o_col, mask=m, other=0.).to(tl.float32)
    tl.store(out + o, gated_act(b_g, b_u, beta, linear_beta, ACT, LINEAR_TANH).to(out.dtype.element_ty), mask=m)


def situ(gate: torch.Tensor, up: torch.Tensor, beta: float = BETA, linear_beta: float | None = LINEAR_BETA,
         act: str = "situ") -> torch.Tensor:
    """The IR op `situ` (act "situ") or SiLU-GLU (act "silu") of gate, up [..., I] -> [..., I].
    Rows may be strided (gate and up may be the two halves of one GEMM output)."""
    check_device("situ", gate, up)
    if gate.shape != up.shape:
        raise ValueError(f"situ: gate {list(gate.shape)} and up {list(up.shape)} must match")
    I = gate.shape[-1]
    gate2, up2 = gate.reshape(-1, I), up.reshape(-1, I)
    if gate2.stride(-1) != 1 or up2.stride(-1) != 1:
        gate2, up2 = gate2.contiguous(), up2.contiguous()
    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    n = out.numel()
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK"]),)
    situ_kernel[grid](gate2, up2, out, n, I, gate2.stride(0), up2.stride(0), float(beta),
                      float(linear_beta or 1.0), ACT=ACT_IDS[act], LINEAR_TANH=linear_beta is not None)
    return out


# Two fp32 accumulators and the activation's epilogue live in registers at once: a 128 x 128
# tile of both (128 values a thread at 8 warps) spilled on sm_90, so the tiles stop at
# 128 x 64 / 64 x 128 with 8 warps, and fp32 operands (3xTF32) take the 2048-output tiles
# (tile_fits). Decode (M = 1) keeps the 16-row tile only (prune_rows).
@autotune(configs=[triton.Config({"BM": 64, "BN": 64, "BK": 64}, num_warps=4, num_stages=3),
                   triton.Config({"BM": 128, "BN": 64, "BK": 64}, num_warps=8, num_stages=3),
                   triton.Config({"BM": 64, "BN": 128, "BK": 32}, num_warps=8, num_stages=3),
                   triton.Config({"BM": 64, "BN": 32, "BK": 64}, num_warps=4, num_stages=3),
                   triton.Config({"BM": 32, "BN": 64, "BK": 64}, num_warps=4, num_stages=3),
                   triton.Config({"BM": 16, "BN": 64, "BK": 64}, num_warps=4, num_stages=4)],
          key=["M_BUCKET", "N", "K"], prune_configs_by=prune_rows("M", "BM", "BN"),
          interpreted=ByRows("M", "BM", [triton.Config({"BM": bm, "BN": 128, "BK": 64}) for bm in (16, 64, 256)]))
@triton.jit
def gated_gemm_kernel(x, w, out, M, M_BUCKET, beta, linear_beta, N: tl.constexpr, K: tl.constexpr,
                      BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, ACT: tl.constexpr,
                      LINEAR_TANH: tl.constexpr, DOT_F32: tl.constexpr, PREC: tl.constexpr):
    """out[M, N] = act(x W[:N]^T, x W[N:]^T) for x [M, K], w [2N, K]."""
    i_m, i_n = tl.program_id(0).to(tl.int64), tl.program_id(1)
    o_m = i_m * BM + tl.arange(0, BM)
    o_n = i_n * BN + tl.arange(0, BN)
    m_m, m_n = o_m < M, o_n < N
    b_gate = tl.zeros([BM, BN], dtype=tl.float32)
    b_up = tl.zeros([BM, BN], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_x = tl.load(x + o_m[:, None] * K + o_k[None, :], mask=m_m[:, None] & m_k[None, :], other=0.)
        p_w = w + o_n[None, :] * K + o_k[:, None]  # [BK, BN] of W_gate^T; W_up^T is N rows further
        b_wg = tl.load(p_w, mask=m_k[:, None] & m_n[None, :], other=0.)
        b_wu = tl.load(p_w + N * K, mask=m_k[:, None] & m_n[None, :], other=0.)
        if DOT_F32:
            b_x, b_wg, b_wu = b_x.to(tl.float32), b_wg.to(tl.float32), b_wu.to(tl.float32)
        b_gate = tl.dot(b_x, b_wg, b_gate, input_precision=PREC)
        b_up = tl.dot(b_x, b_wu, b_up, input_precision=PREC)
    b_out = gated_act(b_gate, b_up, beta, linear_beta, ACT, LINEAR_TANH)
    tl.store(out + o_m[:, None] * N + o_n[None, :], b_out.to(out.dtype.element_ty), mask=m_m[:, None] & m_n[None, :])


def gated_mlp(x: torch.Tensor, w: torch.Tensor, act: str = "situ", beta: float = BETA,
              linear_beta: float | None = LINEAR_BETA) -> torch.Tensor:
    """The IR op `gated_mlp`: act(x W_gate^T, x W_up^T), x [..., D], w = cat(W_gate, W_up) [2I, D]."""
    check_device("gated_mlp", x, w)
    D = x.shape[-1]
    if w.dim() != 2 or w.shape[1] != D or w.shape[0] % 2:
        raise ValueError(f"gated_mlp: weight must be [2I, {D}], got {list(w.shape)}")
    if x.dtype != w.dtype:
        raise ValueError(f"gated_mlp: input {x.dtype} and weight {w.dtype} differ")
    N = w.shape[0] // 2
    x2 = x.reshape(-1, D).contiguous()
    M = x2.shape[0]
    out = x.new_empty(*x.shape[:-1], N)
    grid = lambda meta: (triton.cdiv(M, meta["BM"]), triton.cdiv(N, meta["BN"]))
    gated_gemm_kernel[grid](x2, w.contiguous(), out, M, triton.next_power_of_2(M), float(beta),
                            float(linear_beta or 1.0), N=N, K=D, ACT=ACT_IDS[act],
                            LINEAR_TANH=linear_beta is not None, DOT_F32=dots_in_fp32(x),
                            PREC=dot_precision())
    return out
