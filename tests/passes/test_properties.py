"""Property tests of cse, dce and constant-fold on small random graphs: the interpreter gives
bit-identical outputs, the result verifies, a second run changes nothing, and each pass
leaves nothing it should have removed."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from k3c import ir, passes
from k3c.ir import Graph, Node, TensorType
from k3c.passes.cse import node_key
from k3c.passes.dce import live_nodes

N_SHAPE = (ir.dims.sym("N"), 3)
UNARY = ["neg", "tanh", "sigmoid", "abs"]
BINARY = ["add", "sub", "mul", "maximum"]


@st.composite
def graphs(draw) -> Graph:
    """Inputs x, y [N, 3], weights [3], constants, then a random mix of unary and binary
    elementwise nodes, repeats of earlier nodes, identities; outputs a random subset."""
    g = Graph("random", dims={"N": (1, None)}, inputs=["x", "y"])
    shapes: dict[str, tuple] = {"x": N_SHAPE, "y": N_SHAPE}
    for name in ("x", "y"):
        g.types[name] = TensorType("f32", N_SHAPE)
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    for name in ("w1", "w2"):
        g.add_weight(name, torch.randn(3, generator=gen))
        shapes[name] = (3,)
    for i, value in enumerate(draw(st.lists(st.sampled_from([0.0, 1.0, 2.0, -1.0, 0.5]), min_size=1, max_size=3))):
        g.nodes.append(Node("const", [], [f"c{i}"], {"value": value, "dtype": "f32"}))
        g.types[f"c{i}"], shapes[f"c{i}"] = TensorType("f32", ()), ()
    values = list(shapes)
    for i in range(draw(st.integers(1, 14))):
        kind = draw(st.sampled_from(["unary", "binary", "binary", "repeat", "identity"]))
        out = f"v{i}"
        if kind == "repeat" and any(n.op != "const" for n in g.nodes):
            src = draw(st.sampled_from([n for n in g.nodes if n.op != "const"]))
            node = Node(src.op, list(src.inputs), [out], dict(src.attrs))
            shape = shapes[src.outputs[0]]
        elif kind == "unary" or kind == "repeat":
            a = draw(st.sampled_from(values))
            node, shape = Node(draw(st.sampled_from(UNARY)), [a], [out]), shapes[a]
        elif kind == "identity":
            a = draw(st.sampled_from(values))
            attrs = {"dtype": "f32"} if draw(st.booleans()) else {"shape": list(shapes[a])}
            node, shape = Node("cast" if "dtype" in attrs else "reshape", [a], [out], attrs), shapes[a]
        else:
            a, b = draw(st.sampled_from(values)), draw(st.sampled_from(values))
            node = Node(draw(st.sampled_from(BINARY)), [a, b], [out])
            shape = max(shapes[a], shapes[b], key=len)
        g.nodes.append(node)
        g.types[out], shapes[out] = TensorType("f32", shape), shape
        values.append(out)
    outs = draw(st.lists(st.sampled_from(values[2:]), min_size=1, max_size=4, unique=True))
    g.outputs = [(f"out{i}", v) for i, v in enumerate(outs)]
    return ir.verify(g)


def _outputs(g: Graph) -> list[torch.Tensor]:
    x, y = (torch.randn(5, 3, generator=torch.Generator().manual_seed(s)) for s in (1, 2))
    return [t.expand(5, 3) if t.dim() < 2 else t for t in ir.interpret(g, x, y)]


def _exact(before: Graph, after: Graph) -> None:
    for a, b in zip(_outputs(before), _outputs(after)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("pipeline", [["cse"], ["dce"], ["constant-fold"], ["constant-fold", "cse", "dce"]],
                         ids=lambda p: "+".join(p))
@settings(max_examples=40, deadline=None)
@given(g=graphs())
def test_pass_preserves_outputs_and_is_idempotent(pipeline, g):
    out = passes.run(g, pipeline)  # verifies after each pass
    assert len(out.nodes) <= len(g.nodes)
    _exact(g, out)
    report: list = []
    again = passes.run(out, pipeline, report=report)
    assert str(again) == str(out) and all(not e.sites for e in report)


@settings(max_examples=40, deadline=None)
@given(g=graphs())
def test_after_cse_no_two_nodes_compute_the_same(g):
    out = passes.run(g, ["cse"])
    keys = [node_key(out, n) for n in out.nodes]
    assert len(keys) == len(set(keys))


@settings(max_examples=40, deadline=None)
@given(g=graphs())
def test_after_dce_every_node_and_weight_is_live(g):
    out = passes.run(g, ["dce"])
    assert len(live_nodes(out)) == len(out.nodes)
    read = {i for n in out.nodes for i in n.inputs} | set(out.output_values)
    assert set(out.weights) <= read


@settings(max_examples=40, deadline=None)
@given(g=graphs())
def test_after_constant_fold_nothing_constant_is_left_to_compute(g):
    out = passes.run(g, ["constant-fold"])
    producers = out.producers()
    for n in out.nodes:
        if n.op != "const":
            constant = [out.is_weight(i) or (i in producers and producers[i].op == "const") for i in n.inputs]
            assert not all(constant), n.describe()
