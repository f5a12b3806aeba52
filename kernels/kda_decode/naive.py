"""The definition of KDA's decode step, composed from the definitions of its parts.

q_x, k_x [B, 1, H*K], v_x [B, 1, H*V] (the projections' rows before the short convs);
q_w, k_w [H*K, W], v_w [H*V, W]; q_conv, k_conv [B, H*K, W-1], v_conv [B, H*V, W-1];
f [B, 1, H, K] (the forget-gate projection), a [H, 1], dt_bias [H, K]; b [B, 1, H] (beta
before its sigmoid); state [B, H, K, V] fp32; o_gate [B, 1, H, V]; norm_w [V].
Returns (o [B, 1, H, V], state', q_conv', k_conv', v_conv').
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..gated_rmsnorm.naive import gated_rmsnorm
from ..kda.gate import l2norm
from ..kda.naive import naive_recurrent_kda
from ..short_conv.naive import naive_short_conv

GATES = ("sigmoid", "softplus")  # k3: lower_bound * sigmoid(a x); kimi-linear: a * softplus(x)


def kda_decode_gate(f: torch.Tensor, a: torch.Tensor, dt_bias: torch.Tensor, gate: str,
                    lower_bound: float) -> torch.Tensor:
    """The log-decay g [B, T, H, K] from f, the per-head a [H, 1] (exp(A_log) for "sigmoid",
    -exp(A_log) for "softplus") and dt_bias [H, K] (K3-SPEC.md section 2)."""
    x = f.float() + dt_bias.float()
    if gate == "sigmoid":
        return torch.sigmoid(a.float() * x) * lower_bound
    if gate == "softplus":
        return a.float() * F.softplus(x)
    raise ValueError(f"kda_decode_step: gate must be one of {GATES}, got {gate!r}")


def naive_kda_decode_step(q_x, k_x, v_x, q_w, k_w, v_w, q_conv, k_conv, v_conv, f, a, dt_bias, b, state,
                          o_gate, norm_w, *, scale: float, gate: str = "sigmoid", lower_bound: float = -5.0,
                          activation: str = "silu", qk_eps: float = 1e-6, eps: float = 1e-5):
    B, T, H, K = f.shape
    V = o_gate.shape[-1]
    act = None if activation == "none" else activation
    q, q_conv1 = naive_short_conv(q_x, q_w, q_conv, act)
    k, k_conv1 = naive_short_conv(k_x, k_w, k_conv, act)
    v, v_conv1 = naive_short_conv(v_x, v_w, v_conv, act)
    q = l2norm(q.view(B, T, H, K), qk_eps)
    k = l2norm(k.view(B, T, H, K), qk_eps)
    g = kda_decode_gate(f, a, dt_bias, gate, lower_bound)
    o, state1 = naive_recurrent_kda(q, k, v.view(B, T, H, V), g, torch.sigmoid(b.float()), scale, state)
    o = gated_rmsnorm(o, o_gate, norm_w, eps)
    return o.to(v_x.dtype), state1, q_conv1.to(q_conv.dtype), k_conv1.to(k_conv.dtype), v_conv1.to(v_conv.dtype)
