"""The per-layer Triton kernels under the interpreter against their naive references: the
short convolution with state, SiTU (elementwise and fused into the gate/up GEMM), the
(gated) RMSNorm and the AttnRes mix, at T in {1, 63, 65}, widths 32 and 48, fp32 and fp16."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from triton_inputs import DTYPES, HEAD_DIMS, LENGTHS, B, randn

from k3c.kernels.attn_res.naive import attn_res_mix as attn_res_ref
from k3c.kernels.attn_res.triton import attn_res_mix
from k3c.kernels.gated_rmsnorm.naive import gated_rmsnorm as gated_rmsnorm_ref
from k3c.kernels.gated_rmsnorm.triton import gated_rmsnorm, l2norm, rms_norm
from k3c.kernels.short_conv.naive import naive_short_conv
from k3c.kernels.short_conv.triton import short_conv
from k3c.kernels.situ.naive import silu_glu
from k3c.kernels.situ.naive import situ as situ_ref
from k3c.kernels.situ.triton import gated_mlp, situ
from k3c.numerics import assert_close

dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
widths = pytest.mark.parametrize("D", HEAD_DIMS, ids=lambda d: f"D{d}")
lengths = pytest.mark.parametrize("T", LENGTHS, ids=lambda t: f"T{t}")


@dtypes
@widths
@lengths
@pytest.mark.parametrize("activation", ["silu", None], ids=["silu", "linear"])
def test_short_conv_with_state(T, D, dtype, activation):
    x, w, s = randn(B, T, D, dtype=dtype), randn(D, 4, seed=1), randn(B, D, 3, seed=2, dtype=dtype)
    y, s_new = short_conv(x, w, s, activation)
    y_ref, s_ref = naive_short_conv(x, w, s, activation)
    assert_close(y, y_ref, what="y")
    assert torch.equal(s_new, s_ref.to(s.dtype)), "the new state is the last W - 1 inputs, copied"


def test_short_conv_state_carries_across_calls():
    x, w = randn(B, 65, 32), randn(32, 4, seed=1)
    y1, s1 = short_conv(x[:, :2], w, None, "silu")
    y2, s2 = short_conv(x[:, 2:], w, s1, "silu")
    y_ref, s_ref = naive_short_conv(x, w, None, "silu")
    assert_close(torch.cat([y1, y2], 1), y_ref, what="split conv")
    assert torch.equal(s2, s_ref)


@dtypes
@widths
@lengths
@pytest.mark.parametrize("linear_beta", [25.0, None], ids=["k3", "no-linear-tanh"])
def test_situ_elementwise(T, D, dtype, linear_beta):
    gate, up = randn(B, T, D, scale=6.0, dtype=dtype), randn(B, T, D, seed=1, scale=40.0, dtype=dtype)
    assert_close(situ(gate, up, 4.0, linear_beta), situ_ref(gate, up, 4.0, linear_beta), what="situ")


@dtypes
@widths
@lengths
@pytest.mark.parametrize("act", ["situ", "silu"])
def test_gated_mlp_fuses_the_activation_into_the_gemm(T, D, dtype, act):
    x, w = randn(B, T, 40, dtype=dtype), randn(2 * D, 40, seed=1, scale=0.3, dtype=dtype)
    gate, up = F.linear(x.float(), w.float()).chunk(2, dim=-1)
    expected = (situ_ref(gate, up, 4.0, 25.0) if act == "situ" else silu_glu(gate, up)).to(dtype)
    assert_close(gated_mlp(x, w, act, 4.0, 25.0), expected, what=f"gated_mlp {act}")


def test_gated_mlp_says_what_is_wrong():
    with pytest.raises(ValueError, match=r"weight must be \[2I, 40\]"):
        gated_mlp(randn(2, 40), randn(33, 40))


@dtypes
@widths
@lengths
def test_gated_rmsnorm(T, D, dtype):
    x, gate, w = randn(B, T, 2, D, scale=3.0, dtype=dtype), randn(B, T, 2, D, seed=1, dtype=dtype), \
        randn(D, seed=2, dtype=dtype)
    assert_close(gated_rmsnorm(x, gate, w, 1e-5), gated_rmsnorm_ref(x, gate, w, 1e-5), what="gated rmsnorm")


@dtypes
@widths
@pytest.mark.parametrize("weighted", [True, False], ids=["weight", "no-weight"])
def test_rms_norm(D, dtype, weighted):
    x, w = randn(B, 65, D, scale=3.0, dtype=dtype), randn(D, seed=1, dtype=dtype) if weighted else None
    expected = F.rms_norm(x.float(), (D,), None if w is None else w.float(), 1e-6).to(dtype)
    assert_close(rms_norm(x, w, 1e-6), expected, what="rms_norm")


@dtypes
@widths
@lengths
@pytest.mark.parametrize("N", [1, 4], ids=lambda n: f"N{n}")
def test_attn_res_mix(T, D, dtype, N):
    V = randn(N, B, T, D, scale=3.0, dtype=dtype)
    w, n = randn(D, seed=1), randn(D, seed=2)
    assert_close(attn_res_mix(V, w, n, 1e-5), attn_res_ref(V, w, n, 1e-5), what="attn_res_mix")


@dtypes
@widths
def test_l2norm(D, dtype):
    from k3c.kernels.kda.gate import l2norm as l2norm_ref

    x = randn(B, 65, 2, D, scale=3.0, dtype=dtype)
    assert_close(l2norm(x, 1e-6), l2norm_ref(x, 1e-6).to(dtype), what="l2norm")
