"""bf16 inputs through every Triton kernel under the interpreter (one awkward shape each): the
kernels load bf16, compute in fp32 (dot operands upcast first, as the interpreter's bf16 dot
is wrong) and store bf16, so each result equals the fp32 reference rounded to bf16."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from triton_inputs import B, delta, gen, randn

from k3c.ir import OPS
from k3c.kernels.attention.naive import causal_attention as attention_ref
from k3c.kernels.attention.triton import causal_attention
from k3c.kernels.attn_res.naive import attn_res_mix as attn_res_ref
from k3c.kernels.attn_res.triton import attn_res_mix
from k3c.kernels.delta.triton import chunk_kda, fused_recurrent
from k3c.kernels.gated_rmsnorm.naive import gated_rmsnorm as gated_rmsnorm_ref
from k3c.kernels.gated_rmsnorm.triton import gated_rmsnorm
from k3c.kernels.kda.naive import naive_recurrent_kda
from k3c.kernels.mla.naive import mla_attention_absorbed as absorbed_ref
from k3c.kernels.mla.triton import mla_attention_absorbed
from k3c.kernels.moe.triton import moe_experts
from k3c.kernels.short_conv.naive import naive_short_conv
from k3c.kernels.short_conv.triton import short_conv
from k3c.kernels.situ.naive import situ as situ_ref
from k3c.kernels.situ.triton import gated_mlp
from k3c.numerics import assert_close

BF16 = torch.bfloat16


def f32(*xs):
    return [x.float() for x in xs]


def case_chunk_kda():
    x = delta(65, 48, 32, dtype=BF16)
    o, S = chunk_kda(x.q, x.k, x.v, x.g, x.beta, scale=0.25, initial_state=x.state)
    o_ref, S_ref = naive_recurrent_kda(*f32(x.q, x.k, x.v, x.g, x.beta), 0.25, x.state)
    assert_close(S, S_ref, what="final state")  # fp32 from the same bf16 values
    return o, o_ref


def case_fused_recurrent():
    x = delta(3, 32, dtype=BF16, seed=1)
    o, S = fused_recurrent(x.q, x.k, x.v, x.g, x.beta, 0.25, x.state, gate="channel")
    o_ref, S_ref = naive_recurrent_kda(*f32(x.q, x.k, x.v, x.g, x.beta), 0.25, x.state)
    assert_close(S, S_ref, what="final state")
    return o, o_ref


def case_short_conv():
    x, w, s = randn(B, 65, 48, dtype=BF16), randn(48, 4, seed=1), randn(B, 48, 3, seed=2, dtype=BF16)
    return short_conv(x, w, s, "silu")[0], naive_short_conv(x.float(), w, s.float(), "silu")[0]


def case_gated_mlp():
    x, w = randn(B * 65, 40, dtype=BF16), randn(64, 40, seed=1, scale=0.3, dtype=BF16)
    gate, up = F.linear(x.float(), w.float()).chunk(2, dim=-1)
    return gated_mlp(x, w, "situ", 4.0, 25.0), situ_ref(gate, up, 4.0, 25.0)


def case_gated_rmsnorm():
    x, gate, w = randn(B, 65, 2, 48, dtype=BF16), randn(B, 65, 2, 48, seed=1, dtype=BF16), randn(48, seed=2)
    return gated_rmsnorm(x, gate, w.to(BF16)), gated_rmsnorm_ref(*f32(x, gate, w.to(BF16)))


def case_attn_res_mix():
    V, w, n = randn(3, B, 65, 48, scale=3.0, dtype=BF16), randn(48, seed=1), randn(48, seed=2)
    return attn_res_mix(V, w, n), attn_res_ref(V.float(), w, n)


def case_causal_attention():
    q, k, v = (randn(B, 65, 2, 48, seed=s, dtype=BF16) for s in range(3))
    return causal_attention(q, k, v, 0.2), attention_ref(*f32(q, k, v), 0.2)


def case_mla_absorbed():
    q, ckv, kr = randn(B, 1, 2, 48, dtype=BF16), randn(B, 9, 32, seed=1, dtype=BF16), randn(B, 9, 16, seed=2,
                                                                                          dtype=BF16)
    w = randn(2 * 64, 32, seed=3, scale=0.2, dtype=BF16)
    wh = w.view(2, 64, 32)
    return (mla_attention_absorbed(q, ckv, kr, wh[:, :32], wh[:, 32:], 0.15),
            absorbed_ref(*f32(q, ckv, kr, w), 32, 0.15))


def case_moe_experts():
    g = gen(0)
    idx = torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(65)]).to(randn(1).device)
    cw = torch.rand(65, 2, generator=g).to(idx.device)
    h, w13, w2 = randn(65, 40, dtype=BF16), randn(8, 64, 40, seed=1, scale=0.3, dtype=BF16), \
        randn(8, 24, 32, seed=2, scale=0.3, dtype=BF16)
    ref = OPS["moe_experts"].ref(*f32(h, w13, w2), idx, cw, act="situ", beta=4.0, linear_beta=25.0)
    return moe_experts(h, w13, w2, idx, cw, "situ", 4.0, 25.0), ref


CASES = {name.removeprefix("case_"): fn for name, fn in globals().items() if name.startswith("case_")}


@pytest.mark.parametrize("kernel", list(CASES))
def test_bf16_inputs(kernel):
    got, expected = CASES[kernel]()
    assert got.dtype == BF16
    assert_close(got, expected.to(BF16), dtype=BF16, what=f"{kernel} bf16")
