"""The three pieces of the chunked form one by one: intra-chunk preparation (decayed scores,
forward substitution), the state scan, and the output."""

from __future__ import annotations

import pytest
import torch
from kernel_inputs import delta_inputs, randn

from k3c.kernels import kda
from k3c.kernels.delta import chunk as dc
from k3c.numerics import assert_close


@pytest.mark.parametrize("C", [64, 48, 16, 7, 1], ids=lambda c: f"C{c}")
@pytest.mark.parametrize("decay", [0.05, 5.0], ids=["weak", "strong"])
def test_decay_scores_tree_equals_pairwise(C, decay):
    q, k = randn(2, 3, C, 32, seed=1), randn(2, 3, C, 32, seed=2)
    g = -decay * torch.rand(2, 3, C, 32, generator=torch.Generator().manual_seed(3))
    kk, qk, prefix, suffix = dc.channel_decay_scores(q, k, g)
    kk_ref, qk_ref = dc.channel_decay_scores_pairwise(q, k, g)
    assert (kk.triu() == 0).all() and (qk.triu(1) == 0).all()
    assert_close(kk, kk_ref, what="kk")
    assert_close(qk, qk_ref, what="qk")
    G = g.double().cumsum(-2)  # fp64: at G ~ -160 an fp32 cumsum is only good to 1e-5
    assert_close(prefix, dc.decay_exp(G).float(), what="exp(G)")
    assert_close(suffix, dc.decay_exp(G[..., -1:, :] - G).float(), what="exp(G_last - G)")


CB = [(64, 8), (16, 8), (12, 8), (12, 4), (5, 8)]


@pytest.mark.parametrize("C,block", CB, ids=[f"C{c}-block{b}" for c, b in CB])
def test_forward_substitution_inverts(C, block):
    L = randn(3, 2, C, C, seed=1, scale=0.2).tril(-1)
    eye = torch.eye(C)
    T = dc.unit_lower_inverse(L, block)
    assert_close(T @ (eye + L), eye.expand_as(L), what="T (I + L)")
    assert (T.triu(1) == 0).all()


@pytest.mark.parametrize("T,C", [(1, 16), (65, 16), (130, 64)], ids=["T1-C16", "T65-C16", "T130-C64"])
def test_pieces_shapes_and_start_states(T, C):
    """Start state n of the scan is the recurrent state after n * C steps."""
    x = delta_inputs(T, gate="channel", with_state=True)
    p = dc.chunk_delta_prepare(x.q, x.k, x.v, x.g, x.beta, C, "channel")
    B, _, H, K = x.q.shape
    V, NC = x.v.shape[-1], -(-T // C)
    assert p.w.shape == p.q_decayed.shape == p.k_decayed.shape == (B, H, NC, C, K)
    assert p.u.shape == (B, H, NC, C, V) and p.aqk.shape == (B, H, NC, C, C)
    assert p.decay_last.shape == (B, H, NC, K)
    v_new, starts, S = dc.chunk_state_scan(p.w, p.u, p.k_decayed, p.decay_last, x.state)
    assert v_new.shape == p.u.shape and starts.shape == (B, H, NC, K, V)
    for n in range(NC):
        s = x.sliced(0, n * C)
        S_ref = kda(s.q, s.k, s.v, s.g, s.beta, initial_state=x.state)[1] if n else x.state
        assert_close(starts[:, :, n], S_ref, what=f"start state of chunk {n}")
    o = dc.chunk_output(p.q_decayed, p.aqk, v_new, starts, K**-0.5, T)
    o_ref, S_ref = kda(x.q, x.k, x.v, x.g, x.beta, initial_state=x.state)
    assert_close(o, o_ref, what="output")
    assert_close(S, S_ref, what="final state")


def test_padding_leaves_the_state_alone():
    """Zero-padded steps (k = v = beta = g = 0) change nothing: T = 1 in a chunk of 64."""
    x = delta_inputs(1, gate="channel", with_state=True)
    p = dc.chunk_delta_prepare(x.q, x.k, x.v, x.g, x.beta, 64, "channel")
    assert torch.equal(p.k_decayed[:, :, :, 1:], torch.zeros_like(p.k_decayed[:, :, :, 1:]))
    assert torch.equal(p.u[:, :, :, 1:], torch.zeros_like(p.u[:, :, :, 1:]))
