"""TVM at the numerical edges: the chunk kernels after strong decays against the float64
recurrence (tests/edge_decays.py), and NaN propagation through the vector exp that the SiTU,
gated-MLP and MoE kernels share (its clamp once turned a NaN into a number)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from edge_decays import EDGES, check_edge, edge_case
from test_kernels import graph_of

import k3c
from k3c.backends.tvm import TvmBackend
from k3c.numerics import assert_close

H, K, V, SCALE = 3, 24, 20, 0.3  # test_kernels' cases, so that their builds are reused (one key)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache = {}

    def get(case: str, g: k3c.ir.Graph):
        if case not in cache:
            out = tmp_path_factory.mktemp(f"edge-{case}")
            be = TvmBackend(target="llvm")
            be.lower({"forward": g}, out)
            cache[case] = be.load(out)
        return cache[case]

    return get


@pytest.mark.parametrize("case", ["chunk_kda", "chunk_kda_c64", "chunk_gated_delta_rule"])
@pytest.mark.parametrize("edge", EDGES)
def test_chunk_kernels_exact_at_the_edges(built, case, edge):
    """C = 16 (pairwise scores), C = 64 (pivot-factored scores), and one gate per head."""
    g = graph_of(case)
    x = edge_case(edge, "head" if "gated" in case else "channel", H=H, K=K, V=V)
    feeds = {"q": x.q, "k": x.k, "v": x.v, "g": x.g, "beta": x.beta, "s": x.state}
    o, S = built(case, g).run("forward", *[feeds[n] for n in g.inputs])[:2]
    check_edge(o, S, x, f"tvm {case} {edge}", scale=SCALE)


def test_vector_exp_keeps_nan():
    from tvm import compile as tvm_compile
    from tvm import runtime
    from tvm.ir import IRModule
    from tvm.script import tirx as T

    from k3c.kernels.common.tvm import exp_vec, sigmoid_vec, tanh_vec

    @T.prim_func(s_tir=True)
    def f(a: T.Buffer((8,), "float32"), b: T.Buffer((24,), "float32")):
        for i in T.vectorized(8):
            with T.sblock("b"):
                vi = T.axis.remap("S", [i])
                b[vi] = exp_vec(a[vi])
                b[vi + 8] = sigmoid_vec(a[vi])
                b[vi + 16] = tanh_vec(a[vi])

    x = np.array([np.nan, 0.0, -1.0, 2.0, -20.0, 20.0, 0.1, np.nan], dtype=np.float32)
    out = runtime.tensor(np.zeros(24, np.float32))
    tvm_compile(IRModule({"main": f}), target="llvm")["main"](runtime.tensor(x), out)
    got = torch.from_numpy(out.numpy()).view(3, 8)
    t = torch.from_numpy(x)
    want = torch.stack([t.exp(), torch.sigmoid(t), torch.tanh(t)])
    assert torch.equal(got.isnan(), want.isnan())
    for i, what in enumerate(("exp", "sigmoid", "tanh")):
        assert_close(got[i, 1:7], want[i, 1:7], what=what)


@pytest.mark.parametrize("case", ["gated_mlp", "moe"])
def test_nan_weight_propagates(built, case):
    """One NaN weight: the outputs NaN wherever the interpreter (the eager kernels) has NaN."""
    g = graph_of(case)
    name = next(n for n in g.weights if n in ("wgu", "w13"))
    g.weights[name].view(-1)[3] = float("nan")
    h = torch.randn(2, 5, 24, generator=torch.Generator().manual_seed(1))
    want = k3c.ir.interpret(g, h)
    got = built(f"{case}-nan", g).run("forward", h)
    for (out, _), a, b in zip(g.outputs, got, want):
        assert b.isnan().any(), f"{case} {out}: the reference has no NaN to propagate"
        n_got, n_want = int(a.isnan().sum()), int(b.isnan().sum())
        assert torch.equal(a.isnan(), b.isnan()), f"{case} {out}: {n_got} NaN, want {n_want}"
