"""The pass manager: pipelines, a copy never the input, verify between passes, dumps, reports."""

from __future__ import annotations

import pytest
from passes_testlib import graph_of

from k3c import ir, passes
from k3c.passes.registry import PASSES, Pass, parse_step

GRAPH = """graph t {
  dim N in [1, inf]
  input %x: f32[N, 4]
  weight %w: f32[4, 4]
  %a: f32[N, 4] = linear(%x, %w)
  %b: f32[N, 4] = linear(%x, %w)
  %dead: f32[N, 4] = tanh(%a)
  %y: f32[N, 4] = add(%a, %b)
  output y = %y
}"""


def test_pipelines_exist_and_name_registered_passes():
    assert passes.PIPELINES["none"] == []
    assert passes.PIPELINES["default"]
    for step in passes.PIPELINES["default"]:  # a step is a pass's name, with options in braces
        assert parse_step(step)[0] in PASSES


def test_run_works_on_a_copy():
    g = graph_of(GRAPH)
    before = str(g)
    out = passes.run(g, ["cse", "dce"])
    assert str(g) == before and len(out.nodes) == 2
    assert passes.run(g, "none") is not g and str(passes.run(g, "none")) == before


def test_stop_after_returns_the_graph_at_that_stage():
    g = graph_of(GRAPH)
    assert len(passes.run(g, ["cse", "dce"], stop_after="cse").nodes) == 3


def test_dump_after_prints_the_ir_at_that_stage(capsys):
    passes.run(graph_of(GRAPH), ["cse", "dce"], dump_after="cse")
    out = capsys.readouterr().out
    assert out.startswith("// IR after cse\ngraph t {") and "tanh(%a)" in out


def test_report_names_sites_nodes_cost_and_time():
    report: list = []
    passes.run(graph_of(GRAPH), ["cse", "dce"], report=report)
    cse, dce = report
    assert (cse.name, cse.sites, cse.nodes_before, cse.nodes_after) == ("cse", {"common-subexpression": 1}, 4, 3)
    assert dce.sites == {"dead-node": 1} and dce.nodes_after == 2
    assert cse.flops_after < cse.flops_before and cse.bytes_after < cse.bytes_before and cse.seconds >= 0
    text = passes.format_report(report)
    assert "cse" in text and "common-subexpression 1" in text and "B=1, T=1024, P=1024" in text


@pytest.mark.parametrize("call, message", [
    (lambda g: passes.run(g, "fastest"), "unknown pipeline 'fastest'; known: none, default"),
    (lambda g: passes.run(g, ["cse", "fuse-everything"]), "unknown pass 'fuse-everything'; known: "),
    (lambda g: passes.run(g, ["cse"], stop_after="dce"), "stop_after: pass 'dce' is not in the pipeline (cse)"),
    (lambda g: passes.run(g, ["dce{aggressive=true}"]), "pass 'dce' has no option(s) ['aggressive']"),
], ids=["pipeline", "pass", "stop-after", "option"])
def test_mistakes_are_one_line_errors(call, message):
    with pytest.raises(ValueError) as e:
        call(graph_of(GRAPH))
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def _breaks_types(graph):
    """A buggy pass: retypes a value without changing its producer."""
    graph.types[graph.nodes[0].outputs[0]] = graph.types[graph.nodes[0].outputs[0]].with_dtype("f16")
    return {"broken": 1}


def test_verifier_between_passes_names_the_guilty_pass(monkeypatch):
    monkeypatch.setitem(PASSES, "break-types", Pass("break-types", _breaks_types, "test"))
    with pytest.raises(passes.PassVerifyError, match=r"after pass 'break-types': node %a = linear") as e:
        passes.run(graph_of(GRAPH), ["cse", "break-types", "dce"])
    assert isinstance(e.value, ir.VerifyError) and e.value.rule == "type-mismatch"
    passes.run(graph_of(GRAPH), ["break-types"], verify_each=False)  # no verifier, no error


def test_a_new_rule_pass_in_a_few_lines(monkeypatch):
    from k3c.passes import Any, Op, Rule, apply_rules

    rule = Rule("tanh-of-add-is-add", Op("tanh", Op("add", Any("a"), Any("b"))),
                lambda m, b: b.op("add", [m["a"], m["b"]]))
    monkeypatch.setitem(PASSES, "silly", Pass("silly", lambda g: apply_rules(g, [rule]), "test"))
    g = graph_of(GRAPH.replace("output y = %y", "%t: f32[N, 4] = tanh(%y)\n  output y = %t"))
    report: list = []
    out = passes.run(g, ["silly"], report=report)
    assert report[0].sites == {"tanh-of-add-is-add": 1} and "tanh" in out.op_counts()  # %dead's tanh stays
    assert out.producers()[out.outputs[0][1]].op == "add" and len(out.nodes) == 4
