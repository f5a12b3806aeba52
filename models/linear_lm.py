"""The linear-attention ancestors of K3: linear attention, DeltaNet, Gated DeltaNet.

One pre-norm decoder (RMSNorm, SiLU-GLU MLP) whose token mixer is one of:
  linear_attention: q, k = elu + 1;           o, S, z = linear_attention(q, k, v)
  deltanet:         q, k, v = silu(conv(.)), q, k = l2norm;  o, S = delta_rule(q, k, v, beta)
  gated_deltanet:   as deltanet with g = -exp(A_log) softplus(a_proj x + dt_bias), one per head,
                    and an output gate: o = rmsnorm(o) * sigmoid(g_proj x)
State per layer: `S` [B, H, K, V] (+ `z` [B, H, K] for linear attention; + conv tails).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..kernels import ops
from ..kernels.kda.gate import l2norm
from .common import CausalLM, GatedMLP, RMSNorm, State, add_prefix, sub_state
from .configs import LinearConfig
from .kda_layer import ShortConv, pad_free
from .serving import Seq

MIXERS = ("linear_attention", "deltanet", "gated_deltanet")


class LinearMixer(nn.Module):
    def __init__(self, cfg: LinearConfig):
        super().__init__()
        if cfg.mixer not in MIXERS:
            raise ValueError(f"unknown mixer {cfg.mixer!r}; expected one of {MIXERS}")
        self.kind = cfg.mixer
        d, H, K, V = cfg.hidden_size, cfg.num_heads, cfg.head_k_dim, cfg.head_v_dim
        self.H, self.K, self.V = H, K, V
        self.q_proj = nn.Linear(d, H * K, bias=False)
        self.k_proj = nn.Linear(d, H * K, bias=False)
        self.v_proj = nn.Linear(d, H * V, bias=False)
        if self.kind != "linear_attention":
            self.q_conv1d = ShortConv(H * K, cfg.conv_size)
            self.k_conv1d = ShortConv(H * K, cfg.conv_size)
            self.v_conv1d = ShortConv(H * V, cfg.conv_size)
            self.b_proj = nn.Linear(d, H, bias=False)
            self.o_norm = RMSNorm(V, cfg.rms_norm_eps)
        if self.kind == "gated_deltanet":
            self.a_proj = nn.Linear(d, H, bias=False)
            self.A_log = nn.Parameter(torch.empty(H))
            self.dt_bias = nn.Parameter(torch.empty(H))
            self.g_proj = nn.Linear(d, H * V, bias=False)
        self.o_proj = nn.Linear(H * V, d, bias=False)

    def forward(self, x: torch.Tensor, state: State | None, seq: Seq | None = None) -> tuple[torch.Tensor, State]:
        B, T, _ = x.shape
        H, K, V = self.H, self.K, self.V
        st = state or {}
        lengths = seq.lengths if seq is not None else None
        S0 = st.get("S")
        if S0 is None:
            S0 = x.new_zeros(B, H, K, V, dtype=torch.float32)
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.kind == "linear_attention":
            z0 = st.get("z")
            if z0 is None:
                z0 = x.new_zeros(B, H, K, dtype=torch.float32)
            q = F.elu(q.view(B, T, H, K)) + 1
            k = F.elu(k.view(B, T, H, K)) + 1
            if lengths is not None:  # a zero key writes nothing to S or z
                k = torch.where(seq.valid(T)[:, :, None, None], k, torch.zeros((), dtype=k.dtype))
            o, S, z = ops.linear_attention(q, k, v.view(B, T, H, V), S0, z0, K**-0.5)
            return self.o_proj(o.reshape(B, T, H * V)), {"S": S, "z": z}
        q, cq = self.q_conv1d(q, st.get("conv_q"), lengths)
        k, ck = self.k_conv1d(k, st.get("conv_k"), lengths)
        v, cv = self.v_conv1d(v, st.get("conv_v"), lengths)
        q, k, v = l2norm(q.view(B, T, H, K)), l2norm(k.view(B, T, H, K)), v.view(B, T, H, V)
        beta = torch.sigmoid(self.b_proj(x).float())
        if self.kind == "deltanet":
            if lengths is not None:
                _, beta = pad_free(None, beta, seq.valid(T))
            o, S = ops.delta_rule(q, k, v, beta, S0, K**-0.5)
            o = self.o_norm(o)
        else:
            a = self.a_proj(x).float() + self.dt_bias.float()
            g = -self.A_log.float().exp() * F.softplus(a)
            if lengths is not None:
                g, beta = pad_free(g, beta, seq.valid(T))
            o, S = ops.gated_delta_rule(q, k, v, g, beta, S0, K**-0.5)
            o = (self.o_norm(o).float() * torch.sigmoid(self.g_proj(x).view(B, T, H, V).float()))
            o = o.to(x.dtype)
        y = self.o_proj(o.reshape(B, T, H * V))
        return y, {"S": S, "conv_q": cq, "conv_k": ck, "conv_v": cv}


class Layer(nn.Module):
    def __init__(self, cfg: LinearConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = LinearMixer(cfg)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, "silu")


class LinearLM(CausalLM):
    def __init__(self, cfg: LinearConfig):
        super().__init__()
        self.config = cfg
        self.model = nn.Module()
        self.model.embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.model.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.num_layers))
        self.model.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def step(self, input_ids: torch.Tensor, state: State | None,
             seq: Seq | None = None) -> tuple[torch.Tensor, State]:
        x = self.model.embeddings(input_ids)
        new_state: State = {}
        for i, layer in enumerate(self.model.layers):
            a, st = layer.attn(layer.attn_norm(x), sub_state(state, f"layers.{i}."), seq)
            new_state.update(add_prefix(st, f"layers.{i}."))
            x = x + a
            x = x + layer.mlp(layer.mlp_norm(x))
        return self.logits_of(self.model.norm(x), seq), new_state
