"""The Triton codegen on small graphs written as IR text: each lowering and each kind of
fused group runs through the backend (lower -> module on disk -> load -> run) and equals the
interpreter; plus the grouping decisions, the dim printer and the user-facing errors."""

from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn.functional as F
from triton_inputs import gen

from k3c import ir, passes
from k3c.backends import check_supported
from k3c.backends.triton import MODULE_FILE, TritonBackend
from k3c.numerics import assert_close


def graph_of(text: str, seed: int = 0) -> ir.Graph:
    g = ir.parse(textwrap.dedent(text))
    g_ = gen(seed)
    for name in g.weights:
        shape = [int(d) for d in g.types[name].shape]
        g.weights[name] = torch.randn(shape, generator=g_) / max(shape[-1], 1) ** 0.5
    return ir.verify(g)


def through_triton(graph: ir.Graph, inputs: list[torch.Tensor], tmp_path) -> tuple[list[torch.Tensor], str]:
    """Outputs of `graph` run through the Triton backend, and the generated source."""
    backend = TritonBackend()
    check_supported(backend, graph)
    backend.lower({"forward": graph}, tmp_path)
    return backend.load(tmp_path).run("forward", *inputs), (tmp_path / MODULE_FILE).read_text()


def assert_matches_interpreter(graph, inputs, tmp_path) -> str:
    outs, source = through_triton(graph, inputs, tmp_path)
    for (name, _), a, b in zip(graph.outputs, outs, ir.interpret(graph, *inputs)):
        a = a.cpu()  # the runner's device: the GPU when the kernels are compiled
        assert a.shape == b.shape and a.dtype == b.dtype, name
        if b.is_floating_point():
            assert_close(a, b, what=name)
        else:
            assert torch.equal(a, b), name
    return source


def unit(*shape: int, seed: int = 0) -> torch.Tensor:
    return F.normalize(torch.randn(*shape, generator=gen(seed)), dim=-1)


# ---------------------------------------------------------------------- fusion


ELEMENTWISE = """
graph ew {
  dim B in [1, inf]
  dim T in [1, inf]
  input %x: f32[B, T, 4, 6]
  input %s: f32[B, T, 4, 1]
  weight %w: f32[4, 6]
  %two: f32[] = const() {value=2.0, dtype="f32"}
  %eps: f32[] = const() {value=1e-06, dtype="f32"}
  %sq: f32[B, T, 4, 6] = pow(%x, %two)
  %r: f32[B, T, 4, 1] = add(%s, %eps)
  %rs: f32[B, T, 4, 1] = rsqrt(%r)
  %a: f32[B, T, 4, 6] = mul(%sq, %rs)
  %b: f32[B, T, 4, 6] = add(%a, %w)
  %c: f32[B, T, 4, 6] = tanh(%b)
  %d: bool[B, T, 4, 6] = greater(%c, %x)
  %e: f32[B, T, 4, 6] = where(%d, %c, %x)
  %f: f32[B, T, 4, 6] = softplus(%e) {beta=2.0, threshold=10.0}
  %g: f32[B, T, 4, 6] = gelu(%f) {approximate="tanh"}
  %h: f32[B, T, 4, 6] = mul(%g, %two)
  output y = %h
}
"""


def test_an_elementwise_tree_with_broadcasts_and_constants_is_one_kernel(tmp_path):
    g = graph_of(ELEMENTWISE)
    x, s = torch.randn(2, 5, 4, 6, generator=gen(1)), torch.rand(2, 5, 4, 1, generator=gen(2))
    source = assert_matches_interpreter(g, [x, s], tmp_path)
    assert source.count("@triton.jit") == 1
    assert "rt.broadcast(ew0, (B, T, 4, 6), torch.float32, x, s, W['w'])" in source
    assert "2.0" in source and "const" not in source.split("# ---- entries")[1], "constants become literals"


SHARED = """
graph shared {
  dim N in [1, inf]
  input %x: f32[N, 8]
  %a: f32[N, 8] = sigmoid(%x)
  %b: f32[N, 8] = mul(%a, %x)
  %c: f32[N, 8] = exp(%a)
  output b = %b
  output c = %c
  output a = %a
}
"""


def test_a_value_read_outside_its_group_is_not_fused_away(tmp_path):
    source = assert_matches_interpreter(graph_of(SHARED), [torch.randn(7, 8, generator=gen(0))], tmp_path)
    assert source.count("@triton.jit") == 3  # a is an output: b and c cannot absorb it


GATED_NORM = """
graph gated_norm {
  dim B in [1, inf]
  dim T in [1, inf]
  input %o: f32[B, T, 2, 48]
  input %gate: f32[B, T, 2, 48]
  weight %w: f32[48]
  %n: f32[B, T, 2, 48] = rms_norm(%o, %w) {eps=1e-05}
  %s: f32[B, T, 2, 48] = sigmoid(%gate)
  %y: f32[B, T, 2, 48] = mul(%s, %n)
  output y = %y
}
"""


def test_rmsnorm_times_sigmoid_is_the_gated_norm_kernel(tmp_path):
    """fuse-norms makes the gated RMSNorm one op; Triton runs it as one row kernel."""
    xs = [torch.randn(2, 65, 2, 48, generator=gen(i)) for i in range(2)]
    fused = passes.run(graph_of(GATED_NORM), ["fuse-norms"])
    assert fused.op_counts() == {"gated_rms_norm": 1}
    source = assert_matches_interpreter(fused, xs, tmp_path)
    assert "y = gated_rmsnorm(o, gate, W['w'], 1e-05)" in source
    assert "@triton.jit" not in source


# ------------------------------------------------------------ each op's lowering

FUSED = """
graph fused {
  dim N in [1, inf]
  input %x: f32[N, 40]
  input %idx: i64[N, 2]
  input %cw: f32[N, 2]
  weight %w_up: f32[64, 40]
  weight %w13: f32[4, 64, 40]
  weight %w2: f32[4, 24, 32]
  %gu: f32[N, 32] = gated_mlp(%x, %w_up) {act="situ", beta=4.0, linear_beta=25.0}
  %gs: f32[N, 32] = gated_mlp(%x, %w_up) {act="silu"}
  %t: f32[N, 32] = situ(%gu, %gs) {beta=4.0, linear_beta=none}
  %e: f32[N, 24] = moe_experts(%x, %w13, %w2, %idx, %cw) {act="situ", beta=4.0, linear_beta=25.0}
  %gup: f32[N, 2, 64] = moe_gate_up(%x, %w13, %idx)
  %h: f32[N, 2, 32] = slice(%gup) {dim=2, start=0, end=32, step=1}
  %d: f32[N, 24] = moe_down(%h, %w2, %idx, %cw)
  output t = %t
  output e = %e
  output d = %d
}
"""


def test_situ_gated_mlp_and_moe_ops(tmp_path):
    N = 9
    idx = torch.stack([torch.randperm(4, generator=gen(i))[:2] for i in range(N)])
    xs = [torch.randn(N, 40, generator=gen(0)), idx, torch.rand(N, 2, generator=gen(1))]
    source = assert_matches_interpreter(graph_of(FUSED), xs, tmp_path)
    for fn in ("gated_mlp(", "situ(", "moe_experts(", "moe_gate_up(", "moe_down("):
        assert fn in source


ATTENTION = """
graph attention {
  dim B in [1, inf]
  dim T in [1, inf]
  dim P in [0, inf]
  input %q: f32[B, T, 2, 48]
  input %ckv: f32[B, P, 32]
  input %kr: f32[B, P, 16]
  input %c_new: f32[B, T, 32]
  input %kr_new: f32[B, T, 16]
  input %qa: f32[B, T, 2, 32]
  weight %w_kv_b: f32[128, 32]
  weight %w_uk: f32[2, 32, 32]
  weight %w_uv: f32[2, 32, 32]
  %c: f32[B, P + T, 32] = concat(%ckv, %c_new) {dim=1}
  %k: f32[B, P + T, 16] = concat(%kr, %kr_new) {dim=1}
  %o1: f32[B, T, 2, 32] = mla_attention(%q, %c, %k, %w_kv_b) {v_head_dim=32, scale=0.144}
  %o2: f32[B, T, 2, 32] = mla_attention_absorbed(%q, %c, %k, %w_uk, %w_uv) {scale=0.144}
  %o3: f32[B, T, 2, 32] = causal_attention(%qa, %o1, %o2) {scale=0.17}
  output o1 = %o1
  output o2 = %o2
  output o3 = %o3
}
"""


@pytest.mark.parametrize("T,P", [(1, 6), (65, 0)], ids=["decode-T1-P6", "prefill-T65"])
def test_attention_ops_with_a_growing_cache(T, P, tmp_path):
    B = 2
    xs = [torch.randn(B, T, 2, 48, generator=gen(0)), torch.randn(B, P, 32, generator=gen(1)),
          torch.randn(B, P, 16, generator=gen(2)), torch.randn(B, T, 32, generator=gen(3)),
          torch.randn(B, T, 16, generator=gen(4)), torch.randn(B, T, 2, 32, generator=gen(5))]
    assert_matches_interpreter(graph_of(ATTENTION), xs, tmp_path)


RECURRENT = """
graph recurrent {
  dim B in [1, inf]
  dim T in [1, inf]
  input %q: f32[B, T, 2, 32]
  input %k: f32[B, T, 2, 32]
  input %v: f32[B, T, 2, 48]
  input %g: f32[B, T, 2, 32]
  input %gh: f32[B, T, 2]
  input %beta: f32[B, T, 2]
  input %S: f32[B, 2, 32, 48]
  input %z: f32[B, 2, 32]
  input %x: f32[B, T, 40]
  input %cs: f32[B, 40, 3]
  weight %cw: f32[40, 4]
  %o1: f32[B, T, 2, 48], %S1: f32[B, 2, 32, 48] = kda(%q, %k, %v, %g, %beta, %S) {scale=0.2}
  %o2: f32[B, T, 2, 48], %S2: f32[B, 2, 32, 48] = gated_delta_rule(%q, %k, %v, %gh, %beta, %S) {scale=0.2}
  %o3: f32[B, T, 2, 48], %S3: f32[B, 2, 32, 48] = delta_rule(%q, %k, %v, %beta, %S) {scale=0.2}
  %o4: f32[B, T, 2, 48], %S4: f32[B, 2, 32, 48], %z4: f32[B, 2, 32] = linear_attention(%q, %k, %v, %S, %z) {scale=0.2}
  %y: f32[B, T, 40], %cs2: f32[B, 40, 3] = short_conv(%x, %cw, %cs) {activation="silu"}
  output o1 = %o1
  output S1 = %S1
  output o2 = %o2
  output S2 = %S2
  output o3 = %o3
  output S3 = %S3
  output o4 = %o4
  output S4 = %S4
  output z4 = %z4
  output y = %y
  output cs2 = %cs2
}
"""


@pytest.mark.parametrize("T", [1, 20], ids=["T1", "T20"])
def test_recurrent_ops_token_by_token(T, tmp_path):
    """A recurrent op left whole runs the fused recurrent kernel whatever T (the prefill form
    is the chunk-delta-rule pass's decision, tested with the chunk pieces below)."""
    B = 2
    pos = lambda *s, seed: torch.nn.functional.elu(torch.randn(*s, generator=gen(seed))) + 1
    xs = [pos(B, T, 2, 32, seed=0), pos(B, T, 2, 32, seed=1), torch.randn(B, T, 2, 48, generator=gen(2)),
          -torch.rand(B, T, 2, 32, generator=gen(3)), -torch.rand(B, T, 2, generator=gen(4)),
          torch.rand(B, T, 2, generator=gen(5)), 0.1 * torch.rand(B, 2, 32, 48, generator=gen(6)),
          torch.rand(B, 2, 32, generator=gen(7)) + 1, torch.randn(B, T, 40, generator=gen(8)),
          torch.randn(B, 40, 3, generator=gen(9))]
    xs[0], xs[1] = xs[0] / xs[0].norm(dim=-1, keepdim=True), xs[1] / xs[1].norm(dim=-1, keepdim=True)
    assert_matches_interpreter(graph_of(RECURRENT), xs, tmp_path)


CHUNKED = """
graph chunked {
  dim B in [1, inf]
  dim T in [1, inf]
  input %q: f32[B, T, 2, 32]
  input %k: f32[B, T, 2, 32]
  input %v: f32[B, T, 2, 48]
  input %g: f32[B, T, 2, 32]
  input %beta: f32[B, T, 2]
  input %S: f32[B, 2, 32, 48]
  %qd: f32[B, 2, ceiling(T/16), 16, 32], %kd: f32[B, 2, ceiling(T/16), 16, 32], \
%w: f32[B, 2, ceiling(T/16), 16, 32], %u: f32[B, 2, ceiling(T/16), 16, 48], \
%aqk: f32[B, 2, ceiling(T/16), 16, 16], %dl: f32[B, 2, ceiling(T/16), 32] = \
chunk_prepare(%q, %k, %v, %beta, %g) {chunk_size=16, gate="channel"}
  %vn: f32[B, 2, ceiling(T/16), 16, 48], %st: f32[B, 2, ceiling(T/16), 32, 48], %S2: f32[B, 2, 32, 48] = \
chunk_state_scan(%w, %u, %kd, %dl, %S)
  %o: f32[B, T, 2, 48] = chunk_output(%qd, %aqk, %vn, %st) {scale=0.2, T=T}
  output o = %o
  output S2 = %S2
}
"""


def test_the_three_chunked_pieces(tmp_path):
    B, T = 2, 37
    xs = [unit(B, T, 2, 32, seed=0), unit(B, T, 2, 32, seed=1), torch.randn(B, T, 2, 48, generator=gen(2)),
          -torch.rand(B, T, 2, 32, generator=gen(3)), torch.rand(B, T, 2, generator=gen(4)),
          torch.randn(B, 2, 32, 48, generator=gen(5))]
    source = assert_matches_interpreter(graph_of(CHUNKED), xs, tmp_path)
    assert "chunk_prepare(q, k, v, beta, g, 16, 'channel')  # (a)" in source


SHAPES = """
graph shapes {
  dim B in [1, inf]
  dim T in [1, inf]
  input %ids: i64[B, T]
  input %x: f32[B, T, 12]
  weight %emb: f32[10, 12]
  weight %lw: f32[12]
  weight %lb: f32[12]
  %e: f32[B, T, 12] = embedding(%emb, %ids)
  %s: f32[B, T, 12] = add(%e, %x)
  %f: f32[B*T, 12] = reshape(%s) {shape=[B*T, 12]}
  %a: f32[B*T, 4], %b: f32[B*T, 8] = split(%f) {dim=1, sizes=[4, 8]}
  %p: f32[8, B*T] = permute(%b) {perm=[1, 0]}
  %sl: f32[8, B*T - 1] = slice(%p) {dim=1, start=1, end=B*T, step=1}
  %top: f32[B*T, 2], %ti: i64[B*T, 2] = topk(%a) {k=2, dim=1}
  %ga: f32[B*T, 2] = gather(%a, %ti) {dim=1}
  %m: f32[B*T, 1] = reduce_max(%ga) {dims=[1], keepdim=true}
  %sm: f32[B*T, 4] = softmax(%a) {dim=-1}
  %ln: f32[B, T, 12] = layer_norm(%s, %lw, %lb) {eps=1e-05}
  %z: f32[B, 3] = full() {shape=[B, 3], value=0.5, dtype="f32"}
  %r: i64[T] = arange() {start=0, end=T, dtype="i64"}
  %ci: i64[T] = add(%r, %r)
  %h: f16[B, T, 12] = cast(%ln) {dtype="f16"}
  output sl = %sl
  output m = %m
  output sm = %sm
  output ln = %ln
  output z = %z
  output ci = %ci
  output h = %h
}
"""


def test_shape_ops_indexing_and_integer_values_go_through_torch(tmp_path):
    B, T = 2, 5
    xs = [torch.randint(0, 10, (B, T), generator=gen(0)), torch.randn(B, T, 12, generator=gen(1))]
    source = assert_matches_interpreter(graph_of(SHAPES), xs, tmp_path)
    assert "reshape((B*T, 12))" in source and "p[:, 1:B*T].contiguous()" in source


L2NORM = """
graph l2 {
  dim B in [1, inf]
  dim T in [1, inf]
  input %x: f32[B, T, 2, 48]
  %two: f32[] = const() {value=2.0, dtype="f32"}
  %eps: f32[] = const() {value=1e-06, dtype="f32"}
  %sq: f32[B, T, 2, 48] = pow(%x, %two)
  %s: f32[B, T, 2, 1] = reduce_sum(%sq) {dims=[3], keepdim=true}
  %a: f32[B, T, 2, 1] = add(%s, %eps)
  %r: f32[B, T, 2, 1] = rsqrt(%a)
  %y: f32[B, T, 2, 48] = mul(%x, %r)
  output y = %y
}
"""


def test_the_l2norm_chain_is_one_row_norm_kernel(tmp_path):
    """fuse-norms makes the chain one l2norm op; Triton runs it as one row kernel."""
    x = torch.randn(2, 65, 2, 48, generator=gen(0))
    fused = passes.run(graph_of(L2NORM), ["fuse-norms", "dce"])
    assert fused.op_counts() == {"l2norm": 1}
    source = assert_matches_interpreter(fused, [x], tmp_path)
    assert "y = l2norm(x, 1e-06)" in source
    assert "@triton.jit" not in source and "torch.tensor(" not in source
