"""Routed experts on MXFP4 weights through `tl.dot_scaled` (sm_100), with the activations in
BF16 (the default) or quantized to MXFP8 (opt-in: `activations="mxfp8"`).

Blackwell's block-scaled MMA (`tcgen05.mma ... kind::mxf8f6f4.block_scale`) multiplies two MX
operands, each with its E8M0 scale per 32 along K, in hardware. Triton lowers `tl.dot_scaled`
to it only when both operands are MX formats and the MMA's M is 128; a bf16 operand makes it
upcast the weights and run a plain bf16 MMA (`kind::f16`) instead. The MXFP8 activations that
the hardware's block-scaled form needs cost accuracy (k3-tiny's logits 0.41 rel RMS from the
BF16 computation), so they are a choice the user makes (`k3c compile --backend triton --target
sm_100 --expert-activations mxfp8`); by default the activations go into `tl.dot_scaled` as the
model holds them, BF16, and the weights are decoded by Triton for a BF16 MMA. With MXFP8:

- the weights go in as stored: E2M1 codes [N, K/2] (two a byte, the low nibble the even k:
  dot_scaled's own packing along K) and E8M0 scales [N, K/32], untouched;
- the activations are quantized to MXFP8 (E4M3 elements, one E8M0 scale per 32 along K, the
  OCP MX v1.0 conversion) by `mxfp8_quantize` before the GEMM, and the gated kernel writes its
  output straight as MXFP8 for the down GEMM (no float copy of it);
- the GEMM is swapped: the weights are the MMA's 128-row side and the (token, slot) pairs its
  N side (16 or 64, grouped.py's blocks), so a decode step with a few rows per expert still
  takes the block-scaled MMA: acc[BW, BM] = W_e[n-block] x_pairs^T.

    moe_gemm_scaled_kernel    out[pair] = scale[pair] * x[row(pair)] W_e^T      (gate/up; down)
    moe_gated_scaled_kernel   a[pair]   = MXFP8(act(x W_e,gate^T, x W_e,up^T))

Numerics: with MXFP8 this is not the decode path's computation. The weights are exact, every
product of an E2M1 and an E4M3 value times two powers of two is exact in fp32 and accumulates
in fp32, but each activation is rounded to E4M3 (3 mantissa bits) once before each GEMM. The
definition of what these kernels compute is the naive expert on MXFP8-rounded activations.
With BF16 activations it is the naive expert on BF16 activations (an input of another dtype
is rounded to BF16, the expert's hidden is written in BF16), as mxfp4.py's kernels compute
for a BF16 model.

Triton's interpreter has no `dot_scaled`: under it (EMULATE) the operands are decoded to fp32
in registers and multiplied with `tl.dot`, which is exact there, so the interpreter runs the
same quantizer, loads, masks and epilogues; only the MMA instruction itself differs.
"""

from __future__ import annotations

import torch

from ....errors import UsageError
from ...common.triton import INTERPRET, autotune
from ...situ.naive import BETA, LINEAR_BETA
from ...situ.triton.epilogue import ACT_IDS, gated_act
from .grouped import ExpertBlocks, _block_rows, sort_by_expert
from .mxfp4 import _check, _e2m1, _e8m0

import triton  # isort: skip  (after common.triton has chosen the mode)
import triton.language as tl  # isort: skip

BW = 128  # weight rows per program: the M of the block-scaled MMA (smaller M falls back to bf16 MMAs)
GROUP = 32  # elements per E8M0 scale, both operands
ACTIVATIONS = ("bf16", "mxfp8")  # the activations' format into tl.dot_scaled (X_FMT "bf16" / "e4m3")


@triton.jit
def _mxfp8(x):
    """x [R, C] float32 (C a multiple of 32) -> (E4M3 codes uint8 [R, C], E8M0 scales uint8 [R, C/32]).

    OCP MX v1.0: the group's scale is 2^(floor(log2 max|x|) - 8) (8 = E4M3's largest exponent),
    elements x / scale round to the nearest E4M3 value (ties to even) and saturate at +-448. A
    group of zeros gets byte 0, a group holding an inf the NaN scale (255), a NaN element the
    NaN code (0x7F): nothing non-finite turns finite. Built from the float32 bits, so the GPU and
    the interpreter round the same way.
    """
    R: tl.constexpr = x.shape[0]
    C: tl.constexpr = x.shape[1]
    g = tl.reshape(x, [R, C // 32, 32])
    e = (tl.max(tl.abs(g), axis=2).to(tl.int32, bitcast=True) >> 23) & 255  # floor(log2 amax) + 127
    s = tl.where(e == 255, 255, tl.maximum(e - 8, 0))
    inv = (tl.maximum(254 - s, 1) << 23).to(tl.float32, bitcast=True)  # 2^(127 - s): exact, normal
    v = g * inv[:, :, None]  # |v| < 512
    a = tl.minimum(tl.abs(v), 448.0)
    # the E4M3 quantum at a: 2^(max(floor(log2 a), -6) - 3); a / q < 16 rounds to an integer
    # (ties to even) by adding and taking away 2^23, whose ulp is 1
    q = ((tl.maximum((a.to(tl.int32, bitcast=True) >> 23) & 255, 121) - 3) << 23).to(tl.float32, bitcast=True)
    r = ((a / q + 8388608.0) - 8388608.0) * q
    rb = r.to(tl.int32, bitcast=True)
    er = (rb >> 23) & 255
    code = tl.where(er >= 121, ((er - 120) << 3) | ((rb >> 20) & 7), (r * 512.0).to(tl.int32))  # normal | n 2^-9
    code = code | ((v.to(tl.int32, bitcast=True) >> 24) & 0x80)
    code = tl.where(v != v, 0x7F, code)
    return tl.reshape(code, [R, C]).to(tl.uint8), s.to(tl.uint8)


@triton.jit
def _e4m3(code):
    """E4M3 codes (int32) -> float32 from the bits: sign bit 7, exponent bits 6-3 (bias 7; 0 is
    subnormal, m 2^-9), mantissa bits 2-0; 0x7F and 0xFF are NaN."""
    mag = code & 0x7F
    normal = (((mag >> 3) + 120) << 23) | ((mag & 7) << 20)
    value = tl.where(mag >= 8, normal.to(tl.float32, bitcast=True), (mag & 7).to(tl.float32) * 0.001953125)
    value = tl.where(code & 0x80 != 0, -value, value)
    return tl.where(mag == 0x7F, float("nan"), value)


@triton.jit
def _widen(s, ROWS: tl.constexpr, COLS: tl.constexpr):
    """E8M0 bytes [ROWS, COLS / 32] (int32) -> their values repeated over each group: [ROWS, COLS]."""
    return tl.reshape(tl.broadcast_to(_e8m0(s)[:, :, None], [ROWS, COLS // 32, 32]), [ROWS, COLS])


@triton.jit
def _scaled_dot(w, w_s, x, x_s, acc, EMULATE: tl.constexpr, X_FMT: tl.constexpr):
    """acc [BW, BM] + (E2M1 w [BW, BK/2], scales [BW, BK/32]) x (x [BM, BK], scales [BM, BK/32])^T,
    x E4M3 codes with their scales (X_FMT "e4m3") or BF16 values (X_FMT "bf16", x_s unused)."""
    if EMULATE:
        BWo: tl.constexpr = w.shape[0]
        BK: tl.constexpr = x.shape[1]
        BMo: tl.constexpr = x.shape[0]
        wi = w.to(tl.int32)
        w_f = tl.reshape(tl.join(_e2m1(wi & 15), _e2m1(wi >> 4)), [BWo, BK]) * _widen(w_s.to(tl.int32), BWo, BK)
        if X_FMT == "bf16":
            x_f = x.to(tl.float32)
        else:
            x_f = _e4m3(x.to(tl.int32)) * _widen(x_s.to(tl.int32), BMo, BK)
        return tl.dot(w_f, tl.trans(x_f), acc, input_precision="ieee")
    elif X_FMT == "bf16":
        return tl.dot_scaled(w, w_s, "e2m1", tl.trans(x), None, "bf16", acc)
    else:
        return tl.dot_scaled(w, w_s, "e2m1", tl.trans(x), x_s, "e4m3", acc)


@triton.jit
def mxfp8_quantize_kernel(x, codes, scales, R, K: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    """Rows x [R, K] -> E4M3 codes [R, K] and E8M0 scales [R, K/32] (K a multiple of 32)."""
    o_r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    o_c = tl.program_id(1) * BC + tl.arange(0, BC)
    o_g = tl.program_id(1) * (BC // 32) + tl.arange(0, BC // 32)
    m_r = o_r < R
    b_x = tl.load(x + o_r[:, None] * K + o_c[None, :], mask=m_r[:, None] & (o_c < K)[None, :], other=0.)
    b_q, b_s = _mxfp8(b_x.to(tl.float32))
    tl.store(codes + o_r[:, None] * K + o_c[None, :], b_q, mask=m_r[:, None] & (o_c < K)[None, :])
    tl.store(scales + o_r[:, None] * (K // 32) + o_g[None, :], b_s, mask=m_r[:, None] & (o_g < K // 32)[None, :])


@triton.jit
def _weights(p_c, p_s, o_n, m_n, i_k, K: tl.constexpr, BK: tl.constexpr):
    """Step i_k's weights: codes [BW, BK/2] and scales [BW, BK/32] of rows o_n (masked: code 0, scale 1)."""
    o_j = i_k * (BK // 2) + tl.arange(0, BK // 2)
    o_g = i_k * (BK // 32) + tl.arange(0, BK // 32)
    b_w = tl.load(p_c + o_n[:, None] * (K // 2) + o_j[None, :], mask=m_n[:, None] & (o_j < K // 2)[None, :], other=0)
    b_ws = tl.load(p_s + o_n[:, None] * (K // 32) + o_g[None, :], mask=m_n[:, None] & (o_g < K // 32)[None, :],
                   other=127)
    return b_w, b_ws


@triton.jit
def _acts(x_q, x_s, o_row, m_p, i_k, K: tl.constexpr, BK: tl.constexpr, X_FMT: tl.constexpr):
    """Step i_k's activations of rows o_row: E4M3 codes [BM, BK] and E8M0 scales [BM, BK/32],
    or BF16 values [BM, BK] (X_FMT "bf16"; the scales returned are a placeholder, never read)."""
    o_k = i_k * BK + tl.arange(0, BK)
    b_x = tl.load(x_q + o_row[:, None] * K + o_k[None, :], mask=m_p[:, None] & (o_k < K)[None, :], other=0)
    if X_FMT == "bf16":
        b_xs = b_x
    else:
        o_g = i_k * (BK // 32) + tl.arange(0, BK // 32)
        b_xs = tl.load(x_s + o_row[:, None] * (K // 32) + o_g[None, :],
                       mask=m_p[:, None] & (o_g < K // 32)[None, :], other=127)
    return b_x, b_xs


def _configs() -> list[triton.Config]:
    tiles = ((128, 8, 3), (256, 8, 2), (128, 4, 3))
    return [triton.Config({"BK": bk}, num_warps=nw, num_stages=ns) for bk, nw, ns in tiles]


def _prune(configs: list, named_args: dict, **kwargs) -> list:
    """4 warps only for 16-pair blocks: at 64 the gated kernel's two [128, 64] accumulators,
    read out of tensor memory for the epilogue, spilled 96 bytes on sm_100 (255 registers)."""
    return [c for c in configs if c.num_warps == 8 or kwargs["BM"] <= 16]


@autotune(configs=_configs(), key=["NOUT", "K", "BM"], prune_configs_by={"early_config_prune": _prune})
@triton.jit
def moe_gemm_scaled_kernel(x_q, x_s, codes, scales, out, pairs, experts, scale, P, ROW_DIV: tl.constexpr,
                           NOUT: tl.constexpr, K: tl.constexpr, BM: tl.constexpr, BW: tl.constexpr, BK: tl.constexpr,
                           HAS_SCALE: tl.constexpr, EMULATE: tl.constexpr, X_FMT: tl.constexpr):
    i_blk, i_n = tl.program_id(0), tl.program_id(1)
    i_e = tl.load(experts + i_blk).to(tl.int64)
    if i_e < 0:
        return
    o_p = tl.load(pairs + i_blk * BM + tl.arange(0, BM)).to(tl.int64)
    m_p = o_p < P
    o_row = o_p // ROW_DIV  # the input row: the token (ROW_DIV = k) or the pair itself (1)
    o_n = i_n * BW + tl.arange(0, BW)
    m_n = o_n < NOUT
    p_c, p_s = codes + i_e * NOUT * (K // 2), scales + i_e * NOUT * (K // 32)
    b_acc = tl.zeros([BW, BM], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        b_x, b_xs = _acts(x_q, x_s, o_row, m_p, i_k, K, BK, X_FMT)
        b_w, b_ws = _weights(p_c, p_s, o_n, m_n, i_k, K, BK)
        b_acc = _scaled_dot(b_w, b_ws, b_x, b_xs, b_acc, EMULATE, X_FMT)
    if HAS_SCALE:
        b_acc = b_acc * tl.load(scale + o_p, mask=m_p, other=0.).to(tl.float32)[None, :]
    tl.store(out + o_p[None, :] * NOUT + o_n[:, None], b_acc.to(out.dtype.element_ty),
             mask=m_n[:, None] & m_p[None, :])


@autotune(configs=_configs(), key=["I", "K", "BM"], prune_configs_by={"early_config_prune": _prune})
@triton.jit
def moe_gated_scaled_kernel(x_q, x_s, codes, scales, a_q, a_s, pairs, experts, P, beta, linear_beta,
                            ROW_DIV: tl.constexpr, I: tl.constexpr, K: tl.constexpr, BM: tl.constexpr,
                            BW: tl.constexpr, BK: tl.constexpr, ACT: tl.constexpr, LINEAR_TANH: tl.constexpr,
                            EMULATE: tl.constexpr, X_FMT: tl.constexpr):
    i_blk, i_n = tl.program_id(0), tl.program_id(1)
    i_e = tl.load(experts + i_blk).to(tl.int64)
    if i_e < 0:
        return
    o_p = tl.load(pairs + i_blk * BM + tl.arange(0, BM)).to(tl.int64)
    m_p = o_p < P
    o_row = o_p // ROW_DIV
    o_n = i_n * BW + tl.arange(0, BW)
    m_n = o_n < I
    p_c, p_s = codes + i_e * 2 * I * (K // 2), scales + i_e * 2 * I * (K // 32)  # gate rows, then up rows
    b_gate = tl.zeros([BW, BM], dtype=tl.float32)
    b_up = tl.zeros([BW, BM], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        b_x, b_xs = _acts(x_q, x_s, o_row, m_p, i_k, K, BK, X_FMT)
        b_w, b_ws = _weights(p_c, p_s, o_n, m_n, i_k, K, BK)
        b_gate = _scaled_dot(b_w, b_ws, b_x, b_xs, b_gate, EMULATE, X_FMT)
        b_w, b_ws = _weights(p_c + I * (K // 2), p_s + I * (K // 32), o_n, m_n, i_k, K, BK)
        b_up = _scaled_dot(b_w, b_ws, b_x, b_xs, b_up, EMULATE, X_FMT)
    b_a = tl.trans(gated_act(b_gate, b_up, beta, linear_beta, ACT, LINEAR_TANH))
    if X_FMT == "bf16":  # the down GEMM's input in BF16
        tl.store(a_q + o_p[:, None] * I + o_n[None, :], b_a.to(tl.bfloat16), mask=m_p[:, None] & m_n[None, :])
    else:  # as MXFP8 along I: each 32-row group of this block is one scale
        b_q, b_s = _mxfp8(b_a)
        o_g = i_n * (BW // 32) + tl.arange(0, BW // 32)
        tl.store(a_q + o_p[:, None] * I + o_n[None, :], b_q, mask=m_p[:, None] & m_n[None, :])
        tl.store(a_s + o_p[:, None] * (I // 32) + o_g[None, :], b_s, mask=m_p[:, None] & (o_g < I // 32)[None, :])


def mxfp8_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows x [R, K] (K a multiple of 32) -> (E4M3 codes uint8 [R, K], E8M0 scales uint8 [R, K/32])."""
    R, K = x.shape
    if K % GROUP:
        raise ValueError(f"mxfp8_quantize: the row width ({K}) must be a multiple of {GROUP}")
    x = x.contiguous()
    codes = torch.empty(R, K, dtype=torch.uint8, device=x.device)
    scales = torch.empty(R, K // GROUP, dtype=torch.uint8, device=x.device)
    BR, BC = (16, 128) if not INTERPRET else (min(64, triton.next_power_of_2(max(R, 1))), 128)
    if R:
        mxfp8_quantize_kernel[(triton.cdiv(R, BR), triton.cdiv(K, BC))](x, codes, scales, R, K=K, BR=BR, BC=BC)
    return codes, scales


def _operand(x: torch.Tensor, activations: str) -> tuple[torch.Tensor, torch.Tensor, str]:
    """(values, scales, X_FMT) of rows x [R, K] as tl.dot_scaled takes them: MXFP8 codes and
    scales, or BF16 values (the scales a placeholder the kernel never reads)."""
    if activations not in ACTIVATIONS:
        raise UsageError(f"expert activations {activations!r}; known: {', '.join(ACTIVATIONS)}")
    if activations == "mxfp8":
        return (*mxfp8_quantize(x), "e4m3")
    x = x.to(torch.bfloat16).contiguous()
    return x, x, "bf16"


def _gemm(x_q: torch.Tensor, x_s: torch.Tensor, x_fmt: str, packed: torch.Tensor, scale: torch.Tensor,
          blocks: ExpertBlocks, P: int, row_div: int, out: torch.Tensor, w: torch.Tensor | None = None) -> torch.Tensor:
    NOUT = packed.shape[1]
    grid = (blocks.pairs.numel() // blocks.BM, triton.cdiv(NOUT, BW))
    moe_gemm_scaled_kernel[grid](x_q, x_s, packed, scale, out, blocks.pairs, blocks.experts,
                                 w if w is not None else x_s, P, ROW_DIV=row_div, NOUT=NOUT, K=x_q.shape[1],
                                 BM=blocks.BM, BW=BW, HAS_SCALE=w is not None, EMULATE=INTERPRET, X_FMT=x_fmt)
    return out


def moe_gate_up_mxfp4_scaled(h: torch.Tensor, w13_packed: torch.Tensor, w13_scale: torch.Tensor,
                             idx: torch.Tensor, activations: str = "bf16") -> torch.Tensor:
    """`moe_gate_up_mxfp4` through tl.dot_scaled: h [N, D] (as BF16, or MXFP8), packed [E, 2I, D/2],
    scales [E, 2I, D/32] -> [N, k, 2I] in h's dtype."""
    _check("moe_gate_up_mxfp4", h, w13_packed, w13_scale, idx)
    N, k = idx.shape
    P = N * k
    blocks = sort_by_expert(idx, w13_packed.shape[0], _block_rows(P, w13_packed.shape[0]))
    out = h.new_empty(N, k, w13_packed.shape[1])
    return _gemm(*_operand(h, activations), w13_packed.contiguous(), w13_scale.contiguous(), blocks, P, k, out)


def moe_down_mxfp4_scaled(a: torch.Tensor, w2_packed: torch.Tensor, w2_scale: torch.Tensor, idx: torch.Tensor,
                          w: torch.Tensor, activations: str = "bf16") -> torch.Tensor:
    """`moe_down_mxfp4` through tl.dot_scaled: a [N, k, I] (as BF16, or MXFP8), packed [E, D, I/2],
    scales [E, D, I/32] -> y [N, D] = sum_j w_j expert_j(a_j), in a's dtype."""
    _check("moe_down_mxfp4", a, w2_packed, w2_scale, idx)
    N, k = idx.shape
    P = N * k
    blocks = sort_by_expert(idx, w2_packed.shape[0], _block_rows(P, w2_packed.shape[0]))
    out = torch.empty(N, k, w2_packed.shape[1], dtype=torch.float32, device=a.device)
    _gemm(*_operand(a.reshape(P, -1), activations), w2_packed.contiguous(), w2_scale.contiguous(), blocks, P, 1, out,
          w.reshape(P).float().contiguous())
    return out.sum(1).to(a.dtype)


def moe_experts_mxfp4_scaled(h: torch.Tensor, w13_packed: torch.Tensor, w13_scale: torch.Tensor,
                             w2_packed: torch.Tensor, w2_scale: torch.Tensor, idx: torch.Tensor, w: torch.Tensor,
                             act: str = "situ", beta: float = BETA, linear_beta: float | None = LINEAR_BETA,
                             activations: str = "bf16") -> torch.Tensor:
    """`moe_experts_mxfp4` through tl.dot_scaled: h as BF16 and the gate/up kernel's activation
    written in BF16 for the down GEMM, or both as MXFP8 (activations="mxfp8"); y [N, D] in h's dtype."""
    _check("moe_experts_mxfp4", h, w13_packed, w13_scale, idx)
    N, k = idx.shape
    E, two_i = w13_packed.shape[:2]
    I = two_i // 2
    _check("moe_experts_mxfp4", h.new_empty(0, I), w2_packed, w2_scale, idx)
    P = N * k
    blocks = sort_by_expert(idx, E, _block_rows(P, E))
    h_q, h_s, x_fmt = _operand(h, activations)
    if x_fmt == "bf16":
        a_q = a_s = torch.empty(P, I, dtype=torch.bfloat16, device=h.device)
    else:
        a_q = torch.empty(P, I, dtype=torch.uint8, device=h.device)
        a_s = torch.empty(P, I // GROUP, dtype=torch.uint8, device=h.device)
    grid = (blocks.pairs.numel() // blocks.BM, triton.cdiv(I, BW))
    moe_gated_scaled_kernel[grid](h_q, h_s, w13_packed.contiguous(), w13_scale.contiguous(), a_q, a_s, blocks.pairs,
                                  blocks.experts, P, float(beta), float(linear_beta or 1.0), ROW_DIV=k, I=I,
                                  K=h.shape[1], BM=blocks.BM, BW=BW, ACT=ACT_IDS[act],
                                  LINEAR_TANH=linear_beta is not None, EMULATE=INTERPRET, X_FMT=x_fmt)
    out = torch.empty(N, k, w2_packed.shape[1], dtype=torch.float32, device=h.device)
    _gemm(a_q, a_s, x_fmt, w2_packed.contiguous(), w2_scale.contiguous(), blocks, P, 1, out,
          w.reshape(P).float().contiguous())
    return out.sum(1).to(h.dtype)


__all__ = ["ACTIVATIONS", "mxfp8_quantize", "moe_gate_up_mxfp4_scaled", "moe_down_mxfp4_scaled",
           "moe_experts_mxfp4_scaled"]
