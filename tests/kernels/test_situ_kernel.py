"""SiTU (K3's gated activation) and the SiLU-GLU it replaces."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kernel_inputs import randn

from k3c.kernels import silu_glu, situ, situ_packed
from k3c.numerics import assert_close


def situ_formula(gate, up, beta=4.0, linear_beta=25.0):
    g, u = gate.double(), up.double()
    a = beta * torch.tanh(g / beta) * torch.sigmoid(g)
    return a * (u if linear_beta is None else linear_beta * torch.tanh(u / linear_beta))


@pytest.mark.parametrize("linear_beta", [25.0, None], ids=["lb25", "identity-up"])
def test_matches_formula(linear_beta):
    gate, up = randn(4, 7, 64, seed=1, scale=10.0), randn(4, 7, 64, seed=2, scale=40.0)
    out = situ(gate, up, 4.0, linear_beta)
    assert_close(out, situ_formula(gate, up, 4.0, linear_beta).float(), what="situ")


def test_bounded_for_huge_inputs():
    big = torch.tensor([0.0, 1.0, -1.0, 1e4, -1e4, 1e30, -1e30, float("inf"), float("-inf")])
    gate, up = torch.meshgrid(big, big, indexing="ij")
    out = situ(gate, up)
    assert torch.isfinite(out).all()
    assert out.abs().max() <= 100.0


def test_packed_takes_gate_first():
    gate, up = randn(3, 16, seed=1, scale=3.0), randn(3, 16, seed=2, scale=3.0)
    assert torch.equal(situ_packed(torch.cat([gate, up], dim=-1)), situ(gate, up))


def test_keeps_dtype():
    gate, up = randn(3, 16, seed=1).bfloat16(), randn(3, 16, seed=2).bfloat16()
    assert situ(gate, up).dtype == torch.bfloat16


def test_silu_glu():
    gate, up = randn(3, 16, seed=1), randn(3, 16, seed=2)
    assert_close(silu_glu(gate, up), F.silu(gate) * up, what="silu_glu")
