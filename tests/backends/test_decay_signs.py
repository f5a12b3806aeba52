"""A positive log-decay never reaches the TVM and Triton chunk kernels silently.

Those kernels clamp each exponent at 0 (every decay <= 1), which is wrong for g > 0 (a growing
state: 0.4 off before). A kda node is lowered there only when its g is provably <= 0
(backends/signs.py), or when g is a graph input, whose values the runner then checks; the
reference and ONNX compute any sign and take every such node.
"""

from __future__ import annotations

import pytest
import torch

from k3c.backends.contract import check_inputs
from k3c.backends.signs import decay_inputs
from k3c.errors import InputError
from k3c.ir import parse

GATE = {
    "nonpos": "%e: f32[B, T, 2, 16] = exp(%x)\n  %g: f32[B, T, 2, 16] = neg(%e)",  # -exp(x), as the zoo's gates
    "weight": "%g: f32[B, T, 2, 16] = mul(%x, %a)",  # x times a weight of both signs: no proof
    "input": None,                            # g fed by the caller
}


def graph(kind: str):
    gate = GATE[kind]
    text = f"""graph g {{
  dim B in [1, inf]
  dim T in [1, inf]
  input %q: f32[B, T, 2, 16]
  input %k: f32[B, T, 2, 16]
  input %v: f32[B, T, 2, 16]
  input %{'g' if gate is None else 'x'}: f32[B, T, 2, 16]
  input %beta: f32[B, T, 2]
  input %state: f32[B, 2, 16, 16]
  weight %a: f32[16]
  {gate or '%unused: f32[B, T, 2] = neg(%beta)'}
  %o: f32[B, T, 2, 16], %s: f32[B, 2, 16, 16] = kda(%q, %k, %v, %g, %beta, %state) {{scale=0.25}}
  output o = %o
  output s = %s
}}"""
    g = parse(text)
    g.weights["a"] = torch.linspace(-1, 1, 16)
    return g


def kda(g):
    return next(n for n in g.nodes if n.op == "kda")


@pytest.mark.parametrize("backend", ["tvm", "triton"])
def test_a_gate_that_may_be_positive_is_refused_with_the_reason(backend):
    from k3c import backends

    be = backends.get(backend)
    g = graph("weight")
    ok, why = be.supports(kda(g), g)
    assert not ok and "<= 0" in why, why
    g = graph("nonpos")
    assert be.supports(kda(g), g) == (True, "")


@pytest.mark.parametrize("backend", ["reference", "onnx"])
def test_backends_that_compute_any_sign_take_it(backend):
    from k3c import backends

    g = graph("weight")
    assert backends.get(backend).supports(kda(g), g)[0]


def test_a_log_decay_fed_as_input_is_checked_at_run_time():
    g = graph("input")
    assert decay_inputs(g) == ["g"]
    shapes = [(1, 3, 2, 16)] * 4 + [(1, 3, 2), (1, 2, 16, 16)]
    inputs = [torch.zeros(s) for s in shapes]
    check_inputs(g, inputs, decay_inputs(g), "TVM")  # g = 0: fine
    inputs[3] = torch.full((1, 3, 2, 16), 0.25)
    with pytest.raises(InputError, match=r"input 'g' is a log-decay and must be <= 0 for the TVM kernels.*0\.25"):
        check_inputs(g, inputs, decay_inputs(g), "TVM")
