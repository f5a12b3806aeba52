"""The pattern language: ops and sub-patterns, captures, constants, commutative and product
matching, casts, and the single-use rule that keeps a rewrite from duplicating work."""

from __future__ import annotations

import pytest
from passes_testlib import graph_of

from k3c.passes.pattern import Any, Const, Context, Op, Product, Weight, match, maybe_cast

G = graph_of("""graph t {
  dim N in [1, inf]
  input %x: f32[N, 4]
  input %y: f32[N, 4]
  input %h: bf16[N, 4]
  weight %w: f32[4, 4]
  %c2: f32[] = const() {value=2.0, dtype="f32"}
  %c3: f32[] = const() {value=3.0, dtype="f32"}
  %c2b: f32[] = const() {value=2.0, dtype="f32"}
  %xc: f32[N, 4] = mul(%c2, %x)
  %d: f32[N, 4] = sub(%xc, %y)
  %p1: f32[N, 4] = mul(%x, %y)
  %p2: f32[N, 4] = mul(%c3, %p1)
  %p3: f32[N, 4] = mul(%p2, %x)
  %sq: f32[N, 4] = mul(%x, %x)
  %hf: f32[N, 4] = cast(%h) {dtype="f32"}
  %l: f32[N, 4] = linear(%hf, %w)
  %two: f32[] = mul(%c2, %c2b)
  %used_twice: f32[N, 4] = tanh(%x)
  %u1: f32[N, 4] = sigmoid(%used_twice)
  %u2: f32[N, 4] = neg(%used_twice)
  %s: f32[N, 4] = softmax(%u1) {dim=1}
  output d = %d
  output p3 = %p3
  output sq = %sq
  output l = %l
  output two = %two
  output u2 = %u2
  output s = %s
}""")
CTX = Context.of(G)
P = G.producers()


def m(pattern, value):
    return match(pattern, P[value], CTX)


def test_commutative_op_matches_either_operand_order():
    found = m(Op("mul", Any("v"), Const("c")), "xc")  # written mul(%c2, %x)
    assert found["v"] == "x" and found.const("c") == 2.0


def test_non_commutative_op_keeps_its_order():
    assert m(Op("sub", Any("a"), Op("mul", Any(), Any())), "d") is None
    assert m(Op("sub", Op("mul", Any(), Any()), Any("b")), "d")["b"] == "y"


def test_a_name_twice_is_one_value():
    assert m(Op("mul", Any("v"), Any("v")), "sq")["v"] == "x"
    assert m(Op("mul", Any("v"), Any("v")), "p1") is None


def test_a_const_name_twice_is_one_number():
    assert m(Op("mul", Const("c"), Const("c")), "two").const("c") == 2.0
    assert m(Op("mul", Const("c", lambda v: v > 2), Any()), "xc") is None


@pytest.mark.parametrize("factors", [
    (Any("a"), Any("b"), Const("k"), Any("a")),
    (Const("k"), Any("a"), Any("a"), Any("b")),
], ids=["as-written", "reordered"])
def test_product_matches_any_association_and_order(factors):
    found = m(Product(*factors), "p3")  # (3 * (x * y)) * x
    assert (found["a"], found["b"], found.const("k")) == ("x", "y", 3.0)
    assert {n.outputs[0] for n in found.nodes} == {"p1", "p2", "p3"}


def test_product_with_the_wrong_number_of_factors_does_not_match():
    assert m(Product(Any(), Any()), "p3") is not None  # (3 * (x * y)) times x: two factors
    assert m(Product(Any(), Any(), Any(), Any(), Any()), "p3") is None


def test_maybe_cast_and_weights():
    found = m(Op("linear", maybe_cast(Any("v"), name="cast"), Weight("w")), "l")
    assert found["v"] == "h" and found["w"] == "w" and found.node("cast").op == "cast"
    assert m(Op("linear", Any(), Weight()), "l") is not None
    assert m(Op("mul", Any(), Weight()), "xc") is None


def test_attribute_predicates():
    assert m(Op("softmax", Any(), where=lambda a: a["dim"] == 1), "s") is not None
    assert m(Op("softmax", Any(), where=lambda a: a["dim"] == 0), "s") is None


def test_an_inner_node_used_outside_the_match_is_not_taken():
    assert m(Op("sigmoid", Op("tanh", Any())), "u1") is None  # tanh also feeds %u2
    assert m(Op("sigmoid", Any()), "u1") is not None
    assert m(Op("softmax", Op("sigmoid", Any())), "s") is not None
