"""attn_res_mix: the Block Attention Residual mix over committed blocks and the partial sum."""

from __future__ import annotations

import torch
from kernel_inputs import randn

from k3c.kernels import attn_res_mix
from k3c.numerics import assert_close

N, B, T, D = 4, 2, 5, 32


def mix_einsum(V, w, n, eps=1e-5):
    keys = V / torch.sqrt(V.pow(2).mean(-1, keepdim=True) + eps)
    scores = torch.einsum("nbtd,d->nbt", keys, n * w)
    return torch.einsum("nbt,nbtd->btd", scores.softmax(dim=0), V)


def test_matches_einsum():
    V, w, n = randn(N, B, T, D, seed=1, scale=3.0), randn(D, seed=2), 1 + randn(D, seed=3, scale=0.1)
    assert_close(attn_res_mix(V, w, n), mix_einsum(V, w, n), what="mix")


def test_zero_query_mixes_uniformly():
    V, n = randn(N, B, T, D, seed=1), randn(D, seed=3)
    assert_close(attn_res_mix(V, torch.zeros(D), n), V.mean(0), what="uniform mix")


def test_single_candidate_passes_through():
    V = randn(1, B, T, D, seed=1)
    assert_close(attn_res_mix(V, randn(D, seed=2), randn(D, seed=3)), V[0], what="one candidate")
