"""Write a fusion pass in one file: KDA's gated output norm as one op.

The KDA layer ends with `rms_norm(o, w) * sigmoid(gate)`; a backend would rather run that as
one kernel. Four steps, all here:

  1. declare the fused op once: its inputs, shape inference and naive reference (`defop`)
  2. write the rewrite: a pattern and what replaces it (`Rule`)
  3. register the pass (`register_pass`), so pipelines can name it
  4. run it on k3-tiny after the default pipeline and check it with the interpreter

    python examples/write_a_fusion_pass.py
"""

from __future__ import annotations

import torch

import k3c
from k3c import ir, passes
from k3c.ir import dims
from k3c.ir.ops import REQUIRED, defop, expect
from k3c.kernels.gated_rmsnorm.naive import gated_rmsnorm
from k3c.numerics import assert_close
from k3c.passes import Any, Op, Rule, Weight, apply_rules, register_pass

# 1. The op. `infer` gets the input types (and attributes) and returns the output types, or
#    says which rule is broken; `ref` is what the interpreter runs.


def _gated_rms_norm_infer(x, gate, w, *, eps):
    expect(gate.same_as(x), "gate-shape", f"gated_rms_norm gate {gate} must match x {x}")
    expect(w.rank == 1 and dims.equal(w.shape[0], x.shape[-1]), "norm",
           f"gated_rms_norm weight {w} must be [{dims.to_str(x.shape[-1])}]")
    return [x]


if "gated_rms_norm" not in ir.OPS:  # declared once per process
    defop("gated_rms_norm", "x gate w", attrs={"eps": REQUIRED}, infer=_gated_rms_norm_infer,
          ref=lambda x, gate, w, eps: gated_rmsnorm(x, w, gate, eps), families="norm fused",
          doc="rms_norm(x) * w * sigmoid(gate), in fp32")

# 2. The rule: mul is commutative, so the pattern also matches sigmoid(gate) * rms_norm(x, w).
#    Every node of the match except the root must be used only inside it (nothing is
#    computed twice); `where` adds what the pattern cannot say.

GATED_NORM = Rule(
    "gated-rms-norm",
    Op("mul", Op("rms_norm", Any("x"), Weight("w"), name="norm"), Op("sigmoid", Any("gate"))),
    lambda m, b: b.op("gated_rms_norm", [m["x"], m["gate"], m["w"]], eps=m.node("norm").attrs["eps"]),
    where=lambda m: m.type("gate").same_as(m.type("x")),
)


# 3. The pass: a function of the graph (edited in place) that returns the sites per rule.


@register_pass("fuse-gated-rms-norm")
def fuse_gated_rms_norm(graph: ir.Graph):
    """rms_norm(x, w) * sigmoid(gate) -> gated_rms_norm(x, gate, w)."""
    return apply_rules(graph, [GATED_NORM])


# 4. Run it and check it.


def check(graph: ir.Graph, T: int = 24) -> int:
    """Run default + the new pass on a captured k3-tiny prefill graph; check it; return the sites."""
    report: list = []
    fused = passes.run(graph, passes.PIPELINES["default"] + ["fuse-gated-rms-norm"], report=report)
    print(passes.format_report(report))
    sites = report[-1].sites.get("gated-rms-norm", 0)
    assert sites == graph.op_counts()["kda"], f"expected one fused norm per KDA layer, got {sites}"

    x = torch.randint(0, 1024, (2, T), generator=torch.Generator().manual_seed(1))
    for (name, _), want, got in zip(graph.outputs, ir.interpret(graph, x), ir.interpret(fused, x)):
        assert_close(got, want, what=name)
    print(f"fuse-gated-rms-norm: {sites} sites on k3-tiny; interpreter before == after (T = {T})")
    return sites


def main() -> None:
    model = k3c.models.build("k3-tiny")
    ids = torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    check(k3c.capture(model, (ids,)))


if __name__ == "__main__":
    main()
