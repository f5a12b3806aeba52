"""The KDA token mixer of Kimi Linear and K3 (K3-SPEC.md section 2).

    q, k, v = silu(short_conv(W_{q,k,v} x))          three separate depthwise convs, kernel 4
    g       = gate(f_b_proj(f_a_proj(x)))            softplus (kimi-linear) | lower-bounded sigmoid (k3)
    beta    = sigmoid(b_proj(x));  q, k = l2norm(q), l2norm(k)
    o, S    = kda(q, k, v, g, beta, scale=K^-0.5, S0)
    o       = rmsnorm_V(o) * w * sigmoid(g_proj(x)) ; y = o_proj(o)

State: `S` [B, H, K, V] fp32 and the conv tails `conv_q`, `conv_k`, `conv_v` [B, C, 3]. In a
right-padded prefill (models/serving.py) padding tokens get g = 0 and beta = 0, so S passes
them unchanged, and each conv tail holds the inputs before its sequence's end.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..kernels import ops
from ..kernels.kda.gate import kda_gate_sigmoid, kda_gate_softplus, l2norm
from .common import RMSNorm, State
from .serving import Seq, conv_tail


class ShortConv(nn.Module):
    """Causal depthwise conv with silu; its weight is stored as nn.Conv1d's [C, 1, W]."""

    def __init__(self, channels: int, width: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(channels, 1, width))

    def forward(self, x: torch.Tensor, state: torch.Tensor | None,
                lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        C, _, W = self.weight.shape
        if state is None:
            state = x.new_zeros(x.shape[0], C, W - 1)
        y, tail = ops.short_conv(x, self.weight.view(C, W), state, "silu")
        return y, tail if lengths is None else conv_tail(x, state, lengths)


def pad_free(g: torch.Tensor | None, beta: torch.Tensor, valid: torch.Tensor):
    """g [B, T, H(, K)] and beta [B, T, H] with padding tokens at 0: the delta rule's state
    passes such a token unchanged (exp(0) = 1, nothing written)."""
    keep = valid[:, :, None]
    beta = torch.where(keep, beta, torch.zeros((), dtype=beta.dtype))
    if g is not None:
        g = torch.where(keep.view(*keep.shape, *[1] * (g.dim() - 3)), g, torch.zeros((), dtype=g.dtype))
    return g, beta


class KDAMixer(nn.Module):
    def __init__(self, d: int, heads: int, head_dim: int, conv_size: int = 4,
                 gate: str = "sigmoid", gate_lower_bound: float = -5.0,
                 out_gate_rank: int | None = None, norm_eps: float = 1e-5):
        super().__init__()
        H, K = heads, head_dim
        self.H, self.K, self.V = H, K, K
        self.gate, self.gate_lower_bound = gate, gate_lower_bound
        self.q_proj = nn.Linear(d, H * K, bias=False)
        self.k_proj = nn.Linear(d, H * K, bias=False)
        self.v_proj = nn.Linear(d, H * K, bias=False)
        self.q_conv1d = ShortConv(H * K, conv_size)
        self.k_conv1d = ShortConv(H * K, conv_size)
        self.v_conv1d = ShortConv(H * K, conv_size)
        self.A_log = nn.Parameter(torch.empty(H))
        self.f_a_proj = nn.Linear(d, K, bias=False)
        self.f_b_proj = nn.Linear(K, H * K, bias=False)
        self.dt_bias = nn.Parameter(torch.empty(H * K))
        self.b_proj = nn.Linear(d, H, bias=False)
        if out_gate_rank is None:
            self.g_proj = nn.Linear(d, H * K, bias=False)
        else:
            self.g_a_proj = nn.Linear(d, out_gate_rank, bias=False)
            self.g_b_proj = nn.Linear(out_gate_rank, H * K, bias=False)
        self.o_norm = RMSNorm(K, norm_eps)
        self.o_proj = nn.Linear(H * K, d, bias=False)

    def forward(self, x: torch.Tensor, state: State | None, seq: Seq | None = None) -> tuple[torch.Tensor, State]:
        B, T, _ = x.shape
        H, K, V = self.H, self.K, self.V
        st = state or {}
        lengths = seq.lengths if seq is not None else None
        q, cq = self.q_conv1d(self.q_proj(x), st.get("conv_q"), lengths)
        k, ck = self.k_conv1d(self.k_proj(x), st.get("conv_k"), lengths)
        v, cv = self.v_conv1d(self.v_proj(x), st.get("conv_v"), lengths)
        q, k = l2norm(q.view(B, T, H, K)), l2norm(k.view(B, T, H, K))
        v = v.view(B, T, H, V)
        f = self.f_b_proj(self.f_a_proj(x)).view(B, T, H, K)
        if self.gate == "softplus":
            g = kda_gate_softplus(f, self.A_log, self.dt_bias)
        else:
            g = kda_gate_sigmoid(f, self.A_log, self.dt_bias, self.gate_lower_bound)
        beta = torch.sigmoid(self.b_proj(x).float())
        if lengths is not None:  # padding leaves S as it is: no decay, no write
            g, beta = pad_free(g, beta, seq.valid(T))
        S0 = st.get("S")
        if S0 is None:
            S0 = x.new_zeros(B, H, K, V, dtype=torch.float32)
        o, S = ops.kda(q, k, v, g, beta, S0, K**-0.5)
        gate = self.g_proj(x) if hasattr(self, "g_proj") else self.g_b_proj(self.g_a_proj(x))
        o = (self.o_norm(o).float() * torch.sigmoid(gate.view(B, T, H, V).float())).to(x.dtype)
        y = self.o_proj(o.reshape(B, T, H * V))
        return y, {"S": S, "conv_q": cq, "conv_k": ck, "conv_v": cv}
