"""Malformed IR text and random attribute values through parse, verify and interpret: only
k3c's own errors come out (a ParseError names the line, a VerifyError the node and rule,
an InputError the input), never a library's exception, and each answer comes within a second."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from k3c.errors import InputError, K3cError, VerifyError
from k3c.ir import dims as D
from k3c.ir import interpret, parse, verify

BASE = """graph g {
  dim B in [1, inf]
  dim T in [1, 64]
  input %x: f32[B, T, 8]
  weight %w: f32[6, 8]
  %h: f32[B, T, 6] = linear(%x, %w)
  %n: f32[B, T, 6] = rms_norm(%h) {eps=1e-05}
  %s: f32[B, T, 3], %t: f32[B, T, 3] = split(%n) {dim=2, sizes=[3, 3]}
  %c: f32[] = const() {value=2.0, dtype="f32"}
  %p: f32[B, T, 3] = pow(%s, %c)
  %r: f32[B, T, 1] = reduce_sum(%p) {dims=[2], keepdim=true}
  %sl: f32[B, T - 1, 3] = slice(%t) {dim=1, start=1, end=T, step=1}
  %g: f32[B, T, 3] = gelu(%t) {approximate="tanh"}
  %sp: f32[B, T, 3] = softplus(%g) {beta=1.0, threshold=20.0}
  %o: f32[B, T, 6] = concat(%sp, %s) {dim=-1}
  output o = %o
  output r = %r
  output sl = %sl
}
"""

K3C_ERRORS = (K3cError,)  # ParseError, VerifyError, InputError, ShapeError, ... all derive from it

VALUES = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["true", "false", "none", '"tanh"', '"none"', '"f32"', '"x\\"y"', "[]", "[1, 2]", "[B, T]",
                     "T", "B*T", "T - 1", "ceiling(T/64)", "inf", "-inf", "nan", "9**9**9", "[[1]]", '"f99"',
                     "T/0", "(((T)))", "-T", "2**62", "1e400", "[3, 3, 3]", "[-1]", "[5]"]),
)


def _inputs(graph):
    env = {"B": 2, "T": 5}
    out = []
    for name in graph.inputs:
        t = graph.types[name]
        shape = [D.evaluate(d, env) for d in t.shape]
        out.append(torch.randn(shape).to(t.torch_dtype) if t.dtype.startswith(("f", "bf")) else
                   torch.zeros(shape, dtype=t.torch_dtype))
    return out


def _bind_weights(graph):
    """The text form carries weight types only: give each weight real values to run on."""
    for name, t in graph.weights.items():
        graph.weights[name] = (torch.randn(t.shape) if t.is_floating_point() else torch.zeros(t.shape)).to(t.dtype)
    return graph


def _run(text: str) -> None:
    try:
        g = _bind_weights(verify(parse(text)))
        interpret(g, *_inputs(g))
    except K3C_ERRORS:
        pass


_SETTINGS = settings(max_examples=150, deadline=1000, suppress_health_check=[HealthCheck.too_slow])


def test_the_base_graph_runs():
    g = _bind_weights(verify(parse(BASE)))
    outs = interpret(g, *_inputs(g))
    assert [tuple(o.shape) for o in outs] == [(2, 5, 6), (2, 5, 1), (2, 4, 3)]
    assert all(torch.isfinite(o).all() for o in outs)


@pytest.mark.parametrize("decl", ["weight %w: f32[-6, 8]", "input %x: f32[B, -1, 8]"])
def test_a_negative_dimension_is_a_parse_error_that_names_it(decl):
    head = decl.split(":")[0]
    text = "\n".join(decl if line.strip().startswith(head) else line for line in BASE.splitlines())
    with pytest.raises(K3cError, match=r"negative dimension -\d+"):
        parse(text)


def test_a_weight_without_data_is_named_not_run_on():
    g = verify(parse(BASE))  # the text form leaves %w a meta tensor
    with pytest.raises(InputError, match="weight %w carries no data"):
        interpret(g, *_inputs(g))


@_SETTINGS
@given(st.lists(st.tuples(st.integers(0, len(BASE) - 1), st.sampled_from(list("%[](){},=:#\"- 0123456789BTxfiz.")),
                          st.sampled_from(["insert", "replace", "delete"])), min_size=1, max_size=6))
def test_edited_text(edits):
    chars = list(BASE)
    for pos, ch, how in edits:
        pos = min(pos, len(chars) - 1)
        if how == "insert":
            chars.insert(pos, ch)
        elif how == "replace":
            chars[pos] = ch
        else:
            del chars[pos]
    _run("".join(chars))


ATTRS = [("eps=1e-05", "eps"), ("dim=2, sizes=[3, 3]", "sizes"), ("dims=[2], keepdim=true", "keepdim"),
         ("dim=1, start=1, end=T, step=1", "end"), ('approximate="tanh"', "approximate"),
         ("beta=1.0, threshold=20.0", "beta"), ("dim=-1", "dim"), ('value=2.0, dtype="f32"', "dtype")]


@_SETTINGS
@given(st.sampled_from(ATTRS), VALUES, st.booleans())
def test_random_attribute_values(which, value, add_unknown):
    body, key = which
    attrs = ", ".join(f"{key}={value}" if part.split("=")[0] == key else part for part in body.split(", "))
    if add_unknown:
        attrs += f", frob={value}"
    _run(BASE.replace("{" + body + "}", "{" + attrs + "}", 1))


@_SETTINGS
@given(st.sampled_from(["B", "T", "T - 1", "8", "6", "3"]), VALUES)
def test_random_shape_expressions(old, new):
    """A dim of a declared type replaced by anything: still only k3c's errors, and fast."""
    _run(BASE.replace("f32[B, T, 6] = rms_norm", f"f32[{new}, T, 6] = rms_norm", 1).replace(
        f"[B, {old}, 3] = slice", f"[B, {new}, 3] = slice", 1))


def test_a_mistyped_attribute_is_refused_not_coerced():
    """`eps=true` used to run with eps = 1.0: the verifier now names the attribute and the type."""
    bad = BASE.replace("{eps=1e-05}", "{eps=true}")
    try:
        verify(parse(bad))
    except VerifyError as e:
        assert "attribute eps of rms_norm must be a finite float32 value, got True (bool)" in str(e)
        assert e.rule == "attr"
    else:
        raise AssertionError("eps=true was accepted")
