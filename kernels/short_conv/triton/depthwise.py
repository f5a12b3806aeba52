"""The causal depthwise short convolution with carried state, in Triton.

y[b, t, c] = act(sum_j w[c, j] x'[b, t + j, c]) over x' = [state ++ x] (W - 1 + T steps);
the new state is the last W - 1 steps of x'. One program per (block of BT steps, block of
BC channels, batch); the programs of the first time block also write the new state.
"""

from __future__ import annotations

import torch

from ...common.triton import autotune, check_device, prune_rows, rows_bucket

import triton  # isort: skip  (after common.triton has chosen the mode)
import triton.language as tl  # isort: skip


# The W taps' loads are all in flight at once (x and state, [BT, BC] each): tiles of 64 x 128
# at 4 warps spilled on sm_90, so a tile holds at most 32 values a thread. A decode step
# (T = 1) keeps the 16-step tile only (prune_rows). The interpreter takes 256 x 128 tiles.
@autotune(configs=[triton.Config({"BT": 64, "BC": 64}, num_warps=8), triton.Config({"BT": 32, "BC": 64}, num_warps=4),
                   triton.Config({"BT": 16, "BC": 128}, num_warps=4)],
          key=["T_BUCKET", "C", "W"], prune_configs_by=prune_rows("T", "BT"),
          interpreted=triton.Config({"BT": 256, "BC": 128}))
@triton.jit
def short_conv_kernel(x, w, state, y, state_out, T, T_BUCKET, C: tl.constexpr, W: tl.constexpr, BT: tl.constexpr,
                      BC: tl.constexpr, SILU: tl.constexpr):
    i_t, i_c, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    o_t = i_t * BT + tl.arange(0, BT)
    o_c = i_c * BC + tl.arange(0, BC)
    m_t, m_c = o_t < T, o_c < C
    p_state = state + i_b * C * (W - 1) + o_c[None, :] * (W - 1)

    b_y = tl.zeros([BT, BC], dtype=tl.float32)
    for j in tl.static_range(W):
        o_src = o_t - (W - 1) + j  # time of the input that tap j reads; < 0: from the state
        m_x = (o_src >= 0) & m_t
        b_x = tl.load(x + (i_b * T + o_src[:, None]) * C + o_c[None, :], mask=m_x[:, None] & m_c[None, :], other=0.)
        m_s = (o_src < 0) & m_t
        b_s = tl.load(p_state + (o_src + W - 1)[:, None], mask=m_s[:, None] & m_c[None, :], other=0.)
        b_w = tl.load(w + o_c * W + j, mask=m_c, other=0.).to(tl.float32)
        b_y += (b_x.to(tl.float32) + b_s.to(tl.float32)) * b_w[None, :]
    if SILU:
        b_y = b_y * tl.sigmoid(b_y)
    tl.store(y + (i_b * T + o_t[:, None]) * C + o_c[None, :], b_y.to(y.dtype.element_ty),
             mask=m_t[:, None] & m_c[None, :])

    if i_t == 0:  # the new state: steps T - (W - 1) .. T - 1 of [state ++ x]
        for j in tl.static_range(W - 1):
            # names of their own: the compiler rejects a scalar where a block of that name was
            i_src = T - (W - 1) + j
            b_xs = tl.load(x + (i_b * T + i_src) * C + o_c, mask=m_c & (i_src >= 0), other=0.)
            b_ss = tl.load(state + i_b * C * (W - 1) + o_c * (W - 1) + i_src + W - 1,
                           mask=m_c & (i_src < 0), other=0.)
            b_new = tl.where(i_src >= 0, b_xs.to(tl.float32), b_ss.to(tl.float32))
            tl.store(state_out + i_b * C * (W - 1) + o_c * (W - 1) + j, b_new.to(state_out.dtype.element_ty),
                     mask=m_c)


def short_conv(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor | None = None,
               activation: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [B, T, C], weight [C, W], state [B, C, W - 1] (None: zeros), activation "silu" or
    None/"none". Returns (y [B, T, C] in x's dtype, new state [B, C, W - 1] in state's dtype)."""
    check_device("short_conv", x, weight, state)
    if activation not in (None, "none", "silu"):
        raise ValueError(f"short_conv: unknown activation {activation!r} (expected 'silu' or None)")
    B, T, C = x.shape
    W = weight.shape[-1]
    x, weight = x.contiguous(), weight.reshape(C, W).contiguous()
    state = x.new_zeros(B, C, W - 1) if state is None else state.contiguous()
    y = torch.empty_like(x)
    state_out = torch.empty_like(state)
    grid = lambda meta: (triton.cdiv(T, meta["BT"]), triton.cdiv(C, meta["BC"]), B)
    short_conv_kernel[grid](x, weight, state, y, state_out, T, rows_bucket(T), C=C, W=W, SILU=activation == "silu")
    return y, state_out


__all__ = ["short_conv", "short_conv_kernel"]
