"""MoE routing and the routed expert GEMMs, against a dense all-experts computation."""

from __future__ import annotations

import torch
from kernel_inputs import randn

from k3c.kernels import moe_down, moe_gate_up, route, situ_packed
from k3c.numerics import assert_close

N, E, TOPK, D, I = 11, 6, 2, 16, 8


def routed(seed: int = 0):
    logits = randn(N, E, seed=seed, scale=2.0)
    return route(logits, torch.zeros(E), TOPK, 1.0)


def combine_matrix(idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """[N, E] with w[n, j] at column idx[n, j] and zeros elsewhere."""
    return torch.zeros(N, E).scatter(1, idx, w)


def test_route_selects_biased_but_weights_unbiased():
    logits = randn(N, E, seed=1, scale=2.0)
    bias = torch.zeros(E)
    bias[3] = 10.0  # expert 3 is picked for every token whatever its score
    idx, w = route(logits, bias, TOPK, 2.5)
    s = torch.sigmoid(logits)
    for n in range(N):
        order = sorted(range(E), key=lambda e: -(s[n, e] + bias[e]).item())[:TOPK]
        assert idx[n].tolist() == order and 3 in order
        expect = s[n, order] / s[n, order].sum() * 2.5
        assert_close(w[n], expect, what=f"weights of token {n}")


def test_route_without_renormalising():
    logits = randn(N, E, seed=1)
    idx, w = route(logits, torch.zeros(E), TOPK, 2.0, renormalize=False)
    assert_close(w, torch.sigmoid(logits).gather(1, idx) * 2.0, what="raw weights")


def test_gate_up_matches_dense():
    h, w13 = randn(N, D, seed=2), randn(E, 2 * I, D, seed=3)
    idx, _ = routed()
    dense = torch.einsum("nd,ecd->nec", h, w13)  # every token through every expert
    ref = dense.gather(1, idx[..., None].expand(N, TOPK, 2 * I))
    assert_close(moe_gate_up(h, w13, idx), ref, what="gate_up")


def test_down_matches_dense_combine():
    a, w2 = randn(N, TOPK, I, seed=4), randn(E, D, I, seed=5)
    idx, w = routed()
    a_dense = torch.zeros(N, E, I).scatter(1, idx[..., None].expand(N, TOPK, I), a)
    ref = torch.einsum("ne,nei,edi->nd", combine_matrix(idx, w), a_dense, w2)
    assert_close(moe_down(a, w2, idx, w), ref, what="down")


def test_experts_end_to_end_match_dense():
    h, w13, w2 = randn(N, D, seed=2), randn(E, 2 * I, D, seed=3), randn(E, D, I, seed=5)
    idx, w = routed()
    y = moe_down(situ_packed(moe_gate_up(h, w13, idx)), w2, idx, w)
    every = torch.einsum("edi,nei->ned", w2, situ_packed(torch.einsum("nd,ecd->nec", h, w13)))
    assert_close(y, torch.einsum("ne,ned->nd", combine_matrix(idx, w), every), what="moe")
