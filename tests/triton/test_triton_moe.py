"""Routed experts in Triton under the interpreter: the sort by expert and the grouped GEMMs
(gate/up alone, down with the combine weights, and the whole expert with SiTU or SiLU-GLU in
the gate/up epilogue) against the naive per-expert loops."""

from __future__ import annotations

import pytest
import torch
from triton_inputs import DEVICE, DTYPES, LENGTHS, gen, randn

from k3c.ir import OPS
from k3c.kernels.moe.naive import moe_down as down_ref
from k3c.kernels.moe.naive import moe_gate_up as gate_up_ref
from k3c.kernels.moe.triton import moe_down, moe_experts, moe_gate_up, sort_by_expert
from k3c.numerics import assert_close

E, TOP_K, D, I, D_OUT = 8, 2, 48, 32, 40
dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
tokens = pytest.mark.parametrize("N", LENGTHS, ids=lambda n: f"N{n}")


def routing(N: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct experts per token (as top-k gives), some experts unused when N is small."""
    g = gen(seed)
    idx = torch.stack([torch.randperm(E, generator=g)[:TOP_K] for _ in range(N)])
    return idx.to(DEVICE), torch.rand(N, TOP_K, generator=g).to(DEVICE)


def test_sort_by_expert_blocks_hold_one_expert_each():
    idx, _ = routing(37)
    blocks = sort_by_expert(idx, E, 16)
    P = idx.numel()
    pairs = blocks.pairs.view(-1, 16)
    seen = []
    for b, e in enumerate(blocks.experts.tolist()):
        real = [p for p in pairs[b].tolist() if p < P]
        assert all(idx.view(-1)[p].item() == e for p in real), f"block {b} mixes experts"
        assert e >= 0 or not real
        seen += real
    assert sorted(seen) == list(range(P)), "every (token, slot) pair exactly once"


@dtypes
@tokens
def test_moe_gate_up(N, dtype):
    idx, _ = routing(N)
    h, w13 = randn(N, D, dtype=dtype), randn(E, 2 * I, D, seed=1, scale=0.2, dtype=dtype)
    assert_close(moe_gate_up(h, w13, idx), gate_up_ref(h, w13, idx), what="moe_gate_up")


@dtypes
@tokens
def test_moe_down_with_combine_weights(N, dtype):
    idx, w = routing(N, seed=1)
    a, w2 = randn(N, TOP_K, I, dtype=dtype), randn(E, D_OUT, I, seed=1, scale=0.2, dtype=dtype)
    assert_close(moe_down(a, w2, idx, w), down_ref(a, w2, idx, w), what="moe_down")


@dtypes
@tokens
@pytest.mark.parametrize("act", ["situ", "silu"])
def test_moe_experts_with_activation_epilogue(N, dtype, act):
    idx, w = routing(N, seed=2)
    h = randn(N, D, dtype=dtype)
    w13, w2 = randn(E, 2 * I, D, seed=1, scale=0.3, dtype=dtype), randn(E, D_OUT, I, seed=2, scale=0.2, dtype=dtype)
    expected = OPS["moe_experts"].ref(h, w13, w2, idx, w, act=act, beta=4.0, linear_beta=25.0)
    assert_close(moe_experts(h, w13, w2, idx, w, act, 4.0, 25.0), expected, what=f"moe_experts {act}")
