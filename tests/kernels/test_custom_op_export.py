"""Every torch.ops.k3c.* op exports with torch.export as exactly one node, with the batch and
time dims dynamic, and the exported program is right at another length.

The MoE ops take tokens already flattened, so their one dynamic dim N stands for B * T.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from kernel_inputs import randn

import k3c.kernels  # noqa: F401  (registers torch.ops.k3c.*)
from k3c.numerics import assert_close

ops = torch.ops.k3c
Bd, Td, Sd, Nd = (torch.export.Dim(n, min=2, max=4096) for n in ("B", "T", "S", "N"))
H, K, V, C, W = 2, 8, 12, 6, 4


@dataclass
class Case:
    op: object  # the custom op packet
    call: Callable  # (*inputs) -> outputs, calls the op once
    inputs: Callable[[int, int], tuple]  # (B, T) -> example inputs
    dims: Callable[[], tuple]  # per-input dynamic-shape spec


def delta(B, T, gate):
    x = (randn(B, T, H, K, seed=1), randn(B, T, H, K, seed=2), randn(B, T, H, V, seed=3))
    g = {"channel": -torch.rand(B, T, H, K), "head": -torch.rand(B, T, H), None: None}[gate]
    beta, state = torch.rand(B, T, H), randn(B, H, K, V, seed=4)
    return (*x, g, beta, state) if g is not None else (*x, beta, state)


def bt(rank: int) -> dict:
    return {0: Bd, 1: Td} if rank > 1 else {0: Bd}


CASES = {
    "kda": Case(ops.kda, lambda *a: ops.kda(*a, 0.5), lambda B, T: delta(B, T, "channel"),
                lambda: (bt(4), bt(4), bt(4), bt(4), bt(3), {0: Bd})),
    "gated_delta_rule": Case(ops.gated_delta_rule, lambda *a: ops.gated_delta_rule(*a, 0.5),
                             lambda B, T: delta(B, T, "head"),
                             lambda: (bt(4), bt(4), bt(4), bt(3), bt(3), {0: Bd})),
    "delta_rule": Case(ops.delta_rule, lambda *a: ops.delta_rule(*a, 0.5),
                       lambda B, T: delta(B, T, None),
                       lambda: (bt(4), bt(4), bt(4), bt(3), {0: Bd})),
    "linear_attention": Case(
        ops.linear_attention, lambda *a: ops.linear_attention(*a, 0.5),
        lambda B, T: (torch.rand(B, T, H, K) + 0.1, torch.rand(B, T, H, K) + 0.1,
                      randn(B, T, H, V), torch.rand(B, H, K, V), torch.rand(B, H, K) + 1),
        lambda: (bt(4), bt(4), bt(4), {0: Bd}, {0: Bd})),
    "short_conv": Case(ops.short_conv, lambda x, w, s: ops.short_conv(x, w, s, "silu"),
                       lambda B, T: (randn(B, T, C), randn(C, W), randn(B, C, W - 1)),
                       lambda: (bt(3), None, {0: Bd})),
    "causal_attention": Case(
        ops.causal_attention, lambda *a: ops.causal_attention(*a, 0.4),
        lambda B, T: (randn(B, T, H, K), randn(B, T + 3, H, K), randn(B, T + 3, H, V)),
        lambda: (bt(4), {0: Bd, 1: Sd}, {0: Bd, 1: Sd})),
    "mla_attention": Case(
        ops.mla_attention, lambda *a: ops.mla_attention(*a, 4, 0.4),
        lambda B, T: (randn(B, T, H, 6 + 2), randn(B, T + 3, 5), randn(B, T + 3, 2),
                      randn(H * (6 + 4), 5)),
        lambda: (bt(4), {0: Bd, 1: Sd}, {0: Bd, 1: Sd}, None)),
    "attn_res_mix": Case(ops.attn_res_mix, lambda *a: ops.attn_res_mix(*a, 1e-5),
                         lambda B, T: (randn(3, B, T, C), randn(C), randn(C)),
                         lambda: ({1: Bd, 2: Td}, None, None)),
    "moe_gate_up": Case(ops.moe_gate_up, ops.moe_gate_up,
                        lambda B, T: (randn(B * T, C), randn(4, 2 * K, C),
                                      torch.randint(0, 4, (B * T, 2))),
                        lambda: ({0: Nd}, None, {0: Nd})),
    "moe_down": Case(ops.moe_down, ops.moe_down,
                     lambda B, T: (randn(B * T, 2, K), randn(4, C, K),
                                   torch.randint(0, 4, (B * T, 2)), torch.rand(B * T, 2)),
                     lambda: ({0: Nd}, None, {0: Nd}, {0: Nd})),
    "topk": Case(ops.topk, lambda x: ops.topk(x, 2, -1), lambda B, T: (randn(B, T, C),), lambda: (bt(3),)),
}


class Call(torch.nn.Module):
    def __init__(self, fn: Callable):
        super().__init__()
        self.fn = fn

    def forward(self, *inputs):
        return self.fn(*inputs)


def as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


@pytest.mark.parametrize("name", list(CASES))
def test_exports_as_one_node_with_dynamic_batch_and_time(name):
    case = CASES[name]
    ep = torch.export.export(Call(case.call), case.inputs(2, 5), dynamic_shapes=(case.dims(),))
    calls = [n for n in ep.graph.nodes if n.op == "call_function" and n.target != operator.getitem]
    assert [n.target for n in calls] == [case.op.default], ep.graph
    other = case.inputs(3, 11)  # another batch and another length
    for got, want in zip(as_tuple(ep.module()(*other)), as_tuple(case.call(*other))):
        assert got.shape == want.shape
        assert_close(got, want, what=name)


# The MXFP4 expert ops have their export case beside their other tests (test_mxfp4_moe.py), the
# collectives theirs in tests/distributed (a partitioned model captured with all_reduce in it),
# the cache ops theirs in tests/serving (the models captured with fixed caches).
ELSEWHERE = {"moe_gate_up_mxfp4", "moe_down_mxfp4",
             "all_reduce", "all_gather", "reduce_scatter",  # the collectives: tests/distributed
             "all_to_all", "moe_dispatch", "moe_combine",  # (a partitioned MoE, tests/distributed/test_mesh_a2a.py)
             "cache_write", "causal_attention_cached", "mla_attention_cached"}  # serving forms: tests/serving


def test_every_custom_op_has_an_export_case():
    from k3c.ir.ops import torch_ops

    assert set(torch_ops()) == set(CASES) | ELSEWHERE


@pytest.mark.parametrize("name", sorted(set(CASES) | ELSEWHERE))
def test_torch_schema_is_the_spec_signature(name):
    """The torch op is made from the spec: same argument names in the same order, one
    result per declared output (nothing restates the signature by hand). A "rows" attribute
    (a size only the data decides) is no argument: the fake makes it."""
    from k3c.ir import OPS
    from k3c.ir.ops import torch_op

    spec, schema = OPS[name], torch_op(name)._schema
    attrs = [k for k, a in spec.attr_specs.items() if a.kind != "rows"]
    assert [a.name for a in schema.arguments] == spec.tensor_inputs + attrs
    assert len(schema.returns) == len(spec.outputs)
