"""The standard IR ops (elementwise, shapes, reductions, norms, indexing) on one IR-text
graph with symbolic dims inside attributes (reshape to B*T, slice to T - 1, arange to T,
full of [B, T], split sizes): lowered, then run by onnxruntime (both flavours) and by onnx's
reference evaluator, against the interpreter, at several T from one lowering.

topk reads tie-free scores: ONNX breaks ties by the lower index, torch leaves it open."""

from __future__ import annotations

import pytest
import torch
from onnx_cases import run_ort, run_reference_evaluator

from k3c.ir import parse, verify
from k3c.numerics import assert_close

STANDARD_OPS = """
graph standard {
  dim B in [1, inf]
  dim T in [1, inf]
  input %x: f32[B, T, 8]
  input %ids: i64[B, T]
  weight %emb: f32[50, 8]
  weight %w: f32[6, 8]
  weight %bias: f32[6]
  weight %ln_w: f32[8]
  weight %ln_b: f32[8]
  %e: f32[B, T, 8] = embedding(%emb, %ids)
  %h: f32[B, T, 8] = add(%x, %e)
  %l: f32[B, T, 6] = linear(%h, %w, %bias)
  %sp: f32[B, T, 6] = softplus(%l) {beta=2.0, threshold=3.0}
  %ge: f32[B, T, 6] = gelu(%l) {approximate="tanh"}
  %gn: f32[B, T, 6] = gelu(%l) {approximate="none"}
  %el: f32[B, T, 6] = elu(%l) {alpha=0.7}
  %si: f32[B, T, 6] = silu(%l)
  %act: f32[B, T, 6] = add(%sp, %ge)
  %act2: f32[B, T, 6] = sub(%el, %si)
  %act3: f32[B, T, 6] = mul(%act, %gn)
  %two: f32[] = const() {value=2.0, dtype="f32"}
  %sq: f32[B, T, 6] = pow(%act2, %two)
  %rs: f32[B, T, 6] = rsqrt(%sq)
  %ab: f32[B, T, 6] = abs(%act3)
  %ab2: f32[B, T, 6] = add(%ab, %two)
  %lg: f32[B, T, 6] = log(%ab2)
  %nab: f32[B, T, 6] = neg(%ab)
  %ex: f32[B, T, 6] = exp(%nab)
  %rc: f32[B, T, 6] = reciprocal(%ex)
  %ng: f32[B, T, 6] = neg(%rc)
  %th: f32[B, T, 6] = tanh(%ng)
  %rl: f32[B, T, 6] = relu(%lg)
  %sg: f32[B, T, 6] = sigmoid(%rl)
  %st: f32[B, T, 6] = sqrt(%sg)
  %mx: f32[B, T, 6] = maximum(%th, %st)
  %mn: f32[B, T, 6] = minimum(%rs, %mx)
  %dv: f32[B, T, 6] = div(%mn, %two)
  %lt: bool[B, T, 6] = less(%dv, %th)
  %gt: bool[B, T, 6] = greater(%dv, %st)
  %wh: f32[B, T, 6] = where(%lt, %dv, %th)
  %wh2: f32[B, T, 6] = where(%gt, %wh, %st)
  %ln: f32[B, T, 8] = layer_norm(%h, %ln_w, %ln_b) {eps=1e-05}
  %rn: f32[B, T, 8] = rms_norm(%h, %ln_w) {eps=1e-06}
  %rn0: f32[B, T, 8] = rms_norm(%h) {eps=1e-06}
  %flat: f32[B*T, 8] = reshape(%ln) {shape=[B*T, 8]}
  %back: f32[B, T, 2, 4] = reshape(%flat) {shape=[B, T, 2, 4]}
  %q: f32[B, 2, T, 4] = permute(%back) {perm=[0, 2, 1, 3]}
  %kt: f32[B, 2, 4, T] = permute(%back) {perm=[0, 2, 3, 1]}
  %sc: f32[B, 2, T, T] = matmul(%q, %kt)
  %pr: f32[B, 2, T, T] = softmax(%sc) {dim=-1}
  %tail: f32[B, T - 1, 8] = slice(%rn) {dim=1, start=1, end=T, step=1}
  %head: f32[B, 1, 8] = slice(%rn0) {dim=1, start=0, end=1, step=1}
  %rest: f32[B, T - 1, 8] = slice(%rn0) {dim=1, start=1, end=T, step=1}
  %cat: f32[B, 2*T - 1, 8] = concat(%head, %tail, %rest) {dim=1}
  %ar: i64[T] = arange() {start=0, end=T, dtype="i64"}
  %arf: f32[T] = cast(%ar) {dtype="f32"}
  %fl: f32[B, T] = full() {shape=[B, T], value=0.5, dtype="f32"}
  %pos: f32[B, T] = add(%fl, %arf)
  %pos3: f32[B, T, 1] = reshape(%pos) {shape=[B, T, 1]}
  %pe: f32[B, T, 8] = expand(%pos3) {shape=[B, T, 8]}
  %s1: f32[B, T, 3], %s2: f32[B, T, 5] = split(%pe) {dim=2, sizes=[3, 5]}
  %stk: f32[2, B, T, 8] = stack(%h, %pe) {dim=0}
  %tv: f32[B, T, 3], %ti: i64[B, T, 3] = topk(%l) {k=3, dim=-1}
  %ga: f32[B, T, 3] = gather(%act3, %ti) {dim=2}
  %rsum: f32[B, 8] = reduce_sum(%h) {dims=[1], keepdim=false}
  %rmean: f32[B, T, 1] = reduce_mean(%h) {dims=[-1], keepdim=true}
  %rmax: f32[2, B, T] = reduce_max(%stk) {dims=[3], keepdim=false}
  output where = %wh2
  output probs = %pr
  output cat = %cat
  output split = %s2
  output topk = %tv
  output indices = %ti
  output gathered = %ga
  output sum = %rsum
  output mean = %rmean
  output max = %rmax
  output first = %s1
}
"""


def _inputs(T: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(2, T, 8, generator=gen), torch.randint(0, 50, (2, T), generator=gen)]


@pytest.fixture(scope="module")
def graph():
    g = parse(STANDARD_OPS)
    gen = torch.Generator().manual_seed(1)
    for name in g.weights:
        g.weights[name] = torch.randn(*g.weights[name].shape, generator=gen)
    return verify(g)


@pytest.mark.parametrize("T", [2, 7, 65], ids=lambda t: f"T{t}")
@pytest.mark.parametrize("flavour", ["portable", "ort"])
def test_standard_ops(graph, flavour, T):
    from k3c.ir import interpret

    inputs = _inputs(T)
    want = interpret(graph, *inputs)
    for (name, _), a, b in zip(graph.outputs, run_ort(graph, inputs, flavour), want):
        if a.dtype == torch.int64:
            assert torch.equal(a, b), name
        else:
            assert_close(a, b, what=f"{name} ({flavour}, T={T})")


def test_standard_ops_reference_evaluator(graph):
    from k3c.ir import interpret

    inputs = _inputs(5)
    for (name, _), a, b in zip(graph.outputs, run_reference_evaluator(graph, inputs), interpret(graph, *inputs)):
        assert_close(a.to(b.dtype), b, what=f"{name} (onnx reference evaluator)")
