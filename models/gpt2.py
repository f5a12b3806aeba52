"""GPT-2: learned positions, pre-LayerNorm blocks, causal softmax MHA with a KV cache.

State: `layers.{i}.k` and `layers.{i}.v` [B, P, H, D], the keys and values of P tokens; with
fixed-capacity caches (models/serving.py) [B, N, H, D], each sequence at its own position.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..kernels import ops
from .common import CausalLM, State
from .configs import GPT2Config
from .serving import Seq, into_cache, zero_padding


class Attention(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.H, self.D = cfg.n_head, cfg.n_embd // cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor, state: State | None, seq: Seq | None = None) -> tuple[torch.Tensor, State]:
        B, T, _ = x.shape
        C = self.H * self.D  # the heads this module holds (a tp rank holds some of them)
        q, k, v = (t.view(B, T, self.H, self.D) for t in self.c_attn(x).split(C, dim=2))
        if state is not None and seq is not None and seq.positions is not None:  # fixed-capacity caches
            k = ops.cache_write(state["k"], k, seq.positions)
            v = ops.cache_write(state["v"], v, seq.positions)
            o = ops.causal_attention_cached(q, k, v, seq.positions, self.D**-0.5)
            return self.c_proj(o.reshape(B, T, C)), {"k": k, "v": v}
        if state is not None:
            k = torch.cat([state["k"], k], dim=1)
            v = torch.cat([state["v"], v], dim=1)
        elif seq is not None and seq.lengths is not None:  # padding rows are cached as zeros
            k, v = zero_padding(k, seq), zero_padding(v, seq)
        o = ops.causal_attention(q, k, v, self.D**-0.5)
        if state is None and seq is not None and seq.fixed:
            k, v = into_cache(k, seq.max_context), into_cache(v, seq.max_context)
        return self.c_proj(o.reshape(B, T, C)), {"k": k, "v": v}


class MLP(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps)
        self.attn = Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps)
        self.mlp = MLP(cfg)


class GPT2(CausalLM):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.config = cfg
        self.transformer = nn.Module()
        self.transformer.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.transformer.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd)
        self.transformer.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.transformer.ln_f = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied, as in GPT-2

    def step(self, input_ids: torch.Tensor, state: State | None,
             seq: Seq | None = None) -> tuple[torch.Tensor, State]:
        T = input_ids.shape[1]
        if state is not None and seq is not None and seq.positions is not None:  # each sequence at its own
            pos = seq.positions[:, None] + torch.arange(T, device=input_ids.device)[None, :]
        else:
            past = 0 if state is None else state["layers.0.k"].shape[1]
            pos = torch.arange(past, past + T, device=input_ids.device)
        x = self.transformer.wte(input_ids) + self.transformer.wpe(pos)
        new_state: State = {}
        for i, block in enumerate(self.transformer.h):
            st = None if state is None else {"k": state[f"layers.{i}.k"], "v": state[f"layers.{i}.v"]}
            a, st = block.attn(block.ln_1(x), st, seq)
            new_state.update({f"layers.{i}.{n}": t for n, t in st.items()})
            x = x + a
            x = x + block.mlp(block.ln_2(x))
        return self.logits_of(self.transformer.ln_f(x), seq), new_state
