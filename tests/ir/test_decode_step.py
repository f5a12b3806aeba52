"""The decode-step fact (k3c.ir.decode_step): the entry recorded at capture decides it, not the
name of a dim; a graph with no recorded entry falls back on a token axis of the constant 1."""

from __future__ import annotations

import pytest

from k3c import ir

MOE_ROWS = """graph g {
  dim B in [1, inf]
  dim T in [1, inf]
  input %x: f32[B, T, 8]
  input %h: f32[B, 8]
  input %one: f32[B, 1, 8]
  %y: f32[B, T, 8] = relu(%x)
  %z: f32[B, 8] = relu(%h)
  %u: f32[B, 1, 8] = relu(%one)
  output y = %y
  output z = %z
  output u = %u
}
"""


@pytest.mark.parametrize("meta, whole, x, h, one", [
    ({"entry": "decode"}, True, True, True, True),  # every value of a decode step, flattened rows too
    ({"entry": "decode.0", "segment_of": "decode"}, True, True, True, True),  # a mesh's segment of one
    ({"entry": "prefill"}, False, False, False, True),  # only a token axis of the constant 1
    ({"entry": "extend"}, False, False, False, True),
    ({}, False, False, False, True),  # no recorded entry: the shape alone
])
def test_the_recorded_entry_decides(meta, whole, x, h, one):
    g = ir.parse(MOE_ROWS)
    g.meta = dict(meta)
    assert ir.decode_step(g) is whole
    assert ir.decode_step(g, "x") is x
    assert ir.decode_step(g, "h", axis=0) is h  # [B, 8]: B rows, whatever the dim is called
    assert ir.decode_step(g, "one") is one


def test_a_dim_named_t_is_no_fact():
    """Rows over a dim that happens to be called T are a decode step's when the entry is one,
    and not in a prefill: the entry decides, not the name "T" the old test read."""
    g = ir.parse(MOE_ROWS.replace("%h: f32[B, 8]", "%h: f32[T, 8]").replace("%z: f32[B, 8]", "%z: f32[T, 8]"))
    g.meta = {"entry": "decode"}
    assert ir.decode_step(g, "h", axis=0)
    g.meta = {"entry": "prefill"}
    assert not ir.decode_step(g, "z", axis=0)
