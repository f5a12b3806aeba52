"""The verifier rejects invalid IR with a message naming the node, the rule and the line."""

from __future__ import annotations

import pytest

from k3c.ir import VerifyError, parse, verify

GOOD = """graph small {
  dim B in [1, inf]
  dim T in [1, inf]
  input %q: f32[B, T, 2, 8]
  input %k: f32[B, T, 2, 8]
  input %v: f32[B, T, 2, 6]
  input %g: f32[B, T, 2, 8]
  input %beta: f32[B, T, 2]
  input %s: f32[B, 2, 8, 6]
  %o: f32[B, T, 2, 6], %s2: f32[B, 2, 8, 6] = kda(%q, %k, %v, %g, %beta, %s) {scale=0.35}  # model.py:12
  %y: f32[B, T, 12] = reshape(%o) {shape=[B, T, 12]}  # model.py:13
  output y = %y
  output state = %s2
}
"""


def test_good_graph_verifies():
    verify(parse(GOOD))


BAD = {
    "undefined-value": ("%o: f32[B, T, 2, 6], %s2: f32[B, 2, 8, 6] = kda(%q, %k, %v, %g, %beta, %s)",
                        "%o: f32[B, T, 2, 6], %s2: f32[B, 2, 8, 6] = kda(%q, %k, %v, %g, %nope, %s)"),
    "type-mismatch": ("%y: f32[B, T, 12] = reshape", "%y: f32[B, 12, T] = reshape"),
    "arity": ("kda(%q, %k, %v, %g, %beta, %s)", "kda(%q, %k, %v, %g, %s)"),
    "state-shape": ("input %s: f32[B, 2, 8, 6]", "input %s: f32[B, 2, 8, 5]"),
    "state-dtype": ("input %s: f32[B, 2, 8, 6]", "input %s: f16[B, 2, 8, 6]"),
    "qkv-shape": ("input %k: f32[B, T, 2, 8]", "input %k: f32[B, T, 2, 7]"),
    "reshape": ("{shape=[B, T, 12]}", "{shape=[B, T, 13]}"),
    "attr": (" {scale=0.35}", ""),
    "unknown-op": ("= reshape(%o)", "= reshuffle(%o)"),
    "undefined-output": ("output y = %y", "output y = %missing"),
    "undeclared-dim": ("input %v: f32[B, T, 2, 6]", "input %v: f32[B, Q, 2, 6]"),
}


@pytest.mark.parametrize("rule", list(BAD))
def test_bad_graph_is_rejected_with_its_rule(rule):
    old, new = BAD[rule]
    assert old in GOOD
    text = GOOD.replace(old, new)
    if rule == "undeclared-dim":
        text = text.replace("  dim T in [1, inf]\n", "  dim T in [1, inf]\n  dim Q in [1, inf]\n")
        graph = parse(text)
        del graph.dims["Q"]
    else:
        graph = parse(text)
    with pytest.raises(VerifyError) as e:
        verify(graph)
    assert e.value.rule == rule
    msg = str(e.value)
    assert f"[{rule}]" in msg
    if e.value.node is not None:
        assert e.value.node.op in msg and "model.py:1" in msg


def test_state_shape_message_names_the_expected_shape():
    with pytest.raises(VerifyError, match=r"state must be f32\[B, 2, 8, 6\], got f32\[B, 2, 8, 5\]"):
        verify(parse(BAD["state-shape"][1].join(GOOD.split(BAD["state-shape"][0]))))


def test_redefined_value():
    text = GOOD.replace("%y: f32[B, T, 12] = reshape(%o)", "%o: f32[B, T, 12] = reshape(%o)")
    with pytest.raises(ValueError, match="defined twice"):
        parse(text)
