"""The text form: exact round trips, every attribute kind, and line-numbered parse errors."""

from __future__ import annotations

import pytest
import sympy

from k3c.ir import Graph, Node, ParseError, TensorType, parse, print_graph, verify
from k3c.ir import dims as D


def _graph_with_every_attr_kind() -> Graph:
    B, T = D.sym("B"), D.sym("T")
    g = Graph("attrs", dims={"B": (1, None), "T": (2, 4096)}, inputs=["x"])
    g.types["x"] = TensorType("f32", (B, T, 8))
    g.types["c"] = TensorType("f32", ())
    g.types["y"] = TensorType("f32", (B, T, 8))
    g.types["s"] = TensorType("f32", (B, 2 * T, 8))
    g.types["r"] = TensorType("i64", (sympy.ceiling(T / 64) * 64,))
    g.nodes = [
        Node("const", [], ["c"], {"value": float("-inf"), "dtype": "f32"}, {"loc": "m.py:1"}),
        Node("gelu", ["x"], ["y"], {"approximate": 'ta"nh # not a comment'}),
        Node("concat", ["x", "x"], ["s"], {"dim": 1}),
        Node("arange", [], ["r"], {"start": 0, "end": sympy.ceiling(T / 64) * 64, "dtype": "i64"}),
    ]
    g.outputs = [("y", "y"), ("c", "c"), ("r", "r")]
    g.meta = {"entry": "prefill", "pipeline": ["a", "b"]}
    return g


def test_round_trip_is_exact():
    g = _graph_with_every_attr_kind()
    text = print_graph(g)
    again = parse(text)
    assert again.structurally_equal(g)
    assert print_graph(again) == text
    assert again.dims["T"] == (2, 4096)
    assert again.nodes[0].attrs["value"] == float("-inf")
    assert again.nodes[1].attrs["approximate"] == 'ta"nh # not a comment'
    assert again.types["s"].shape[1] == 2 * D.sym("T")
    assert again.nodes[3].attrs["end"] == sympy.ceiling(D.sym("T") / 64) * 64


def test_float_attributes_survive_exactly():
    g = _graph_with_every_attr_kind()
    g.nodes[0].attrs["value"] = 0.1 + 0.2
    assert parse(print_graph(g)).nodes[0].attrs["value"] == 0.1 + 0.2


@pytest.mark.parametrize("bad, line, what", [
    ("  input %x f32[B, T, 8]", 4, "malformed input"),
    ("  %y: f32[B, T, 8] = gelu(x)", 5, "not a %value"),
    ("  %y: f99[B, T, 8] = gelu(%x)", 5, "unknown dtype"),
    ("  %y: f32[B, Q, 8] = gelu(%x)", 5, "undeclared dim 'Q'"),
    ("  %y: f32[B, T, 8] = gelu(%x) {approximate}", 5, "key=value"),
    ("  frobnicate", 5, "unknown statement"),
], ids=["input-no-colon", "operand-no-percent", "dtype", "dim", "attr", "statement"])
def test_parse_errors_name_the_line(bad, line, what):
    lines = ["graph g {", "  dim B in [1, inf]", "  dim T in [1, inf]", "  input %x: f32[B, T, 8]",
             "  %y: f32[B, T, 8] = gelu(%x)", "  output y = %y", "}"]
    lines[line - 1] = bad
    with pytest.raises(ParseError) as e:
        parse("\n".join(lines))
    assert e.value.lineno == line
    assert what in str(e.value)


def test_missing_header_or_brace():
    with pytest.raises(ParseError, match="graph NAME"):
        parse("dim B in [1, inf]\n")
    with pytest.raises(ParseError, match="closing"):
        parse("graph g {\n  dim B in [1, inf]\n")


def test_parsed_graph_verifies():
    g = _graph_with_every_attr_kind()
    g.nodes[1].attrs["approximate"] = "tanh"  # the round trips above keep any string; gelu takes two
    verify(parse(print_graph(g)))
