"""dce and cse: Before/Expected IR text and what they must keep."""

from __future__ import annotations

from passes_testlib import assert_same_outputs, expected, graph_of, inputs_for, run_pass

DEAD = """graph t {
  dim N in [1, inf]
  input %x: f32[N, 4]
  input %unused: f32[N, 4]
  weight %w: f32[4, 4]
  weight %w_dead: f32[4, 4]
  %a: f32[N, 4] = linear(%x, %w)
  %dead1: f32[N, 4] = linear(%x, %w_dead)
  %dead2: f32[N, 4] = tanh(%dead1)
  %b: f32[N, 4] = sigmoid(%a)
  %k.0: f32[N, 2], %k.1: i64[N, 2] = topk(%b) {k=2, dim=1}
  output b = %b
  output idx = %k.1
}"""


def test_dce_removes_dead_nodes_and_weights_keeps_inputs_and_multi_output_nodes():
    g = graph_of(DEAD)
    out, sites = run_pass(g, "dce")
    assert sites == {"dead-node": 2, "unused-weight": 1}
    assert str(out) == expected("""graph t {
  dim N in [1, inf]
  input %x: f32[N, 4]
  input %unused: f32[N, 4]
  weight %w: f32[4, 4]
  %a: f32[N, 4] = linear(%x, %w)
  %b: f32[N, 4] = sigmoid(%a)
  %k.0: f32[N, 2], %k.1: i64[N, 2] = topk(%b) {k=2, dim=1}
  output b = %b
  output idx = %k.1
}""")
    assert_same_outputs(g, out, inputs_for(g, {"N": 3}))


def test_dce_on_a_live_graph_changes_nothing():
    g, _ = run_pass(graph_of(DEAD), "dce")
    again, sites = run_pass(g, "dce")
    assert sites == {} and str(again) == str(g)


def test_cse_merges_repeats_and_commuted_operands():
    g = graph_of("""graph t {
  dim N in [1, inf]
  input %x: f32[N, 4]
  input %y: f32[N, 4]
  %c1: f32[] = const() {value=2.0, dtype="f32"}
  %c2: f32[] = const() {value=2.0, dtype="f32"}
  %a: f32[N, 4] = mul(%x, %c1)
  %b: f32[N, 4] = mul(%x, %c2)
  %s1: f32[N, 4] = add(%x, %y)
  %s2: f32[N, 4] = add(%y, %x)
  %d1: f32[N, 4] = sub(%x, %y)
  %d2: f32[N, 4] = sub(%y, %x)
  %r: f32[N, 4] = add(%a, %b)
  %t: f32[N, 4] = mul(%s1, %s2)
  %u: f32[N, 4] = mul(%d1, %d2)
  output r = %r
  output t = %t
  output u = %u
}""")
    out, sites = run_pass(g, "cse")
    assert sites == {"common-subexpression": 3}
    assert str(out) == expected("""graph t {
  dim N in [1, inf]
  input %x: f32[N, 4]
  input %y: f32[N, 4]
  %c1: f32[] = const() {value=2.0, dtype="f32"}
  %a: f32[N, 4] = mul(%x, %c1)
  %s1: f32[N, 4] = add(%x, %y)
  %d1: f32[N, 4] = sub(%x, %y)
  %d2: f32[N, 4] = sub(%y, %x)
  %r: f32[N, 4] = add(%a, %a)
  %t: f32[N, 4] = mul(%s1, %s1)
  %u: f32[N, 4] = mul(%d1, %d2)
  output r = %r
  output t = %t
  output u = %u
}""")
    assert_same_outputs(g, out, inputs_for(g, {"N": 2}))


def test_cse_keeps_nodes_that_differ_in_attributes_or_type():
    g = graph_of("""graph t {
  dim N in [1, inf]
  input %x: f32[N, 4]
  %a: f32[N, 2] = slice(%x) {dim=1, start=0, end=2}
  %b: f32[N, 2] = slice(%x) {dim=1, start=2, end=4}
  %c: f32[N, 2] = slice(%x) {dim=1, start=0, end=2, step=1}
  %h: bf16[N, 4] = cast(%x) {dtype="bf16"}
  %f: f16[N, 4] = cast(%x) {dtype="f16"}
  output a = %a
  output b = %b
  output c = %c
  output h = %h
  output f = %f
}""")
    out, sites = run_pass(g, "cse")
    assert sites == {"common-subexpression": 1}  # only the slice whose step is spelled out
    assert out.outputs[2] == ("c", "a")
