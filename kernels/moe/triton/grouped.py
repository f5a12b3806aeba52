"""Routed experts in Triton: a grouped GEMM over the (token, slot) pairs sorted by expert.

`sort_by_expert` lays the N * k pairs out expert after expert, each expert's run padded to a
multiple of BM rows (padding holds the sentinel N * k), so every block of BM rows belongs to
one expert; every size is fixed by N, k and E, never by the routing. Then one program per
(block of BM sorted rows, block of BN outputs) multiplies its rows by its expert's weight:

    moe_gemm_kernel    out[pair] = scale[pair] * x[row(pair)] W_e^T     (gate/up; down + combine)
    moe_gated_kernel   out[pair] = act(x W_e,gate^T, x W_e,up^T)        (gate/up with SiTU/SiLU)

Outputs stay per pair, fp32 for the down projection; the k slots of a token are summed by
the caller in a fixed order (deterministic, no atomics).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ...common.triton import autotune, check_device, dot_precision, dots_in_fp32, tile_fits
from ...situ.naive import BETA, LINEAR_BETA
from ...situ.triton.epilogue import ACT_IDS, gated_act

import triton  # isort: skip  (after common.triton has chosen the mode)
import triton.language as tl  # isort: skip


class ExpertBlocks(NamedTuple):
    pairs: torch.Tensor  # [L] int32: pair id (n * k + j) per sorted row; N * k marks padding
    experts: torch.Tensor  # [L / BM] int32: the expert of each block of BM rows; -1: empty
    BM: int


def sort_by_expert(idx: torch.Tensor, num_experts: int, BM: int) -> ExpertBlocks:
    """idx [N, k] expert ids -> the pairs sorted by expert in BM-row blocks (static sizes)."""
    P, E = idx.numel(), num_experts
    e = idx.reshape(-1).to(torch.int64)
    order = torch.argsort(e, stable=True)
    # a scatter-add rather than bincount: its size is E by construction, so shapes alone
    # (meta tensors, as the AOT compiler runs the module) carry it through
    counts = torch.zeros(E, dtype=torch.int64, device=idx.device).scatter_add_(0, e, torch.ones_like(e))
    padded = (counts + BM - 1) // BM * BM
    ends_pad = torch.cumsum(padded, 0)
    start_pad, start = ends_pad - padded, torch.cumsum(counts, 0) - counts
    e_sorted = e[order]
    pos = start_pad[e_sorted] + torch.arange(P, device=idx.device) - start[e_sorted]
    L = triton.cdiv(P + E * (BM - 1), BM) * BM
    pairs = torch.full((L,), P, dtype=torch.int32, device=idx.device)
    pairs[pos] = order.to(torch.int32)
    blocks = torch.arange(0, L, BM, device=idx.device)
    experts = torch.searchsorted(ends_pad, blocks, right=True)
    experts = torch.where(experts < E, experts, -1).to(torch.int32)
    return ExpertBlocks(pairs, experts, BM)


def _configs() -> list[triton.Config]:
    # (128 columns at 4 warps spilled the gated kernel's two accumulators on sm_90: 8 warps there)
    return [triton.Config({"BN": bn, "BK": bk}, num_warps=nw, num_stages=ns)
            for bn, bk, nw, ns in ((128, 64, 8, 3), (64, 64, 4, 3), (64, 32, 4, 3), (32, 64, 4, 3))]


def _prune(configs: list, named_args: dict, **kwargs) -> list:
    """The [BM, BN] tiles that suit the dots' operands (tile_fits; BM is the caller's): with
    fp32 ones the gated kernel spilled 864 bytes at 64 x 128 on sm_90."""
    kept = [c for c in configs if tile_fits(kwargs["BM"], c.kwargs["BN"], kwargs["DOT_F32"])]
    return kept or [min(configs, key=lambda c: c.kwargs["BN"])]


@autotune(configs=_configs(), key=["NOUT", "K", "BM"], prune_configs_by={"early_config_prune": _prune})
@triton.jit
def moe_gemm_kernel(x, w, out, pairs, experts, scale, P, ROW_DIV: tl.constexpr, NOUT: tl.constexpr,
                    K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                    HAS_SCALE: tl.constexpr, DOT_F32: tl.constexpr, PREC: tl.constexpr):
    i_blk, i_n = tl.program_id(0), tl.program_id(1)
    i_e = tl.load(experts + i_blk).to(tl.int64)
    if i_e < 0:
        return
    o_p = tl.load(pairs + i_blk * BM + tl.arange(0, BM)).to(tl.int64)
    m_p = o_p < P
    o_row = o_p // ROW_DIV  # the input row: the token (ROW_DIV = k) or the pair itself (1)
    o_n = i_n * BN + tl.arange(0, BN)
    m_n = o_n < NOUT
    p_w = w + i_e * NOUT * K
    b_acc = tl.zeros([BM, BN], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_x = tl.load(x + o_row[:, None] * K + o_k[None, :], mask=m_p[:, None] & m_k[None, :], other=0.)
        b_w = tl.load(p_w + o_n[None, :] * K + o_k[:, None], mask=m_k[:, None] & m_n[None, :], other=0.)
        if DOT_F32:
            b_x, b_w = b_x.to(tl.float32), b_w.to(tl.float32)
        b_acc = tl.dot(b_x, b_w, b_acc, input_precision=PREC)
    if HAS_SCALE:
        b_acc = b_acc * tl.load(scale + o_p, mask=m_p, other=0.).to(tl.float32)[:, None]
    tl.store(out + o_p[:, None] * NOUT + o_n[None, :], b_acc.to(out.dtype.element_ty),
             mask=m_p[:, None] & m_n[None, :])


@autotune(configs=_configs(), key=["I", "K", "BM"], prune_configs_by={"early_config_prune": _prune})
@triton.jit
def moe_gated_kernel(x, w, out, pairs, experts, P, beta, linear_beta, ROW_DIV: tl.constexpr, I: tl.constexpr,
                     K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, ACT: tl.constexpr,
                     LINEAR_TANH: tl.constexpr, DOT_F32: tl.constexpr, PREC: tl.constexpr):
    i_blk, i_n = tl.program_id(0), tl.program_id(1)
    i_e = tl.load(experts + i_blk).to(tl.int64)
    if i_e < 0:
        return
    o_p = tl.load(pairs + i_blk * BM + tl.arange(0, BM)).to(tl.int64)
    m_p = o_p < P
    o_row = o_p // ROW_DIV
    o_n = i_n * BN + tl.arange(0, BN)
    m_n = o_n < I
    p_w = w + i_e * 2 * I * K  # [2I, K]: gate rows, then up rows
    b_gate = tl.zeros([BM, BN], dtype=tl.float32)
    b_up = tl.zeros([BM, BN], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_x = tl.load(x + o_row[:, None] * K + o_k[None, :], mask=m_p[:, None] & m_k[None, :], other=0.)
        p_wg = p_w + o_n[None, :] * K + o_k[:, None]
        b_wg = tl.load(p_wg, mask=m_k[:, None] & m_n[None, :], other=0.)
        b_wu = tl.load(p_wg + I * K, mask=m_k[:, None] & m_n[None, :], other=0.)
        if DOT_F32:
            b_x, b_wg, b_wu = b_x.to(tl.float32), b_wg.to(tl.float32), b_wu.to(tl.float32)
        b_gate = tl.dot(b_x, b_wg, b_gate, input_precision=PREC)
        b_up = tl.dot(b_x, b_wu, b_up, input_precision=PREC)
    b_out = gated_act(b_gate, b_up, beta, linear_beta, ACT, LINEAR_TANH)
    tl.store(out + o_p[:, None] * I + o_n[None, :], b_out.to(out.dtype.element_ty), mask=m_p[:, None] & m_n[None, :])


def _block_rows(P: int, E: int) -> int:
    """Rows per block: 64 when experts get enough rows to fill them, else 16 (less padding)."""
    return 64 if P >= 64 * E else 16


def _check(what: str, h: torch.Tensor, w: torch.Tensor, idx: torch.Tensor) -> None:
    check_device(what, h, w, idx)
    if idx.dim() != 2 or idx.shape[0] != h.shape[0]:
        raise ValueError(f"{what}: idx must be [N, k] with h's N = {h.shape[0]}, got {list(idx.shape)}")
    if w.dim() != 3 or w.shape[2] != h.shape[-1]:
        raise ValueError(f"{what}: expert weights must be [E, out, {h.shape[-1]}], got {list(w.shape)}")


def _gemm(x, w, blocks: ExpertBlocks, P: int, row_div: int, out: torch.Tensor, scale=None) -> torch.Tensor:
    E, NOUT, K = w.shape
    grid = lambda meta: (blocks.pairs.numel() // blocks.BM, triton.cdiv(NOUT, meta["BN"]))
    moe_gemm_kernel[grid](x, w, out, blocks.pairs, blocks.experts, scale if scale is not None else x, P,
                          ROW_DIV=row_div, NOUT=NOUT, K=K, BM=blocks.BM, HAS_SCALE=scale is not None,
                          DOT_F32=dots_in_fp32(x, w), PREC=dot_precision())
    return out


def moe_gate_up(h: torch.Tensor, w13: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """The IR op `moe_gate_up`: gu[n, j] = w13[idx[n, j]] h[n]; h [N, D], w13 [E, 2I, D] -> [N, k, 2I]."""
    _check("moe_gate_up", h, w13, idx)
    N, k = idx.shape
    P = N * k
    blocks = sort_by_expert(idx, w13.shape[0], _block_rows(P, w13.shape[0]))
    out = h.new_empty(N, k, w13.shape[1])
    return _gemm(h.contiguous(), w13.contiguous(), blocks, P, k, out)


def moe_down(a: torch.Tensor, w2: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The IR op `moe_down`: y[n] = sum_j w[n, j] w2[idx[n, j]] a[n, j]; a [N, k, I], w2 [E, D, I]."""
    _check("moe_down", a.reshape(-1, a.shape[-1]), w2, idx.reshape(-1, 1))
    N, k = idx.shape
    P = N * k
    blocks = sort_by_expert(idx, w2.shape[0], _block_rows(P, w2.shape[0]))
    out = torch.empty(N, k, w2.shape[1], dtype=torch.float32, device=a.device)
    _gemm(a.reshape(P, -1).contiguous(), w2.contiguous(), blocks, P, 1, out, w.reshape(P).float().contiguous())
    return out.sum(1).to(a.dtype)


def moe_experts(h: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, idx: torch.Tensor, w: torch.Tensor,
                act: str = "situ", beta: float = BETA, linear_beta: float | None = LINEAR_BETA) -> torch.Tensor:
    """The IR op `moe_experts`: y[n] = sum_j w[n, j] w2[e] act(w13[e] h[n]), e = idx[n, j]."""
    _check("moe_experts", h, w13, idx)
    N, k = idx.shape
    P, E, I = N * k, w13.shape[0], w2.shape[2]
    blocks = sort_by_expert(idx, E, _block_rows(P, E))
    a = h.new_empty(P, I)
    grid = lambda meta: (blocks.pairs.numel() // blocks.BM, triton.cdiv(I, meta["BN"]))
    h = h.contiguous()
    moe_gated_kernel[grid](h, w13.contiguous(), a, blocks.pairs, blocks.experts, P, float(beta),
                           float(linear_beta or 1.0), ROW_DIV=k, I=I, K=h.shape[1], BM=blocks.BM,
                           ACT=ACT_IDS[act], LINEAR_TANH=linear_beta is not None, DOT_F32=dots_in_fp32(h, w13),
                           PREC=dot_precision())
    out = torch.empty(N, k, w2.shape[1], dtype=torch.float32, device=h.device)
    _gemm(a, w2.contiguous(), blocks, P, 1, out, w.reshape(P).float().contiguous())
    return out.sum(1).to(h.dtype)
