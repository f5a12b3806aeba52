"""MLA (multi-head latent attention), NoPE, optionally gated (K3-SPEC.md section 3).

    q        = q_b_proj(rmsnorm(q_a_proj(x)))  | q_proj(x)     -> [B, T, H, nope + rope]
    ckv|krope = kv_a_proj_with_mqa(x);  ckv = rmsnorm(ckv)      the latent cache entries
    o        = mla_attention(q, cache ++ ckv, cache ++ krope, kv_b_proj.weight)
    o        = o * sigmoid(g_proj(x))   (k3);   y = o_proj(o)

State: the latent cache `ckv` [B, P, kv_lora] and `krope` [B, P, rope], P tokens so far; with
fixed-capacity caches (models/serving.py) [B, N, ...] at capacity, row positions[b] written by
cache_write and attended to with mla_attention_cached, which sees each sequence's own rows.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..kernels import ops
from .common import RMSNorm, State
from .serving import Seq, into_cache, zero_padding


class MLAMixer(nn.Module):
    def __init__(self, d: int, heads: int, q_lora_rank: int | None, kv_lora_rank: int,
                 qk_nope_head_dim: int, qk_rope_head_dim: int, v_head_dim: int,
                 output_gate: bool, norm_eps: float = 1e-6):
        super().__init__()
        self.H, self.nope, self.rope, self.vdim = heads, qk_nope_head_dim, qk_rope_head_dim, v_head_dim
        self.kv_lora_rank = kv_lora_rank
        qk = qk_nope_head_dim + qk_rope_head_dim
        if q_lora_rank is None:
            self.q_proj = nn.Linear(d, heads * qk, bias=False)
        else:
            self.q_a_proj = nn.Linear(d, q_lora_rank, bias=False)
            self.q_a_layernorm = RMSNorm(q_lora_rank, norm_eps)
            self.q_b_proj = nn.Linear(q_lora_rank, heads * qk, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(d, kv_lora_rank + qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(kv_lora_rank, norm_eps)
        self.kv_b_proj = nn.Linear(kv_lora_rank, heads * (qk_nope_head_dim + v_head_dim), bias=False)
        if output_gate:
            self.g_proj = nn.Linear(d, heads * v_head_dim, bias=False)
        self.o_proj = nn.Linear(heads * v_head_dim, d, bias=False)
        self.scale = qk**-0.5

    def forward(self, x: torch.Tensor, state: State | None, seq: Seq | None = None) -> tuple[torch.Tensor, State]:
        B, T, _ = x.shape
        H = self.H
        if hasattr(self, "q_proj"):
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(B, T, H, self.nope + self.rope)
        ckv, krope = self.kv_a_proj_with_mqa(x).split([self.kv_lora_rank, self.rope], dim=-1)
        # the split is a view into the projection's rows ([B, T, kv_lora + rope] strides): a prefill
        # would hand it back as the state, unlike a decode step's cat, and torch.compile guards on
        # the strides (one recompile of decode). The capture reads contiguous() as the identity.
        krope = krope.contiguous()
        ckv = self.kv_a_layernorm(ckv)
        w = self.kv_b_proj.weight
        if state is not None and seq is not None and seq.positions is not None:  # fixed-capacity caches
            ckv = ops.cache_write(state["ckv"], ckv, seq.positions)
            krope = ops.cache_write(state["krope"], krope, seq.positions)
            o = ops.mla_attention_cached(q, ckv, krope, w, seq.positions, self.vdim, self.scale)
        else:
            if state is not None:
                ckv = torch.cat([state["ckv"], ckv], dim=1)
                krope = torch.cat([state["krope"], krope], dim=1)
            elif seq is not None and seq.lengths is not None:  # padding rows are cached as zeros
                ckv, krope = zero_padding(ckv, seq), zero_padding(krope, seq)
            o = ops.mla_attention(q, ckv, krope, w, self.vdim, self.scale)
            if state is None and seq is not None and seq.fixed:
                ckv, krope = into_cache(ckv, seq.max_context), into_cache(krope, seq.max_context)
        o = o.reshape(B, T, H * self.vdim)
        if hasattr(self, "g_proj"):
            o = o * torch.sigmoid(self.g_proj(x))
        return self.o_proj(o), {"ckv": ckv, "krope": krope}
