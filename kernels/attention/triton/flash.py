"""Causal softmax attention in Triton (flash attention: online softmax, fp32 accumulation),
with the key split in two parts so that MLA needs no concatenated or expanded copies.

    scores = (q1 . k1 + q2 . k2) * scale,  masked to s <= t + S - T (the T queries are the
    last T of the S key positions);  o = softmax(scores) v

Every operand is passed with its (batch, position, head) strides; a head stride of 0 shares
one key or value head between all query heads (MLA's rope key; the latent of absorbed MLA).
One program per (block of BM queries, batch * head) walks the visible keys in blocks of BN.
"""

from __future__ import annotations

import torch

from ...common.triton import ByRows, autotune, block, check_device, dot_precision, dots_in_fp32, prune_rows, rows_bucket

import triton  # isort: skip  (after common.triton has chosen the mode)
import triton.language as tl  # isort: skip


def _prune(configs: list, named_args: dict, **kwargs) -> list:
    """A decode step (T = 1) keeps the 16-query tiles (larger ones are all padding), the tiles
    suit the dots' operands (tile_fits: 64 x 64 spilled with fp32 ones), the key/value tiles
    in flight fit shared memory (absorbed MLA attends over the 512-wide latent, where 64 keys
    of [k | v] in 3 stages asked sm_90 for 320 KB of 227), and the query rows and accumulator
    fit the registers: about 200 values a thread, fp32 query operands counted three times
    (3xTF32 keeps each as hi and lo too); past that they spilled on sm_90 (64 fp32 queries of
    192 at 4 warps). None fits an fp32 model's absorbed decode (16 queries of the 576-wide
    latent): the smallest tile is kept, and spills (8 warps spilled more)."""
    rows = prune_rows("T", "BM", "BN")["early_config_prune"](configs, named_args, **kwargs)
    qk = kwargs["BD1"] + (kwargs["BD2"] if kwargs["D2"] > 0 else 0)
    size = 4 if kwargs["DOT_F32"] else named_args["k1"].element_size()
    copies = 3 if kwargs["DOT_F32"] else 1

    def fits(c) -> bool:
        shared = (c.num_stages - 1) * c.kwargs["BN"] * (qk + kwargs["BDV"]) * size
        per_thread = c.kwargs["BM"] * (qk * copies + kwargs["BDV"]) / (32 * c.num_warps)
        return shared <= 96 * 1024 and per_thread <= 200

    return [c for c in rows if fits(c)] or [min(rows, key=lambda c: (c.num_stages * c.kwargs["BN"], c.kwargs["BM"]))]


@autotune(configs=[triton.Config({"BM": 64, "BN": 64}, num_warps=4), triton.Config({"BM": 64, "BN": 32}, num_warps=4),
                   triton.Config({"BM": 128, "BN": 64}, num_warps=8, num_stages=3),
                   triton.Config({"BM": 16, "BN": 64}, num_warps=4, num_stages=3),
                   triton.Config({"BM": 16, "BN": 16}, num_warps=4, num_stages=2)],
          key=["T_BUCKET", "D1", "D2", "DV"], prune_configs_by={"early_config_prune": _prune},
          interpreted=ByRows("T", "BM", [triton.Config({"BM": 16, "BN": 256}), triton.Config({"BM": 128, "BN": 128})]))
@triton.jit
def flash_attention_kernel(q1, q2, k1, k2, v, o, s_q1b, s_q1t, s_q1h, s_q2b, s_q2t, s_q2h, s_k1b, s_k1s, s_k1h,
                           s_k2b, s_k2s, s_k2h, s_vb, s_vs, s_vh, s_ob, s_ot, s_oh, T, T_BUCKET, S, scale,
                           H: tl.constexpr, D1: tl.constexpr, D2: tl.constexpr, DV: tl.constexpr,
                           BD1: tl.constexpr, BD2: tl.constexpr, BDV: tl.constexpr, BM: tl.constexpr,
                           BN: tl.constexpr, DOT_F32: tl.constexpr, PREC: tl.constexpr):
    i_m, i_bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    o_t = i_m * BM + tl.arange(0, BM)
    o_d1, o_d2, o_dv = tl.arange(0, BD1), tl.arange(0, BD2), tl.arange(0, BDV)
    m_t = o_t < T

    p_q1 = q1 + i_b * s_q1b + o_t[:, None] * s_q1t + i_h * s_q1h + o_d1[None, :]
    b_q1 = tl.load(p_q1, mask=m_t[:, None] & (o_d1 < D1)[None, :], other=0.)
    if D2 > 0:
        p_q2 = q2 + i_b * s_q2b + o_t[:, None] * s_q2t + i_h * s_q2h + o_d2[None, :]
        b_q2 = tl.load(p_q2, mask=m_t[:, None] & (o_d2 < D2)[None, :], other=0.)
    if DOT_F32:
        b_q1 = b_q1.to(tl.float32)
        if D2 > 0:
            b_q2 = b_q2.to(tl.float32)

    b_max = tl.full([BM], float("-inf"), dtype=tl.float32)
    b_sum = tl.zeros([BM], dtype=tl.float32)
    b_acc = tl.zeros([BM, BDV], dtype=tl.float32)
    hi = tl.minimum(S, (i_m + 1) * BM + S - T)  # keys past this are masked for every row here
    for s0 in range(0, hi, BN):
        o_s = s0 + tl.arange(0, BN)
        m_s = o_s < S
        p_k1 = k1 + i_b * s_k1b + o_s[None, :] * s_k1s + i_h * s_k1h + o_d1[:, None]
        b_k1 = tl.load(p_k1, mask=(o_d1 < D1)[:, None] & m_s[None, :], other=0.)
        if DOT_F32:
            b_k1 = b_k1.to(tl.float32)
        b_s = tl.dot(b_q1, b_k1, input_precision=PREC)
        if D2 > 0:
            p_k2 = k2 + i_b * s_k2b + o_s[None, :] * s_k2s + i_h * s_k2h + o_d2[:, None]
            b_k2 = tl.load(p_k2, mask=(o_d2 < D2)[:, None] & m_s[None, :], other=0.)
            if DOT_F32:
                b_k2 = b_k2.to(tl.float32)
            b_s = tl.dot(b_q2, b_k2, b_s, input_precision=PREC)
        m_vis = (o_s[None, :] <= o_t[:, None] + S - T) & m_s[None, :]
        b_s = tl.where(m_vis, b_s * scale, float("-inf"))
        b_new = tl.maximum(b_max, tl.max(b_s, axis=1))  # finite: key 0 is visible to every row
        b_p = tl.exp(b_s - b_new[:, None])
        b_old = tl.exp(b_max - b_new)
        b_sum = b_sum * b_old + tl.sum(b_p, axis=1)
        p_v = v + i_b * s_vb + o_s[:, None] * s_vs + i_h * s_vh + o_dv[None, :]
        b_v = tl.load(p_v, mask=m_s[:, None] & (o_dv < DV)[None, :], other=0.)
        if DOT_F32:
            b_acc = b_acc * b_old[:, None] + tl.dot(b_p, b_v.to(tl.float32), input_precision=PREC)
        else:
            b_acc = b_acc * b_old[:, None] + tl.dot(b_p.to(b_v.dtype), b_v)
        b_max = b_new
    p_o = o + i_b * s_ob + o_t[:, None] * s_ot + i_h * s_oh + o_dv[None, :]
    tl.store(p_o, (b_acc / b_sum[:, None]).to(o.dtype.element_ty), mask=m_t[:, None] & (o_dv < DV)[None, :])


def _bthd(x: torch.Tensor) -> tuple[int, int, int]:
    """(batch, position, head) strides of a [B, L, H, D] or head-shared [B, L, D] operand."""
    if x.stride(-1) != 1:
        raise ValueError("flash_attention: the last dim of every operand must be contiguous")
    return (x.stride(0), x.stride(1), x.stride(2)) if x.dim() == 4 else (x.stride(0), x.stride(1), 0)


def flash_attention(q1: torch.Tensor, k1: torch.Tensor, v: torch.Tensor, scale: float,
                    q2: torch.Tensor | None = None, k2: torch.Tensor | None = None,
                    out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """o [B, T, H, DV] = softmax((q1 k1^T + q2 k2^T) * scale, causal bottom-right) v.

    q1 [B, T, H, D1], q2 [B, T, H, D2]; k1 [B, S, H, D1] or [B, S, D1] (one head for all);
    k2 likewise with D2; v [B, S, H, DV] or [B, S, DV]; S >= T. Views are fine as long as
    the last dim is contiguous."""
    check_device("flash_attention", q1, k1, v, q2, k2)
    B, T, H, D1 = q1.shape
    S, DV = k1.shape[1], v.shape[-1]
    if S < T:
        raise ValueError(f"flash_attention: {S} keys for {T} queries; the queries must be the last T keys")
    D2 = q2.shape[-1] if q2 is not None else 0
    o = q1.new_empty(B, T, H, DV, dtype=out_dtype or v.dtype)
    q2_, k2_ = (q2, k2) if q2 is not None else (q1, k1)
    grid = lambda meta: (triton.cdiv(T, meta["BM"]), B * H)
    flash_attention_kernel[grid](q1, q2_, k1, k2_, v, o, *_bthd(q1), *_bthd(q2_), *_bthd(k1), *_bthd(k2_), *_bthd(v),
                                 *_bthd(o), T, rows_bucket(T), S, float(scale), H=H, D1=D1, D2=D2, DV=DV, BD1=block(D1),
                                 BD2=block(max(D2, 1)), BDV=block(DV), DOT_F32=dots_in_fp32(q1, k1, v),
                                 PREC=dot_precision())
    return o


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """The IR op `causal_attention`: q [B, T, H, D], k [B, S, H, D], v [B, S, H, Dv]."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return flash_attention(q.contiguous(), k.contiguous(), v.contiguous(), scale)
