"""The KDA forget gates, l2norm, and the gated RMSNorm at the output of KDA."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from kernel_inputs import randn

from k3c.kernels import gated_rmsnorm, kda_gate_sigmoid, kda_gate_softplus, l2norm
from k3c.numerics import assert_close

H, K = 3, 8


def gate_inputs():
    return randn(2, 5, H, K, seed=1, scale=4.0), randn(H, seed=2), randn(H * K, seed=3)


def test_sigmoid_gate_formula_and_range():
    f, A_log, dt_bias = gate_inputs()
    g = kda_gate_sigmoid(f, A_log, dt_bias, -5.0)
    x = f + dt_bias.view(H, K)
    assert_close(g, -5.0 * torch.sigmoid(A_log.exp().view(H, 1) * x), what="k3 gate")
    assert (g >= -5.0).all() and (g < 0).all()


def test_softplus_gate_formula_and_sign():
    f, A_log, dt_bias = gate_inputs()
    g = kda_gate_softplus(f, A_log, dt_bias)
    ref = -A_log.exp().view(H, 1) * F.softplus(f + dt_bias.view(H, K))
    assert_close(g, ref, what="kimi-linear gate")
    assert (g <= 0).all()


def test_l2norm():
    x = randn(4, 7, K, seed=1, scale=3.0)
    assert_close(l2norm(x), x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6), what="l2norm")


def test_gated_rmsnorm():
    x, w, gate = randn(2, 5, 16, seed=1, scale=2.0), randn(16, seed=2), randn(2, 5, 16, seed=3)
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w * torch.sigmoid(gate)
    assert_close(gated_rmsnorm(x, gate, w), ref, what="gated rmsnorm")
