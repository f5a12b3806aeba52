"""A user's fusion from outside the package, with public names only: declare a fused op with
its decomposition, write the rule and the pass, give one backend (TVM) a lowering of its own,
and compile a module of the user's to every backend; each matches eager."""

from __future__ import annotations

import math

import pytest
import torch

import k3c
from k3c import registry
from k3c.ir.ops import attr, defop, expect
from k3c.numerics import assert_close
from k3c.passes import PIPELINES, Any, Const, Op, Rule, apply_rules, register_pass


class QuickGeluBlock(torch.nn.Module):
    """x -> linear -> h * sigmoid(1.702 h) (the "quick GELU" of CLIP)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(16, 24)

    def forward(self, x):
        h = self.lin(x)
        return h * torch.sigmoid(1.702 * h)


def _declare(tvm_calls: list):
    def infer(x, *, alpha):
        expect(x.dtype == "f32", "dtype", f"quick_gelu takes f32, got {x}")
        return [x]

    def decompose(b, x, *, alpha):
        return [b.op("mul", [x, b.op("sigmoid", [b.op("mul", [x, b.const(alpha, "f32")])])])]

    defop("quick_gelu", "x", attrs={"alpha": attr("float", lo=0)}, infer=infer,
          ref=lambda x, alpha: x * torch.sigmoid(alpha * x), decompose=decompose,
          flops=lambda ins, outs, a: 4 * math.prod(outs[0]), families="elementwise fused")

    rule = Rule("quick-gelu", Op("mul", Any("x"), Op("sigmoid", Op("mul", Any("x"), Const("alpha")))),
                lambda m, b: b.op("quick_gelu", [m["x"]], alpha=float(m.const("alpha"))))

    @register_pass("fuse-quick-gelu")
    def fuse_quick_gelu(graph):
        """x * sigmoid(alpha x) -> quick_gelu(x)."""
        return apply_rules(graph, [rule])

    @k3c.backends.lowering("tvm", "quick_gelu")
    def tvm_quick_gelu(ctx, node, x):
        from tvm import relax

        tvm_calls.append(node.outputs[0])
        alpha = relax.const(ctx.attrs(node)["alpha"], "float32")
        return relax.op.multiply(x, relax.op.sigmoid(relax.op.multiply(x, alpha)))


@pytest.fixture(scope="module")
def declared():
    calls: list = []
    with registry.scope():
        _declare(calls)
        yield calls


@pytest.mark.parametrize("backend", ["reference", "onnx", "tvm", "triton"])
def test_a_users_fused_op_reaches_every_backend(declared, backend, tmp_path):
    model = QuickGeluBlock().eval()
    x = torch.randn(2, 7, 16, generator=torch.Generator().manual_seed(1))
    compiled = k3c.compile(model, backend, (x[:, :5],), out_dir=tmp_path,
                           passes=PIPELINES["default"] + ["fuse-quick-gelu"])
    with torch.no_grad():
        assert_close(compiled(x), model(x), what=f"{backend}: quick GELU block")
    ops = compiled.graphs["forward"].op_counts()
    if backend in ("reference", "tvm"):  # the interpreter runs the reference; TVM has its own lowering
        assert ops.get("quick_gelu") == 1, ops
    else:  # no lowering of its own: the decomposition ran
        assert "quick_gelu" not in ops and ops.get("sigmoid") == 1, ops
    if backend == "tvm":
        assert declared, "TVM did not call the user's lowering"


def test_the_support_matrix_says_how(declared):
    from k3c.backends import coverage

    cells = next(c for _, op, c in coverage.matrix() if op == "quick_gelu")
    assert cells == {"reference": "naive", "onnx": "decomposed", "onnx --flavour ort": "decomposed",
                     "tvm": "user", "triton": "decomposed"}
