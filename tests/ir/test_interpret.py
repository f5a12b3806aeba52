"""The interpreter: binds symbolic dims from the inputs and names an input that does not fit."""

from __future__ import annotations

import pytest
import torch

from k3c.ir import InputError, interpret, load, parse, save
from k3c.kernels import kda

TEXT = """graph kda_layer {
  dim B in [1, inf]
  dim T in [1, inf]
  input %q: f32[B, T, 2, 8]
  input %k: f32[B, T, 2, 8]
  input %v: f32[B, T, 2, 6]
  input %g: f32[B, T, 2, 8]
  input %beta: f32[B, T, 2]
  input %s: f32[B, 2, 8, 6]
  weight %w: f32[4, 12]
  %o: f32[B, T, 2, 6], %s2: f32[B, 2, 8, 6] = kda(%q, %k, %v, %g, %beta, %s) {scale=0.35}
  %h: f32[B, T, 12] = reshape(%o) {shape=[B, T, 12]}
  %y: f32[B, T, 4] = linear(%h, %w)
  output y = %y
  output state = %s2
}
"""


def _inputs(B=2, T=5):
    gen = torch.Generator().manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(B, T, 2, 8, generator=gen), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(B, T, 2, 8, generator=gen), dim=-1)
    return [q, k, torch.randn(B, T, 2, 6, generator=gen), -torch.rand(B, T, 2, 8, generator=gen),
            torch.rand(B, T, 2, generator=gen), torch.randn(B, 2, 8, 6, generator=gen)]


def _graph():
    g = parse(TEXT)
    g.weights["w"] = torch.randn(4, 12, generator=torch.Generator().manual_seed(1))
    return g


def test_interpret_matches_the_kernel_definition():
    g = _graph()
    xs = _inputs(3, 7)
    y, state = interpret(g, *xs)
    o, s = kda(*xs[:5], scale=0.35, initial_state=xs[5])
    torch.testing.assert_close(y, o.reshape(3, 7, 12) @ g.weights["w"].t())
    torch.testing.assert_close(state, s)


@pytest.mark.parametrize("index, bad, message", [
    (5, torch.randn(2, 2, 8, 5), r"input 's': expected f32\[B, 2, 8, 6\], got \[2, 2, 8, 5\]"),
    (1, torch.randn(2, 4, 2, 8), r"input 'k'.*dim 1 is 4, expected 5"),
    (4, torch.rand(2, 5, 2).double(), r"input 'beta': expected f32\[B, T, 2\], got torch.float64"),
], ids=["state-shape", "T-mismatch", "dtype"])
def test_a_misfit_input_is_named(index, bad, message):
    xs = _inputs()
    xs[index] = bad
    with pytest.raises(InputError, match=message):
        interpret(_graph(), *xs)


def test_wrong_input_count():
    with pytest.raises(InputError, match="takes 6 inputs"):
        interpret(_graph(), *_inputs()[:5])


def test_save_load_round_trip(tmp_path):
    g = _graph()
    save(g, tmp_path / "g")
    again = load(tmp_path / "g")
    assert again.structurally_equal(g)
    assert torch.equal(again.weights["w"], g.weights["w"])
    xs = _inputs()
    for a, b in zip(interpret(g, *xs), interpret(again, *xs)):
        assert torch.equal(a, b)
