"""An op declared with `eager=` after `import k3c` is captured as one node (its torch op and
frontend builder come from the declaration, whenever it is made) and runs on the reference
backend and through its decomposition elsewhere, matching eager."""

from __future__ import annotations

import torch

import k3c
from k3c import registry
from k3c.ir.ops import attr, defop, expect
from k3c.numerics import assert_close


def _declare():
    def infer(x, *, alpha):
        expect(x.dtype == "f32", "dtype", f"probe_scaled_tanh takes f32, got {x}")
        return [x]

    def decompose(b, x, *, alpha):
        return [b.op("tanh", [b.op("mul", [x, b.const(alpha, "f32")])])]

    defop("probe_scaled_tanh", "x", attrs={"alpha": attr("float")}, infer=infer,
          ref=lambda x, alpha: torch.tanh(alpha * x), decompose=decompose, eager=True,
          families="elementwise")


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.ops.k3c.probe_scaled_tanh(self.lin(x), alpha=0.5)


def test_an_op_declared_after_import_is_captured(tmp_path):
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(1))
    with registry.scope():
        _declare()
        model = Block().eval()
        graph = k3c.capture(model, (x,))
        assert graph.op_counts().get("probe_scaled_tanh") == 1, graph.op_counts()
        with torch.no_grad():
            want = model(x)
        for backend in ("reference", "onnx"):
            compiled = k3c.compile(model, backend, (x,), out_dir=tmp_path / backend)
            assert_close(compiled(x), want, what=f"{backend}: a user's eager op")
