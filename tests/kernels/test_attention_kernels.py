"""Causal softmax attention with a cache, and MLA in its expanded and absorbed forms."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kernel_inputs import randn

from k3c.kernels import causal_attention, mla_attention, mla_attention_absorbed
from k3c.numerics import assert_close

B, H, D, DV = 2, 3, 16, 24


@pytest.mark.parametrize("T", [1, 7], ids=lambda t: f"T{t}")
def test_causal_attention_matches_sdpa(T):
    q, k, v = randn(B, T, H, D, seed=1), randn(B, T, H, D, seed=2), randn(B, T, H, DV, seed=3)
    ref = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         is_causal=True).transpose(1, 2)
    assert_close(causal_attention(q, k, v), ref, what="attention")


@pytest.mark.parametrize("T,S", [(1, 9), (4, 9)], ids=["T1-S9", "T4-S9"])
def test_causal_attention_with_cache(T, S):
    """Query t is position S - T + t and sees keys 0 .. S - T + t."""
    q, k, v = randn(B, T, H, D, seed=1), randn(B, S, H, D, seed=2), randn(B, S, H, DV, seed=3)
    scale = 0.3
    ref = torch.empty(B, T, H, DV)
    for t in range(T):
        n = S - T + t + 1
        p = (torch.einsum("bhd,bshd->bhs", q[:, t], k[:, :n]) * scale).softmax(-1)
        ref[:, t] = torch.einsum("bhs,bshv->bhv", p, v[:, :n])
    assert_close(causal_attention(q, k, v, scale), ref, what="attention with cache")


def mla_inputs(T: int, S: int):
    Dn, Dr, Dc, Dv = 8, 4, 12, 8
    q = randn(B, T, H, Dn + Dr, seed=1)
    ckv, krope = randn(B, S, Dc, seed=2), randn(B, S, Dr, seed=3)
    w_kv_b = randn(H * (Dn + Dv), Dc, seed=4, scale=0.3)
    return q, ckv, krope, w_kv_b, Dv


@pytest.mark.parametrize("T,S", [(1, 1), (6, 6), (3, 10)], ids=["T1-S1", "T6-S6", "T3-S10"])
def test_mla_absorbed_equals_expanded(T, S):
    q, ckv, krope, w_kv_b, Dv = mla_inputs(T, S)
    o = mla_attention(q, ckv, krope, w_kv_b, Dv)
    assert o.shape == (B, T, H, Dv)
    assert_close(mla_attention_absorbed(q, ckv, krope, w_kv_b, Dv), o, what="absorbed MLA")


def test_mla_cache_rows_match_full_prefill():
    """Attending from the last 3 positions over a cache equals the last rows of a prefill."""
    q, ckv, krope, w_kv_b, Dv = mla_inputs(10, 10)
    full = mla_attention(q, ckv, krope, w_kv_b, Dv)
    assert_close(mla_attention(q[:, -3:], ckv, krope, w_kv_b, Dv), full[:, -3:], what="cached rows")
