"""Attention in Triton under the interpreter: causal softmax attention (GPT-2), MLA in its
expanded prefill form and its absorbed decode form, against the naive references, with and
without a cache of earlier positions (bottom-right causal alignment)."""

from __future__ import annotations

import pytest
import torch
from triton_inputs import DTYPES, HEAD_DIMS, LENGTHS, B, randn

from k3c.kernels.attention.naive import causal_attention as attention_ref
from k3c.kernels.attention.triton import causal_attention
from k3c.kernels.mla.naive import mla_attention as mla_ref
from k3c.kernels.mla.naive import mla_attention_absorbed as absorbed_ref
from k3c.kernels.mla.triton import mla_attention, mla_attention_absorbed
from k3c.numerics import assert_close

H = 3
dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
lengths = pytest.mark.parametrize("T", LENGTHS, ids=lambda t: f"T{t}")
cached = pytest.mark.parametrize("P", [0, 5], ids=["no-cache", "cache5"])


@dtypes
@pytest.mark.parametrize("D", HEAD_DIMS, ids=lambda d: f"D{d}")
@lengths
@cached
def test_causal_attention(T, P, D, dtype):
    S = T + P
    q, k, v = randn(B, T, H, D, dtype=dtype), randn(B, S, H, D, seed=1, dtype=dtype), \
        randn(B, S, H, D + 16, seed=2, dtype=dtype)
    assert_close(causal_attention(q, k, v, 0.2), attention_ref(q, k, v, 0.2), what="causal attention")


def mla_inputs(T: int, P: int, Dn: int, dtype: torch.dtype):
    """q [B, T, H, Dn + Dr], ckv [B, S, Dc], krope [B, S, Dr], kv_b_proj weight [H (Dn + Dv), Dc]."""
    Dr, Dc, Dv = 16, 32, Dn + 16
    S = T + P
    return (randn(B, T, H, Dn + Dr, dtype=dtype), randn(B, S, Dc, seed=1, dtype=dtype),
            randn(B, S, Dr, seed=2, dtype=dtype), randn(H * (Dn + Dv), Dc, seed=3, scale=0.2, dtype=dtype), Dv)


@dtypes
@pytest.mark.parametrize("Dn", HEAD_DIMS, ids=lambda d: f"nope{d}")
@lengths
@cached
def test_mla_prefill(T, P, Dn, dtype):
    q, ckv, krope, w, Dv = mla_inputs(T, P, Dn, dtype)
    assert_close(mla_attention(q, ckv, krope, w, Dv, 0.15), mla_ref(q, ckv, krope, w, Dv, 0.15), what="MLA")


@dtypes
@pytest.mark.parametrize("Dn", HEAD_DIMS, ids=lambda d: f"nope{d}")
@pytest.mark.parametrize("T,P", [(1, 0), (1, 64), (63, 2), (65, 0)], ids=["T1", "T1-cache64", "T63-cache2", "T65"])
def test_mla_absorbed_decode(T, P, Dn, dtype):
    q, ckv, krope, w, Dv = mla_inputs(T, P, Dn, dtype)
    w_heads = w.view(H, Dn + Dv, -1)
    got = mla_attention_absorbed(q, ckv, krope, w_heads[:, :Dn], w_heads[:, Dn:], 0.15)
    assert_close(got, absorbed_ref(q, ckv, krope, w, Dv, 0.15), what="absorbed MLA")


def test_more_queries_than_keys_is_a_clear_error():
    q, k = randn(1, 4, 1, 16), randn(1, 3, 1, 16)
    with pytest.raises(ValueError, match="3 keys for 4 queries"):
        causal_attention(q, k, k, 0.25)
