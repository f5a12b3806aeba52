"""The recurrent form of KDA in Triton: the decode step (and any short T), token by token.

One program per (block of BV value columns, batch * head) keeps its [K, BV] slice of the
state in fp32 registers:

    for t:  S = exp(g_t)[:, None] * S;  v_t = beta_t (v_t - k_t^T S);  S += k_t v_t^T;
            o_t = scale q_t^T S

The gate is read through strides, so the gated delta rule (stride 0 over K) and the delta
rule (a zero gate) share the kernel; DELTA=False drops beta and the correction (linear
attention, whose normaliser rides along as an all-ones value column).
"""

from __future__ import annotations

import torch

from ...common.triton import autotune, block, check_device

import triton  # isort: skip  (after common.triton has chosen the mode)
import triton.language as tl  # isort: skip


@autotune(configs=[triton.Config({"BV": 64}, num_warps=4), triton.Config({"BV": 32}, num_warps=2),
                   triton.Config({"BV": 16}, num_warps=1), triton.Config({"BV": 64}, num_warps=8)],
          key=["K", "V"])
@triton.jit
def fused_recurrent_kernel(q, k, v, g, beta, h0, o, ht, scale, s_gb, s_gt, s_gh, s_gk, s_bb, s_bt, s_bh, T,
                           H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                           DELTA: tl.constexpr):
    i_v, i_bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    p_kv = i_bh * K * V + o_k[:, None] * V + o_v[None, :]

    b_S = tl.load(h0 + p_kv, mask=m_kv, other=0.).to(tl.float32)
    p_q = q + i_b * T * H * K + i_h * K + o_k  # step t: + t * H * K
    p_k = k + i_b * T * H * K + i_h * K + o_k
    p_v = v + i_b * T * H * V + i_h * V + o_v
    p_o = o + i_b * T * H * V + i_h * V + o_v
    p_g = g + i_b * s_gb + i_h * s_gh + o_k * s_gk
    p_beta = beta + i_b * s_bb + i_h * s_bh
    for t in range(T):
        b_q = tl.load(p_q + t * H * K, mask=m_k, other=0.).to(tl.float32)
        b_k = tl.load(p_k + t * H * K, mask=m_k, other=0.).to(tl.float32)
        b_v = tl.load(p_v + t * H * V, mask=m_v, other=0.).to(tl.float32)
        b_g = tl.load(p_g + t * s_gt, mask=m_k, other=0.).to(tl.float32)
        b_S = b_S * tl.exp(b_g)[:, None]
        if DELTA:
            b_beta = tl.load(p_beta + t * s_bt).to(tl.float32)
            b_v = b_beta * (b_v - tl.sum(b_k[:, None] * b_S, axis=0))
        b_S += b_k[:, None] * b_v[None, :]
        b_o = scale * tl.sum(b_q[:, None] * b_S, axis=0)
        tl.store(p_o + t * H * V, b_o.to(o.dtype.element_ty), mask=m_v)
    tl.store(ht + p_kv, b_S, mask=m_kv)


def fused_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None,
                    beta: torch.Tensor | None, scale: float, state: torch.Tensor | None,
                    out_dtype: torch.dtype | None = None, *, gate: str) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k [B, T, H, K]; v [B, T, H, V]; g [B, T, H, K] (gate "channel"), [B, T, H] ("head") or
    None ("none", "linear"); beta [B, T, H] or None (no delta correction); state [B, H, K, V]
    fp32 or None. Returns (o [B, T, H, V] in v's dtype or `out_dtype`, final state fp32)."""
    check_device("fused_recurrent", q, k, v, g, beta, state)
    if (g is not None) != (gate in ("channel", "head")):
        raise ValueError(f"fused_recurrent: gate {gate!r} {'needs a' if g is None else 'takes no'} g")
    B, T, H, K = q.shape
    V = v.shape[-1]
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    if g is None:  # the kernel reads the gate through strides: a zero gate, stride 0 everywhere
        g = q.new_zeros(1, dtype=torch.float32).expand(B, T, H, K)
    elif gate == "head":  # one decay per head: stride 0 over K
        g = g.contiguous()[..., None].expand(B, T, H, K)
    else:
        g = g.contiguous()
    bv = beta.contiguous() if beta is not None else q.new_ones(1).expand(B, T, H)
    h0 = q.new_zeros(B, H, K, V, dtype=torch.float32) if state is None else state.float().contiguous()
    o = v.new_empty(B, T, H, V, dtype=out_dtype or v.dtype)
    ht = torch.empty_like(h0)
    grid = lambda meta: (triton.cdiv(V, meta["BV"]), B * H)
    fused_recurrent_kernel[grid](q, k, v, g, bv, h0, o, ht, float(scale), *g.stride(), *bv.stride(), T,
                                 H=H, K=K, V=V, BK=block(K), DELTA=beta is not None)
    return o, ht


def recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None = None,
              beta: torch.Tensor | None = None, state: torch.Tensor | None = None, z: torch.Tensor | None = None,
              *, scale: float, gate: str):
    """Any delta-family op token by token, by its gate kind (ir/ops/delta_family.py): the IR
    op's inputs by name, its outputs in its order. Gate "linear" (normalised linear
    attention): the normaliser z rides along as an all-ones value column, so S and z share
    one recurrence (no beta, no delta correction), and o = (q S) / (q z)."""
    if gate != "linear":
        return fused_recurrent(q, k, v, g, beta, scale, state, gate=gate)
    V = v.shape[-1]
    v1 = torch.cat([v.float(), v.new_ones(*v.shape[:-1], 1, dtype=torch.float32)], dim=-1)
    S1 = torch.cat([state.float(), z.float()[..., None]], dim=-1)
    o1, S1 = fused_recurrent(q, k, v1, None, None, scale, S1, out_dtype=torch.float32, gate="none")
    o = (o1[..., :V] / o1[..., V:]).to(v.dtype)
    return o, S1[..., :V].contiguous(), S1[..., V].contiguous()
