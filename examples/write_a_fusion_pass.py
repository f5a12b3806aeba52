"""Write a fusion pass in one file and take it to every backend: K3's KDA forget gate as one op.

K3's KDA layer computes its per-channel log-decay as  g = lb * sigmoid(exp(A_log) * (f + dt_bias))
(K3-SPEC.md section 2; lb = -5). After the default pipeline that is four elementwise nodes;
here it becomes one op, `kda_sigmoid_gate`, in five steps:

  1. declare the op once (`defop`): inputs, a typed attribute, shape inference, the naive
     reference, its cost, and its decomposition (the ops it stands for)
  2. the rewrite: a pattern and what replaces it (`Rule`)
  3. the pass (`register_pass`), so that pipelines can name it
  4. one backend's own lowering (ONNX: standard ops through the graph builder); TVM and
     Triton have none, so they run the decomposition, and `k3c ops` says so
  5. compile k3-tiny with the pass for every backend and diff each artifact against eager

    python examples/write_a_fusion_pass.py [--backends reference,onnx,tvm,triton]

Every registration passes replace=True, so the file can run twice in one process (a notebook).
"""

from __future__ import annotations

import argparse
import math

import torch

import k3c
from k3c import ir, passes
from k3c.backends import coverage
from k3c.compiler import capture_entries
from k3c.diff import DiffReport, diff
from k3c.ir.ops import attr, broadcast_shapes, defop, expect
from k3c.passes import Any, Const, Op, Rule, Weight, apply_rules, register_pass

OP = "kda_sigmoid_gate"

# 1. The op. `infer` gets the input types (and attributes) and returns the output types, or
#    says which rule is broken; `ref` is what the interpreter runs; `decompose` builds the same
#    computation from other ops with the pass Builder, for backends without a lowering.


def _infer(f, a, dt, *, lower_bound):
    expect(broadcast_shapes(f.shape, broadcast_shapes(a.shape, dt.shape)) == f.shape, "gate-shape",
           f"{OP}: A and dt_bias {a}, {dt} must broadcast to f {f}")
    expect(a.dtype == f.dtype == dt.dtype, "dtype", f"{OP}: operands of one dtype, got {f}, {a}, {dt}")
    return [f]


def _ref(f, a, dt, *, lower_bound):
    return lower_bound * torch.sigmoid(a * (f + dt))


def _decompose(b, f, a, dt, *, lower_bound):
    s = b.op("sigmoid", [b.op("mul", [a, b.op("add", [f, dt])])])
    return [b.op("mul", [s, b.const(lower_bound, b.type(f).dtype)])]


defop(OP, "f a dt", attrs={"lower_bound": attr("float", hi=0.0)}, infer=_infer, ref=_ref, decompose=_decompose,
      flops=lambda ins, outs, attrs: 4 * math.prod(outs[0]),
      families="elementwise fused", doc="lower_bound * sigmoid(a * (f + dt)): K3's KDA gate", replace=True)

# 2. The rule. mul and add are commutative, so both operand orders match. Every node of the
#    match except the root must be used only inside it (nothing is computed twice); `where`
#    says what the pattern cannot: the gate keeps f's shape.

GATE = Rule(
    "kda-sigmoid-gate",
    Op("mul", Op("sigmoid", Op("mul", Weight("a"), Op("add", Any("f"), Weight("dt")))), Const("lb", lambda c: c < 0)),
    lambda m, b: b.op(OP, [m["f"], m["a"], m["dt"]], name=m.root.outputs[0], lower_bound=float(m.const("lb"))),
    where=lambda m: m.type("f").same_as(m.ctx.type(m.root.outputs[0])),
)


# 3. The pass: a function of the graph (edited in place) that returns the sites per rule.


@register_pass("fuse-kda-gate", replace=True)
def fuse_kda_gate(graph: ir.Graph):
    """lb * sigmoid(A * (f + dt_bias)) -> kda_sigmoid_gate(f, A, dt_bias) {lower_bound}."""
    return apply_rules(graph, [GATE])


PIPELINE = passes.PIPELINES["default"] + ["fuse-kda-gate"]


# 4. ONNX's own lowering: the inputs arrive as keywords named as in the `defop`, `lx.x(value)`
#    is an input's ONNX name, `lx.outs(node)` the outputs to write, `lx.b` builds standard
#    ONNX nodes, `lx.attrs(node)` has the defaults filled in.


@k3c.backends.lowering("onnx", OP, replace=True)
def _onnx_gate(lx, node, f, a, dt):
    f, a, dt = lx.x(f), lx.x(a), lx.x(dt)
    lb = lx.attrs(node)["lower_bound"]
    b = lx.b
    b.Mul(b.Sigmoid(b.Mul(a, b.Add(f, dt))), b.const(lb), outputs=lx.outs(node))


# 5. Compile and check.


def how_backends_run_it() -> str:
    row = next(cells for _, op, cells in coverage.matrix() if op == OP)
    return ", ".join(f"{col} {cell}" for col, cell in row.items())


def main(argv: list[str] | None = None) -> DiffReport:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backends", default="reference,onnx,tvm,triton")
    p.add_argument("--seq-len", type=int, default=70, help="prefill length (two chunks of 64)")
    p.add_argument("--decode-steps", type=int, default=2)
    args = p.parse_args(argv)

    model = k3c.models.build("k3-tiny")
    ids = torch.zeros(2, 16, dtype=torch.long)
    report: list = []
    graphs = capture_entries(model, (ids,), entries=("prefill", "decode"))  # captured once for both uses
    fused = passes.run(graphs["prefill"], PIPELINE, report=report)
    print(f"fuse-kda-gate: {report[-1].total_sites} sites in k3-tiny's prefill; {fused.op_counts()[OP]} {OP} nodes")
    print(f"{OP} runs as: {how_backends_run_it()}")

    result = diff(model, args.backends.split(","), seq_len=args.seq_len, decode_steps=args.decode_steps,
                           passes=PIPELINE, bisect=False, captured=graphs)
    print(result.table())
    if not result.ok:
        raise SystemExit(f"{OP}: some backend is off (see the table)")
    return result


if __name__ == "__main__":
    main()
