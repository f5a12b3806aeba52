"""k3c's recurrent and fused ops as pure torch.library custom ops (namespace `k3c`).

torch.export keeps each as one node with dynamic B and T; the frontend maps each to the IR
op of the same name. Nothing is mutated: a state goes in and the new state comes out.
The eager implementations call the references in this package (chunked for prefill).
"""

from __future__ import annotations

import torch

from .attention.naive import causal_attention as _causal_attention
from .attn_res.naive import attn_res_mix as _attn_res_mix
from .mla.naive import mla_attention as _mla_attention
from .moe.naive import moe_down as _moe_down
from .moe.naive import moe_gate_up as _moe_gate_up
from .short_conv.naive import naive_short_conv

Tensor = torch.Tensor

# Prefill runs the chunked form in eager mode; it equals the recurrent definition (tests).
EAGER_CHUNK_SIZE = 64


def _eager_chunk(T: int) -> int | None:
    return EAGER_CHUNK_SIZE if T > 1 else None


@torch.library.custom_op("k3c::kda", mutates_args=())
def kda(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor,
        scale: float) -> tuple[Tensor, Tensor]:
    from .kda import kda as f

    o, s = f(q, k, v, g, beta, scale=scale, initial_state=state, chunk_size=_eager_chunk(q.shape[1]))
    return o.contiguous(), s.contiguous()


@torch.library.custom_op("k3c::gated_delta_rule", mutates_args=())
def gated_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor,
                     scale: float) -> tuple[Tensor, Tensor]:
    from .gated_delta_rule import gated_delta_rule as f

    o, s = f(q, k, v, g, beta, scale=scale, initial_state=state, chunk_size=_eager_chunk(q.shape[1]))
    return o.contiguous(), s.contiguous()


@torch.library.custom_op("k3c::delta_rule", mutates_args=())
def delta_rule(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, state: Tensor,
               scale: float) -> tuple[Tensor, Tensor]:
    from .delta_rule import delta_rule as f

    o, s = f(q, k, v, beta, scale=scale, initial_state=state, chunk_size=_eager_chunk(q.shape[1]))
    return o.contiguous(), s.contiguous()


@torch.library.custom_op("k3c::linear_attention", mutates_args=())
def linear_attention(q: Tensor, k: Tensor, v: Tensor, state: Tensor, z: Tensor,
                     scale: float) -> tuple[Tensor, Tensor, Tensor]:
    from .linear_attention import linear_attention as f

    o, (s, zz) = f(q, k, v, scale=scale, initial_state=(state, z), chunk_size=_eager_chunk(q.shape[1]))
    return o.contiguous(), s.contiguous(), zz.contiguous()


def _delta_fake(q, k, v, state):
    B, T, H, _ = q.shape
    return q.new_empty(B, T, H, v.shape[-1], dtype=v.dtype), state.new_empty(state.shape)


kda.register_fake(lambda q, k, v, g, beta, state, scale: _delta_fake(q, k, v, state))
gated_delta_rule.register_fake(lambda q, k, v, g, beta, state, scale: _delta_fake(q, k, v, state))
delta_rule.register_fake(lambda q, k, v, beta, state, scale: _delta_fake(q, k, v, state))


@linear_attention.register_fake
def _(q, k, v, state, z, scale):
    o, s = _delta_fake(q, k, v, state)
    return o, s, z.new_empty(z.shape)


@torch.library.custom_op("k3c::short_conv", mutates_args=())
def short_conv(x: Tensor, weight: Tensor, state: Tensor, activation: str) -> tuple[Tensor, Tensor]:
    y, s = naive_short_conv(x, weight, state, None if activation == "none" else activation)
    return y.contiguous(), s.to(state.dtype)


@short_conv.register_fake
def _(x, weight, state, activation):
    return x.new_empty(x.shape), state.new_empty(state.shape)


@torch.library.custom_op("k3c::causal_attention", mutates_args=())
def causal_attention(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    return _causal_attention(q, k, v, scale).contiguous()


@causal_attention.register_fake
def _(q, k, v, scale):
    return v.new_empty(q.shape[:-1] + (v.shape[-1],))


@torch.library.custom_op("k3c::mla_attention", mutates_args=())
def mla_attention(q: Tensor, ckv: Tensor, krope: Tensor, w_kv_b: Tensor, v_head_dim: int,
                  scale: float) -> Tensor:
    return _mla_attention(q, ckv, krope, w_kv_b, v_head_dim, scale).contiguous()


@mla_attention.register_fake
def _(q, ckv, krope, w_kv_b, v_head_dim, scale):
    return q.new_empty(q.shape[:-1] + (v_head_dim,))


@torch.library.custom_op("k3c::attn_res_mix", mutates_args=())
def attn_res_mix(V: Tensor, w: Tensor, n: Tensor, eps: float) -> Tensor:
    return _attn_res_mix(V, w, n, eps)


@attn_res_mix.register_fake
def _(V, w, n, eps):
    return V.new_empty(V.shape[1:])


@torch.library.custom_op("k3c::moe_gate_up", mutates_args=())
def moe_gate_up(h: Tensor, w13: Tensor, idx: Tensor) -> Tensor:
    return _moe_gate_up(h, w13, idx)


@moe_gate_up.register_fake
def _(h, w13, idx):
    return h.new_empty(idx.shape[0], idx.shape[1], w13.shape[1])


@torch.library.custom_op("k3c::moe_down", mutates_args=())
def moe_down(a: Tensor, w2: Tensor, idx: Tensor, w: Tensor) -> Tensor:
    return _moe_down(a, w2, idx, w)


@moe_down.register_fake
def _(a, w2, idx, w):
    return a.new_empty(a.shape[0], w2.shape[1])
