"""Rules and decompositions that never settle end with a RewriteError naming the rule or op,
within a bounded number of rewrites (a rule `relu -> relu(relu)` once ran forever)."""

from __future__ import annotations

import time

import pytest
import torch

from k3c import registry
from k3c.errors import RewriteError
from k3c.ir import parse
from k3c.ir.ops import defop
from k3c.passes import Any, Op, Rule, apply_rules, legalize

TEXT = """graph t {
  dim N in [1, inf]
  input %x: f32[N, 4]
  %r: f32[N, 4] = relu(%x)
  %t: f32[N, 4] = tanh(%r)
  output y = %t
}"""


def test_a_rule_that_rebuilds_its_own_pattern_is_named():
    grow = Rule("relu-twice", Op("relu", Any("x")), lambda m, b: b.op("relu", [b.op("relu", [m["x"]])]))
    t0 = time.perf_counter()
    with pytest.raises(RewriteError, match="rule 'relu-twice' does not reach a fixed point"):
        apply_rules(parse(TEXT), [grow])
    assert time.perf_counter() - t0 < 5


def test_a_rule_that_settles_is_untouched():
    to_tanh = Rule("relu-to-tanh", Op("relu", Any("x")), lambda m, b: b.op("tanh", [m["x"]]))
    g = parse(TEXT)
    assert apply_rules(g, [to_tanh]) == {"relu-to-tanh": 1}
    assert [n.op for n in g.nodes] == ["tanh", "tanh"]


def _same(x):
    return [x]


@pytest.mark.parametrize("cycle", [["loop_a"], ["loop_a", "loop_b"]], ids=["self", "through-another"])
def test_a_decomposition_that_uses_its_own_op_is_named(cycle):
    with registry.scope():
        for i, name in enumerate(cycle):
            nxt = cycle[(i + 1) % len(cycle)]
            defop(name, "x", infer=_same, ref=torch.relu,
                  decompose=lambda b, x, nxt=nxt: [b.op("relu", [b.op(nxt, [x])])])
        g = parse(TEXT.replace("relu(%x)", f"{cycle[0]}(%x)"))
        refuse = {"loop_a", "loop_b"}
        with pytest.raises(RewriteError, match=f"op '{cycle[0]}' decomposes into itself"):
            legalize(g, lambda n, graph: (n.op not in refuse, "no lowering"))


def test_a_decomposition_chain_that_ends_is_legalized():
    with registry.scope():
        defop("outer", "x", infer=_same, ref=torch.relu, decompose=lambda b, x: [b.op("inner", [x])])
        defop("inner", "x", infer=_same, ref=torch.relu, decompose=lambda b, x: [b.op("relu", [x])])
        g = parse(TEXT.replace("relu(%x)", "outer(%x)"))
        assert legalize(g, lambda n, graph: (n.op not in ("outer", "inner"), "")) == {"outer": 1, "inner": 1}
        assert [n.op for n in g.nodes] == ["relu", "tanh"]
