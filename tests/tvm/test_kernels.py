"""Each TensorIR kernel of the TVM backend, lowered from a one-op IR graph, against the
interpreter (the naive references): T in {1, 63, 65}, batch 2, head dims that are not powers
of two, every output (states included) compared."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import k3c
from k3c.backends.tvm import TvmBackend
from k3c.ir import dims as D
from k3c.numerics import assert_close

LENGTHS = (1, 63, 65)

# IR text of each case: dims B, T (and P, a cache length, where there is one); H = 3 heads,
# K = 24, V = 20 (not powers of two); weights are filled in by `weights_for`.
_QKV = """
  input %q: f32[B, T, 3, 24]
  input %k: f32[B, T, 3, 24]
  input %v: f32[B, T, 3, 20]
"""
def _chunk_case(KD: int, gate: str, args: str, C: int = 16) -> str:
    """prepare -> state scan -> output, chunk size C, in chunk layout [B, 3, NC, C, ...]."""
    nc = f"B, 3, ceiling(T/{C})"
    outs = [("qd", f"{C}, 24"), ("kd", f"{C}, 24"), ("w", f"{C}, 24"), ("u", f"{C}, 20"), ("aqk", f"{C}, {C}"),
            ("dl", str(KD))]
    prepare = ", ".join(f"%{n}: f32[{nc}, {s}]" for n, s in outs)
    return f"""
  {prepare} = chunk_prepare({args}) {{chunk_size={C}, gate="{gate}"}}
  %vn: f32[{nc}, {C}, 20], %st: f32[{nc}, 24, 20], %s2: f32[B, 3, 24, 20] = chunk_state_scan(%w, %u, %kd, %dl, %s)
  %o: f32[B, T, 3, 20] = chunk_output(%qd, %aqk, %vn, %st) {{scale=0.3, T=T}}
  output o = %o
  output s = %s2
  output w = %w
  output u = %u
  output aqk = %aqk
  output dl = %dl
"""


_STATE = "  input %s: f32[B, 3, 24, 20]\n"
_BETA = "  input %beta: f32[B, T, 3]\n"

CASES = {
    "kda": _QKV + "  input %g: f32[B, T, 3, 24]\n" + _BETA + _STATE + """
  %o: f32[B, T, 3, 20], %s2: f32[B, 3, 24, 20] = kda(%q, %k, %v, %g, %beta, %s) {scale=0.3}
  output o = %o
  output s = %s2""",
    "gated_delta_rule": _QKV + "  input %g: f32[B, T, 3]\n" + _BETA + _STATE + """
  %o: f32[B, T, 3, 20], %s2: f32[B, 3, 24, 20] = gated_delta_rule(%q, %k, %v, %g, %beta, %s) {scale=0.3}
  output o = %o
  output s = %s2""",
    "delta_rule": _QKV + _BETA + _STATE + """
  %o: f32[B, T, 3, 20], %s2: f32[B, 3, 24, 20] = delta_rule(%q, %k, %v, %beta, %s) {scale=0.3}
  output o = %o
  output s = %s2""",
    "linear_attention": _QKV + _STATE + "  input %z: f32[B, 3, 24]\n" + """
  %o: f32[B, T, 3, 20], %s2: f32[B, 3, 24, 20], %z2: f32[B, 3, 24] = linear_attention(%q, %k, %v, %s, %z) {scale=0.3}
  output o = %o
  output s = %s2
  output z = %z2""",
    "chunk_kda": _QKV + "  input %g: f32[B, T, 3, 24]\n" + _BETA + _STATE
    + _chunk_case(24, "channel", "%q, %k, %v, %beta, %g"),
    # C = 64: chunk_scores factors the pairs of different 16-row sub-blocks through a pivot row
    "chunk_kda_c64": _QKV + "  input %g: f32[B, T, 3, 24]\n" + _BETA + _STATE
    + _chunk_case(24, "channel", "%q, %k, %v, %beta, %g", C=64),
    "chunk_gated_delta_rule": _QKV + "  input %g: f32[B, T, 3]\n" + _BETA + _STATE
    + _chunk_case(1, "head", "%q, %k, %v, %beta, %g"),
    "chunk_delta_rule": _QKV + _BETA + _STATE + _chunk_case(1, "none", "%q, %k, %v, %beta"),
    "chunk_linear": _QKV + _STATE + _chunk_case(1, "linear", "%q, %k, %v"),
    "short_conv": """
  input %x: f32[B, T, 40]
  input %cs: f32[B, 40, 3]
  weight %cw: f32[40, 4]
  %y: f32[B, T, 40], %cs2: f32[B, 40, 3] = short_conv(%x, %cw, %cs) {activation="silu"}
  output y = %y
  output s = %cs2""",
    "causal_attention": """
  dim P in [1, inf]
  input %q: f32[B, T, 3, 24]
  input %kc: f32[B, P, 3, 24]
  input %vc: f32[B, P, 3, 20]
  input %kn: f32[B, T, 3, 24]
  input %vn: f32[B, T, 3, 20]
  %k: f32[B, P + T, 3, 24] = concat(%kc, %kn) {dim=1}
  %v: f32[B, P + T, 3, 20] = concat(%vc, %vn) {dim=1}
  %o: f32[B, T, 3, 20] = causal_attention(%q, %k, %v) {scale=0.2}
  output o = %o""",
    "mla_attention": """
  dim P in [1, inf]
  input %q: f32[B, T, 3, 32]
  input %ckv0: f32[B, P, 28]
  input %kr0: f32[B, P, 12]
  input %ckv1: f32[B, T, 28]
  input %kr1: f32[B, T, 12]
  weight %wkv: f32[108, 28]
  %ckv: f32[B, P + T, 28] = concat(%ckv0, %ckv1) {dim=1}
  %krope: f32[B, P + T, 12] = concat(%kr0, %kr1) {dim=1}
  %o: f32[B, T, 3, 16] = mla_attention(%q, %ckv, %krope, %wkv) {v_head_dim=16, scale=0.17}
  output o = %o""",
    "mla_attention_decode": """
  dim P in [1, inf]
  input %q: f32[B, 1, 3, 32]
  input %ckv: f32[B, P, 28]
  input %krope: f32[B, P, 12]
  weight %wkv: f32[108, 28]
  %o: f32[B, 1, 3, 16] = mla_attention(%q, %ckv, %krope, %wkv) {v_head_dim=16, scale=0.17}
  output o = %o""",
    "mla_attention_absorbed": """
  dim P in [1, inf]
  input %q: f32[B, T, 3, 32]
  input %ckv0: f32[B, P, 28]
  input %kr0: f32[B, P, 12]
  input %ckv1: f32[B, T, 28]
  input %kr1: f32[B, T, 12]
  weight %wuk: f32[3, 20, 28]
  weight %wuv: f32[3, 16, 28]
  %ckv: f32[B, P + T, 28] = concat(%ckv0, %ckv1) {dim=1}
  %krope: f32[B, P + T, 12] = concat(%kr0, %kr1) {dim=1}
  %o: f32[B, T, 3, 16] = mla_attention_absorbed(%q, %ckv, %krope, %wuk, %wuv) {scale=0.17}
  output o = %o""",
    "attn_res_mix": """
  input %V: f32[3, B, T, 40]
  weight %rw: f32[40]
  weight %rn: f32[40]
  %y: f32[B, T, 40] = attn_res_mix(%V, %rw, %rn) {eps=1e-05}
  output y = %y""",
    "moe": """
  input %h: f32[B, T, 24]
  weight %wr: f32[6, 24]
  weight %w13: f32[6, 40, 24]
  weight %w2: f32[6, 28, 20]
  %x: f32[B*T, 24] = reshape(%h) {shape=[B*T, 24]}
  %logits: f32[B*T, 6] = linear(%x, %wr)
  %top.0: f32[B*T, 2], %top.1: i64[B*T, 2] = topk(%logits) {k=2, dim=1}
  %cw: f32[B*T, 2] = softmax(%top.0) {dim=1}
  %gu: f32[B*T, 2, 40] = moe_gate_up(%x, %w13, %top.1)
  %g: f32[B*T, 2, 20] = slice(%gu) {dim=2, start=0, end=20, step=1}
  %a: f32[B*T, 2, 20] = slice(%gu) {dim=2, start=20, end=40, step=1}
  %act: f32[B*T, 2, 20] = situ(%g, %a) {beta=4.0, linear_beta=25.0}
  %y: f32[B*T, 28] = moe_down(%act, %w2, %top.1, %cw)
  %y2: f32[B*T, 28] = moe_experts(%x, %w13, %w2, %top.1, %cw) {act="silu"}
  output y = %y
  output y2 = %y2""",
    "gated_mlp": """
  input %h: f32[B, T, 24]
  weight %wgu: f32[40, 24]
  %y: f32[B, T, 20] = gated_mlp(%h, %wgu) {act="situ", beta=4.0, linear_beta=25.0}
  %y2: f32[B, T, 20] = gated_mlp(%h, %wgu) {act="silu"}
  output y = %y
  output y2 = %y2""",
}


def graph_of(case: str) -> k3c.ir.Graph:
    body = CASES[case]
    dims = "  dim B in [1, inf]\n" + ("  dim T in [1, inf]\n" if "T" in body else "")
    g = k3c.ir.parse(f"graph {case} {{\n{dims}{body}\n}}\n")
    gen = torch.Generator().manual_seed(7)
    for name in list(g.weights):
        shape = tuple(int(d) for d in g.types[name].shape)
        g.weights[name] = torch.randn(shape, generator=gen) * (0.3 if name.startswith("w") else 1.0)
    return g


def inputs_for(g: k3c.ir.Graph, T: int, seed: int = 0) -> list[torch.Tensor]:
    """Inputs in range for each role: unit-norm keys, log-decays <= 0, beta in (0, 1),
    positive features for linear attention."""
    gen = torch.Generator().manual_seed(seed)
    env = {"B": 2, "T": T, "P": 5}
    out = []
    for name in g.inputs:
        shape = [D.evaluate(d, env) for d in g.types[name].shape]
        x = torch.randn(shape, generator=gen)
        if name in ("k", "kn", "kc") and g.name != "chunk_linear" and g.name != "linear_attention":
            x = F.normalize(x, dim=-1)
        if name == "g":
            x = -F.softplus(x) * 0.5
        if name == "beta":
            x = torch.sigmoid(x)
        if g.name in ("linear_attention", "chunk_linear") and name in ("q", "k", "s", "z"):
            x = x.abs() + 0.1
        out.append(x)
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """built(case) -> (graph, runner): each case lowered for llvm once."""
    cache = {}

    def get(case: str):
        if case not in cache:
            g = graph_of(case)
            out = tmp_path_factory.mktemp(f"kernel-{case}")
            be = TvmBackend(target="llvm")
            be.lower({"forward": g}, out)
            cache[case] = (g, be.load(out))
        return cache[case]

    return get


@pytest.mark.parametrize("T", LENGTHS, ids=lambda T: f"T{T}")
@pytest.mark.parametrize("case", [c for c in CASES if c != "mla_attention_decode"])
def test_kernel_matches_interpreter(built, case, T):
    g, runner = built(case)
    inputs = inputs_for(g, T, seed=T)
    want = k3c.ir.interpret(g, *inputs)
    got = runner.run("forward", *inputs)
    for (name, _), a, b in zip(g.outputs, got, want):
        assert_close(a, b, what=f"{case} T={T} output {name}")


@pytest.mark.parametrize("case", ["chunk_kda", "chunk_kda_c64"])
def test_chunk_kda_strong_decay(built, case):
    """Gates of -5 to -30 per token (exponents far below the floor within a chunk): finite and
    equal to the interpreter, through the pairwise and the pivot-factored scores."""
    g, runner = built(case)
    inputs = inputs_for(g, 130, seed=3)
    i = g.inputs.index("g")
    inputs[i] = -5.0 - 25.0 * torch.rand(inputs[i].shape, generator=torch.Generator().manual_seed(4))
    want = k3c.ir.interpret(g, *inputs)
    got = runner.run("forward", *inputs)
    for (name, _), a, b in zip(g.outputs, got, want):
        assert torch.isfinite(a).all(), f"{case} output {name} is not finite"
        assert_close(a, b, what=f"{case} strong decay output {name}")


def test_mla_decode_is_absorbed_by_the_pass_not_the_backend(built, tmp_path):
    """A single query step of mla_attention lowers as written (the cache up-projected); the
    absorbed form is fold-latent-moe's decision, and TVM runs what it makes in the latent space:
    on llvm the split-key latent kernel, which reads the growing cache in place (its new row the
    last: positions N - 1), equal to the interpreter."""
    g, runner = built("mla_attention_decode")
    assert "latent_split" not in TvmBackend().show({"forward": g})
    inputs = inputs_for(g, 1, seed=11)
    assert_close(runner.run("forward", *inputs)[0], k3c.ir.interpret(g, *inputs)[0], what="MLA decode step")
    absorbed = k3c.passes.run(g, ["fold-latent-moe"])
    assert absorbed.op_counts() == {"mla_attention_absorbed": 1}
    be = TvmBackend(target="llvm")
    assert "latent_split_blocked" in be.show({"forward": absorbed})
    be.lower({"forward": absorbed}, tmp_path)
    inputs = inputs_for(absorbed, 1, seed=12)
    assert_close(be.load(tmp_path).run("forward", *inputs)[0], k3c.ir.interpret(absorbed, *inputs)[0],
                 what="absorbed MLA decode step")


@pytest.mark.parametrize("rows, c", [(1, 16), (6, 16), (1, 32), (8, 32)], ids=lambda v: str(v))
@pytest.mark.parametrize("N", [32, 40, 7])
@pytest.mark.parametrize("M", [1, 5, 13])
def test_packed_linear_against_torch(M, N, rows, c):
    """The panel GEMM of `linear` by a weight: M not a multiple of the tile's rows, N not a
    multiple of the panel (padding columns are never written), the weight packed as the
    backend packs it, in AVX2's panels (c = 16) and AVX-512's (c = 32)."""
    import tvm

    from k3c.backends.tvm.target import make_target
    from k3c.kernels.common.tvm.gemm import packed_linear

    K = 20
    gen = torch.Generator().manual_seed(M * 100 + N)
    x, w = torch.randn(M, K, generator=gen), torch.randn(N, K, generator=gen)
    P = -(-N // c)
    wp = F.pad(w, (0, 0, 0, P * c - N)).reshape(P, c, K).permute(0, 2, 1).contiguous()
    lib = tvm.compile(packed_linear(K, N, rows, c), target=make_target("llvm"))
    y = tvm.runtime.tensor(torch.full((M, N), float("nan")).numpy())
    lib(tvm.runtime.tensor(x.numpy()), tvm.runtime.tensor(wp.numpy()), y)
    assert_close(torch.from_numpy(y.numpy()), x @ w.T, what=f"packed_linear M={M} N={N} rows={rows}")
