"""Every backend's elementwise forms against float64, op by op, over the whole float range a
model can feed them, in relative terms (k3c.numerics.ELEMENTWISE_ULPS): onnxruntime's Sigmoid
was 17% off at x = -15 (the MoE router renormalises it), TVM's and Triton's softplus 16% off
on [-15, -8] and 0 below -16.6 (Kimi Linear's gate multiplies it by exp(A_log)), TVM's tanh 100%
off near 0. softmax is checked at logits up to 1e4 (its log-sum-exp must not overflow), with
the condition of exp(x - max) in its bound: an fp32 x - max carries an error of u |x - max|,
which exp turns into that relative error (45 u at a probability of 1e-20).

gelu and elu are checked in absolute terms (|err| <= ELEMENTWISE_ULPS u max(|y|, 1)): their
negative tails are differences (1 + erf, exp(x) - 1) that no form in standard ops keeps to a
relative accuracy, and what reads them (a GEMM, elu + 1 as a feature map) adds O(1) terms.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from k3c.diff import backend_for
from k3c.ir import parse
from k3c.numerics import ELEMENTWISE_ULPS, SMALLEST_NORMAL, UNIT_ROUNDOFF

U, TINY = UNIT_ROUNDOFF[torch.float32], SMALLEST_NORMAL[torch.float32]
SIGNED = {"sigmoid": torch.sigmoid, "silu": F.silu, "tanh": torch.tanh, "neg": torch.neg, "abs": torch.abs,
          "relu": torch.relu, "softplus": lambda x: F.softplus(x, 1.0, 20.0)}
POSITIVE = {"log": torch.log, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "reciprocal": torch.reciprocal}
ABSOLUTE = {"gelu": lambda x: F.gelu(x), "elu": lambda x: F.elu(x, 1.0)}
ATTRS = {"softplus": " {beta=1.0, threshold=20.0}", "gelu": ' {approximate="none"}', "elu": " {alpha=1.0}"}


def _inputs():
    tiny = torch.logspace(-30, 0, 121)
    signed = torch.cat([torch.linspace(-88, 88, 8001), tiny, -tiny])
    expo = torch.linspace(-87, 88, 4001)
    positive = torch.logspace(-30, 30, 2001)
    scales = torch.tensor([1.0, 10.0, 100.0, 1e3, 1e4])[:, None]
    logits = scales * torch.randn(5, 64, generator=torch.Generator().manual_seed(0))
    return signed, expo, positive, logits


def _graph():
    s, e, p = (len(x) for x in _inputs()[:3])
    lines = ["graph elementwise {", f"  input %s: f32[{s}]", f"  input %e: f32[{e}]", f"  input %p: f32[{p}]",
             "  input %m: f32[5, 64]"]
    outs = []
    for op in [*SIGNED, *ABSOLUTE]:
        lines.append(f"  %{op}: f32[{s}] = {op}(%s){ATTRS.get(op, '')}")
        outs.append(op)
    lines.append(f"  %exp: f32[{e}] = exp(%e)")
    outs.append("exp")
    for op in POSITIVE:
        lines.append(f"  %{op}: f32[{p}] = {op}(%p)")
        outs.append(op)
    lines.append("  %softmax: f32[5, 64] = softmax(%m) {dim=-1}")
    outs.append("softmax")
    lines += [f"  output {o} = %{o}" for o in outs] + ["}"]
    return parse("\n".join(lines) + "\n"), outs


def _expected(name: str, signed, expo, positive, logits) -> torch.Tensor:
    if name in SIGNED:
        return SIGNED[name](signed.double())
    if name in ABSOLUTE:
        return ABSOLUTE[name](signed.double())
    if name == "exp":
        return torch.exp(expo.double())
    if name in POSITIVE:
        return POSITIVE[name](positive.double())
    return torch.softmax(logits.double(), -1)


@pytest.fixture(scope="module", params=["reference", "onnx", "onnx:ort", "tvm", "triton"])
def results(request, tmp_path_factory):
    graph, names = _graph()
    be = backend_for(request.param)
    out = tmp_path_factory.mktemp(request.param.replace(":", "-"))
    be.lower({"forward": graph}, out)
    ins = _inputs()
    return request.param, dict(zip(names, be.load(out).run("forward", *ins))), ins


OPS = [*SIGNED, *ABSOLUTE, "exp", *POSITIVE, "softmax"]


@pytest.mark.parametrize("op", OPS)
def test_elementwise_forms_hold_their_accuracy_everywhere(results, op):
    backend, outs, ins = results
    got, want = outs[op].double(), _expected(op, *ins)
    err = (got - want).abs()
    if op in ABSOLUTE:
        bound = ELEMENTWISE_ULPS * U * want.abs().clamp(min=1.0)
    elif op == "softmax":
        logits = ins[3].double()
        condition = (logits - logits.max(-1, keepdim=True).values).abs().clamp(min=1.0)
        bound = (ELEMENTWISE_ULPS * U * condition * want.abs()).clamp(min=TINY)
    else:  # relative; below the smallest normal number a backend may flush or keep subnormals
        bound = (ELEMENTWISE_ULPS * U * want.abs()).clamp(min=TINY)
    bad = err > bound
    if bad.any():
        i = int((err / bound).argmax())
        x = torch.cat([t.flatten() for t in ins])  # for the message only
        pytest.fail(f"{backend} {op}: {int(bad.sum())} elements off, worst {float(err.flatten()[i]):.2e} "
                    f"against {float(bound.flatten()[i]):.2e} (value {float(want.flatten()[i]):.3e}); "
                    f"inputs span [{float(x.min()):.3g}, {float(x.max()):.3g}]")
