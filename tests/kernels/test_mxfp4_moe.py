"""The routed-expert GEMMs on MXFP4 weights equal the dense GEMMs on the decoded weights, bit
for bit, and export as one node each with a dynamic token count."""

from __future__ import annotations

import operator

import pytest
import torch

import k3c.kernels  # noqa: F401  (registers torch.ops.k3c.*)
from k3c.kernels import moe_down, moe_gate_up, mxfp4
from k3c.kernels.moe.mxfp4 import moe_down_mxfp4, moe_gate_up_mxfp4

E, I, D, N, TOP = 6, 64, 96, 21, 2


def experts(seed: int, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (E, rows, cols // 2), dtype=torch.uint8, generator=gen)
    scale = torch.randint(118, 126, (E, rows, cols // 32), dtype=torch.uint8, generator=gen)
    return packed, scale


def inputs(n: int, dtype: torch.dtype):
    gen = torch.Generator().manual_seed(n)
    h = torch.randn(n, D, generator=gen).to(dtype)
    a = torch.randn(n, TOP, I, generator=gen).to(dtype)
    idx = torch.stack([torch.randperm(E, generator=gen)[:TOP] for _ in range(n)])
    return h, a, idx, torch.rand(n, TOP, generator=gen)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mxfp4_expert_gemms_equal_the_dense_gemms_on_decoded_weights(dtype):
    p13, s13 = experts(0, 2 * I, D)
    p2, s2 = experts(1, D, I)
    h, a, idx, w = inputs(N, dtype)
    w13 = mxfp4.decode(p13, s13, dtype)
    w2 = mxfp4.decode(p2, s2, dtype)
    assert torch.equal(moe_gate_up_mxfp4(h, p13, s13, idx), moe_gate_up(h, w13, idx))
    assert torch.equal(moe_down_mxfp4(a, p2, s2, idx, w), moe_down(a, w2, idx, w))


class Call(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def test_mxfp4_expert_ops_export_as_one_node_with_dynamic_tokens():
    ops = torch.ops.k3c
    Nd = torch.export.Dim("N", min=2, max=4096)
    p13, s13 = experts(0, 2 * I, D)
    p2, s2 = experts(1, D, I)
    cases = [(ops.moe_gate_up_mxfp4, lambda n: (inputs(n, torch.float32)[0], p13, s13, inputs(n, torch.float32)[2]),
              ({0: Nd}, None, None, {0: Nd})),
             (ops.moe_down_mxfp4, lambda n: (inputs(n, torch.float32)[1], p2, s2, *inputs(n, torch.float32)[2:]),
              ({0: Nd}, None, None, {0: Nd}, {0: Nd}))]
    for op, make, dims in cases:
        ep = torch.export.export(Call(op), make(5), dynamic_shapes=(dims,))
        calls = [n.target for n in ep.graph.nodes if n.op == "call_function" and n.target != operator.getitem]
        assert calls == [op.default], ep.graph
        other = make(13)
        assert torch.equal(ep.module()(*other), op(*other))
