"""Routed experts on MXFP4 weights in Triton: the grouped GEMM of grouped.py with the decode in
the kernel. Each program loads its expert's codes (u8, two a byte) and E8M0 scales (one per 32
along K) and decodes them in registers, feeding `tl.dot` with fp32 accumulation; no decoded copy
of the weights is ever written to memory.

    moe_gemm_mxfp4_kernel    out[pair] = scale[pair] * x[row(pair)] decode(P_e, S_e)^T
    moe_gated_mxfp4_kernel   out[pair] = act(x decode(P_e,gate)^T, x decode(P_e,up)^T)

The layout is kernels/mxfp4's: byte j of a row holds k = 2j in its low nibble and k = 2j + 1 in
its high one. A program reads BK / 2 bytes per row and step, decodes the low nibbles into the
weights of the even k and the high ones into those of the odd k, and multiplies each by the
activations of the same k (x[:, 0::2] and x[:, 1::2] of the step's BK columns): two dots of
BK / 2 per step, so the codes are read once and never interleaved in registers.

The decode is k3c.kernels.mxfp4.decode's, operation for operation: the E2M1 value and the group's
2^(e - 127) are built from their bits as float32 and multiplied once in float32 (both exact),
then cast to the dot's operand dtype (bf16 for bf16 activations on the GPU, else float32).
"""

from __future__ import annotations

import torch

from ...common.triton import autotune, check_device, dot_precision, dots_in_fp32
from ...mxfp4.naive import check_shapes
from ...situ.naive import BETA, LINEAR_BETA
from ...situ.triton.epilogue import ACT_IDS, gated_act
from .grouped import ExpertBlocks, _block_rows, _configs, _prune, sort_by_expert

import triton  # isort: skip  (after common.triton has chosen the mode)
import triton.language as tl  # isort: skip


@triton.jit
def _e2m1(code):
    """4-bit codes (int32) -> their E2M1 values as float32, from the bits: sign bit 3, exponent
    bits 2-1 (bias 1; 0 is subnormal: 0 or 0.5), mantissa bit 0."""
    mag = code & 7
    e = mag >> 1
    normal = ((e + 126) << 23) | ((mag & 1) << 22)
    bits = tl.where(e > 0, normal, tl.where(mag == 1, 126 << 23, 0))
    return (bits | ((code & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def _e8m0(s):
    """E8M0 bytes (int32) -> 2^(s - 127) as float32 (s = 0 the subnormal 2^-127, 255 NaN)."""
    bits = tl.where(s == 0, 0x400000, s << 23)
    return tl.where(s == 255, 0x7FC00000, bits).to(tl.float32, bitcast=True)


@triton.jit
def _decoded(p_codes, p_scales, o_n, o_j, m_n, m_j, like, K: tl.constexpr):
    """The weights of the even and the odd k of bytes o_j [BK/2] of rows o_n [BN], as
    [BK/2, BN] tiles of `like`'s dtype (rows of the packed matrix [N, K/2], scales [N, K/32])."""
    mask = m_j[:, None] & m_n[None, :]
    byte = tl.load(p_codes + o_n[None, :] * (K // 2) + o_j[:, None], mask=mask, other=0).to(tl.int32)
    s = tl.load(p_scales + o_n[None, :] * (K // 32) + (o_j // 16)[:, None], mask=mask, other=127).to(tl.int32)
    scale = _e8m0(s)
    return (_e2m1(byte & 15) * scale).to(like.dtype), (_e2m1(byte >> 4) * scale).to(like.dtype)


@triton.jit
def _halves(x, o_row, o_j, m_p, m_j, K: tl.constexpr, DOT_F32: tl.constexpr):
    """x[row, 2j] and x[row, 2j + 1] for the rows o_row [BM] and bytes o_j [BK/2] (in fp32 when
    the dots take fp32 operands)."""
    mask = m_p[:, None] & m_j[None, :]
    p = x + o_row[:, None] * K + 2 * o_j[None, :]
    x_even, x_odd = tl.load(p, mask=mask, other=0.), tl.load(p + 1, mask=mask, other=0.)
    if DOT_F32:
        x_even, x_odd = x_even.to(tl.float32), x_odd.to(tl.float32)
    return x_even, x_odd


def _prune_mxfp4(configs: list, named_args: dict, **kwargs) -> list:
    """grouped.py's tiles, less the 128-column ones where the dots take fp32 operands: the
    decoded [BK/2, 128] fp32 weight tiles beside their 3xTF32 halves spilled 8 bytes on sm_90
    (the down kernel at 16 x 128, BK 64)."""
    kept = _prune(configs, named_args, **kwargs)
    if kwargs["DOT_F32"]:
        kept = [c for c in kept if c.kwargs["BN"] < 128] or kept
    return kept


@autotune(configs=_configs(), key=["NOUT", "K", "BM"], prune_configs_by={"early_config_prune": _prune_mxfp4})
@triton.jit
def moe_gemm_mxfp4_kernel(x, codes, scales, out, pairs, experts, scale, P, ROW_DIV: tl.constexpr,
                          NOUT: tl.constexpr, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                          BK: tl.constexpr, HAS_SCALE: tl.constexpr, DOT_F32: tl.constexpr, PREC: tl.constexpr):
    i_blk, i_n = tl.program_id(0), tl.program_id(1)
    i_e = tl.load(experts + i_blk).to(tl.int64)
    if i_e < 0:
        return
    o_p = tl.load(pairs + i_blk * BM + tl.arange(0, BM)).to(tl.int64)
    m_p = o_p < P
    o_row = o_p // ROW_DIV
    o_n = i_n * BN + tl.arange(0, BN)
    m_n = o_n < NOUT
    p_c, p_s = codes + i_e * NOUT * (K // 2), scales + i_e * NOUT * (K // 32)
    b_acc = tl.zeros([BM, BN], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_j = i_k * (BK // 2) + tl.arange(0, BK // 2)
        m_j = o_j < K // 2
        x_even, x_odd = _halves(x, o_row, o_j, m_p, m_j, K, DOT_F32)
        w_even, w_odd = _decoded(p_c, p_s, o_n, o_j, m_n, m_j, x_even, K)
        b_acc = tl.dot(x_even, w_even, b_acc, input_precision=PREC)
        b_acc = tl.dot(x_odd, w_odd, b_acc, input_precision=PREC)
    if HAS_SCALE:
        b_acc = b_acc * tl.load(scale + o_p, mask=m_p, other=0.).to(tl.float32)[:, None]
    tl.store(out + o_p[:, None] * NOUT + o_n[None, :], b_acc.to(out.dtype.element_ty),
             mask=m_p[:, None] & m_n[None, :])


@autotune(configs=_configs(), key=["I", "K", "BM"], prune_configs_by={"early_config_prune": _prune_mxfp4})
@triton.jit
def moe_gated_mxfp4_kernel(x, codes, scales, out, pairs, experts, P, beta, linear_beta, ROW_DIV: tl.constexpr,
                           I: tl.constexpr, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                           ACT: tl.constexpr, LINEAR_TANH: tl.constexpr, DOT_F32: tl.constexpr,
                           PREC: tl.constexpr):
    i_blk, i_n = tl.program_id(0), tl.program_id(1)
    i_e = tl.load(experts + i_blk).to(tl.int64)
    if i_e < 0:
        return
    o_p = tl.load(pairs + i_blk * BM + tl.arange(0, BM)).to(tl.int64)
    m_p = o_p < P
    o_row = o_p // ROW_DIV
    o_n = i_n * BN + tl.arange(0, BN)
    m_n = o_n < I
    p_c, p_s = codes + i_e * 2 * I * (K // 2), scales + i_e * 2 * I * (K // 32)  # gate rows, then up rows
    b_gate = tl.zeros([BM, BN], dtype=tl.float32)
    b_up = tl.zeros([BM, BN], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_j = i_k * (BK // 2) + tl.arange(0, BK // 2)
        m_j = o_j < K // 2
        x_even, x_odd = _halves(x, o_row, o_j, m_p, m_j, K, DOT_F32)
        g_even, g_odd = _decoded(p_c, p_s, o_n, o_j, m_n, m_j, x_even, K)
        b_gate = tl.dot(x_even, g_even, b_gate, input_precision=PREC)
        b_gate = tl.dot(x_odd, g_odd, b_gate, input_precision=PREC)
        u_even, u_odd = _decoded(p_c + I * (K // 2), p_s + I * (K // 32), o_n, o_j, m_n, m_j, x_even, K)
        b_up = tl.dot(x_even, u_even, b_up, input_precision=PREC)
        b_up = tl.dot(x_odd, u_odd, b_up, input_precision=PREC)
    b_out = gated_act(b_gate, b_up, beta, linear_beta, ACT, LINEAR_TANH)
    tl.store(out + o_p[:, None] * I + o_n[None, :], b_out.to(out.dtype.element_ty), mask=m_p[:, None] & m_n[None, :])


def _check(what: str, x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, idx: torch.Tensor) -> None:
    check_device(what, x, packed, scale, idx)
    try:
        check_shapes(packed, scale)
    except ValueError as e:
        raise ValueError(f"{what}: {e}") from None
    if packed.dim() != 3 or 2 * packed.shape[2] != x.shape[-1]:
        raise ValueError(f"{what}: packed experts must be [E, out, {x.shape[-1] // 2}] for inputs of width "
                         f"{x.shape[-1]}, got {list(packed.shape)}")
    if idx.dim() != 2:
        raise ValueError(f"{what}: idx must be [N, k], got {list(idx.shape)}")


def _gemm(x, packed, scale, blocks: ExpertBlocks, P: int, row_div: int, out: torch.Tensor, w=None) -> torch.Tensor:
    E, NOUT, half = packed.shape
    grid = lambda meta: (blocks.pairs.numel() // blocks.BM, triton.cdiv(NOUT, meta["BN"]))
    moe_gemm_mxfp4_kernel[grid](x, packed, scale, out, blocks.pairs, blocks.experts, w if w is not None else x, P,
                                ROW_DIV=row_div, NOUT=NOUT, K=2 * half, BM=blocks.BM, HAS_SCALE=w is not None,
                                DOT_F32=dots_in_fp32(x), PREC=dot_precision())
    return out


def moe_gate_up_mxfp4(h: torch.Tensor, w13_packed: torch.Tensor, w13_scale: torch.Tensor,
                      idx: torch.Tensor) -> torch.Tensor:
    """The IR op `moe_gate_up_mxfp4`: h [N, D], packed [E, 2I, D/2], scales [E, 2I, D/32] -> [N, k, 2I]."""
    _check("moe_gate_up_mxfp4", h, w13_packed, w13_scale, idx)
    N, k = idx.shape
    P = N * k
    blocks = sort_by_expert(idx, w13_packed.shape[0], _block_rows(P, w13_packed.shape[0]))
    out = h.new_empty(N, k, w13_packed.shape[1])
    return _gemm(h.contiguous(), w13_packed.contiguous(), w13_scale.contiguous(), blocks, P, k, out)


def moe_down_mxfp4(a: torch.Tensor, w2_packed: torch.Tensor, w2_scale: torch.Tensor, idx: torch.Tensor,
                   w: torch.Tensor) -> torch.Tensor:
    """The IR op `moe_down_mxfp4`: a [N, k, I], packed [E, D, I/2], scales [E, D, I/32] -> y [N, D]."""
    _check("moe_down_mxfp4", a, w2_packed, w2_scale, idx)
    N, k = idx.shape
    P = N * k
    blocks = sort_by_expert(idx, w2_packed.shape[0], _block_rows(P, w2_packed.shape[0]))
    out = torch.empty(N, k, w2_packed.shape[1], dtype=torch.float32, device=a.device)
    _gemm(a.reshape(P, -1).contiguous(), w2_packed.contiguous(), w2_scale.contiguous(), blocks, P, 1, out,
          w.reshape(P).float().contiguous())
    return out.sum(1).to(a.dtype)


def moe_experts_mxfp4(h: torch.Tensor, w13_packed: torch.Tensor, w13_scale: torch.Tensor, w2_packed: torch.Tensor,
                      w2_scale: torch.Tensor, idx: torch.Tensor, w: torch.Tensor, act: str = "situ",
                      beta: float = BETA, linear_beta: float | None = LINEAR_BETA) -> torch.Tensor:
    """The IR op `moe_experts_mxfp4`: moe_experts on the decoded experts, decoded in the kernels."""
    _check("moe_experts_mxfp4", h, w13_packed, w13_scale, idx)
    N, k = idx.shape
    E, two_i = w13_packed.shape[:2]
    I = two_i // 2
    _check("moe_experts_mxfp4", h.new_empty(0, I), w2_packed, w2_scale, idx)
    P = N * k
    blocks = sort_by_expert(idx, E, _block_rows(P, E))
    a = h.new_empty(P, I)
    grid = lambda meta: (blocks.pairs.numel() // blocks.BM, triton.cdiv(I, meta["BN"]))
    h = h.contiguous()
    moe_gated_mxfp4_kernel[grid](h, w13_packed.contiguous(), w13_scale.contiguous(), a, blocks.pairs, blocks.experts,
                                 P, float(beta), float(linear_beta or 1.0), ROW_DIV=k, I=I, K=h.shape[1],
                                 BM=blocks.BM, ACT=ACT_IDS[act], LINEAR_TANH=linear_beta is not None,
                                 DOT_F32=dots_in_fp32(h), PREC=dot_precision())
    out = torch.empty(N, k, w2_packed.shape[1], dtype=torch.float32, device=h.device)
    _gemm(a, w2_packed.contiguous(), w2_scale.contiguous(), blocks, P, 1, out, w.reshape(P).float().contiguous())
    return out.sum(1).to(h.dtype)


__all__ = ["moe_gate_up_mxfp4", "moe_down_mxfp4", "moe_experts_mxfp4"]
