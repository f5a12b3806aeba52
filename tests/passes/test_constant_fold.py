"""constant-fold: weight-only subgraphs become weights, constant arithmetic becomes a const,
identities go; what depends on an input, or would grow, stays."""

from __future__ import annotations

from passes_testlib import assert_same_outputs, expected, graph_of, inputs_for, run_pass

BEFORE = """graph t {
  dim B in [1, inf]
  dim T in [1, inf]
  input %x: f32[B, T, 8]
  weight %conv.weight: f32[8, 1, 4]
  weight %A_log: f32[2]
  weight %small: f32[4]
  %view: f32[8, 4] = reshape(%conv.weight) {shape=[8, 4]}
  %zeros: f32[B, 8, 3] = full() {shape=[B, 8, 3], value=0.0, dtype="f32"}
  %sc.0: f32[B, T, 8], %sc.1: f32[B, 8, 3] = short_conv(%x, %view, %zeros) {activation="silu"}
  %e: f32[2] = exp(%A_log)
  %c: f32[] = const() {value=-1.0, dtype="f32"}
  %ne: f32[2] = mul(%e, %c)
  %v: f32[2, 1] = reshape(%ne) {shape=[2, 1]}
  %xr: f32[B, T, 2, 4] = reshape(%sc.0) {shape=[B, T, 2, 4]}
  %g: f32[B, T, 2, 4] = mul(%xr, %v)
  %two: f32[] = const() {value=2.0, dtype="f32"}
  %three: f32[] = const() {value=3.0, dtype="f32"}
  %six: f32[] = mul(%two, %three)
  %one: f32[] = const() {value=1.0, dtype="f32"}
  %g1: f32[B, T, 2, 4] = mul(%g, %one)
  %g2: f32[B, T, 2, 4] = mul(%g1, %six)
  %big: f32[4, 4] = expand(%small) {shape=[4, 4]}
  %same: f32[B, T, 2, 4] = reshape(%g2) {shape=[B, T, 2, 4]}
  %flat: f32[B, T, 8] = reshape(%same) {shape=[B, T, 8]}
  %back: f32[B, T, 2, 4] = reshape(%flat) {shape=[B, T, 2, 4]}
  %f32: f32[B, T, 2, 4] = cast(%back) {dtype="f32"}
  output y = %f32
  output big = %big
  output state = %sc.1
}"""


def test_constant_fold_before_expected():
    g = graph_of(BEFORE)
    out, sites = run_pass(g, "constant-fold")
    assert sites == {"fold-weights": 4, "fold-consts": 1, "mul-by-one": 1, "reshape-to-own-shape": 2,
                     "reshape-of-reshape": 1, "cast-to-own-dtype": 1}
    assert str(out) == expected("""graph t {
  dim B in [1, inf]
  dim T in [1, inf]
  input %x: f32[B, T, 8]
  weight %small: f32[4]
  weight %conv.weight.reshape: f32[8, 4]
  weight %A_log.exp.mul.reshape: f32[2, 1]
  %zeros: f32[B, 8, 3] = full() {shape=[B, 8, 3], value=0.0, dtype="f32"}
  %sc.0: f32[B, T, 8], %sc.1: f32[B, 8, 3] = short_conv(%x, %conv.weight.reshape, %zeros) {activation="silu"}
  %xr: f32[B, T, 2, 4] = reshape(%sc.0) {shape=[B, T, 2, 4]}
  %g: f32[B, T, 2, 4] = mul(%xr, %A_log.exp.mul.reshape)
  %six: f32[] = const() {value=6.0, dtype="f32"}
  %g2: f32[B, T, 2, 4] = mul(%g, %six)
  %big: f32[4, 4] = expand(%small) {shape=[4, 4]}
  output y = %g2
  output big = %big
  output state = %sc.1
}""")
    assert_same_outputs(g, out, inputs_for(g, {"B": 2, "T": 5}))


def test_folded_weights_hold_the_computed_values():
    g = graph_of(BEFORE)
    out, _ = run_pass(g, "constant-fold")
    assert (out.weights["A_log.exp.mul.reshape"].flatten() == -g.weights["A_log"].exp()).all()


def test_identities_that_would_change_a_type_stay():
    g = graph_of("""graph t {
  dim N in [1, inf]
  input %x: f32[N, 1]
  input %h: bf16[N, 4]
  %one: f32[] = const() {value=1.0, dtype="f32"}
  %w: f32[4] = full() {shape=[4], value=1.0, dtype="f32"}
  %b: f32[N, 4] = mul(%x, %w)
  %zero: f32[] = const() {value=0.0, dtype="f32"}
  %s: f32[] = sub(%zero, %one)
  %y: f32[N, 1] = mul(%x, %s)
  %hf: f32[N, 4] = cast(%h) {dtype="f32"}
  output b = %b
  output y = %y
  output hf = %hf
}""")
    out, sites = run_pass(g, "constant-fold")
    assert sites == {"fold-consts": 1}  # 0 - 1 = -1; nothing else: mul by a [4] of ones broadcasts
    assert out.op_counts() == {"cast": 1, "const": 1, "full": 1, "mul": 2}
