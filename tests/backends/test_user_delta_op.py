"""A delta-family op declared outside k3c (one `defop` with an existing gate kind and a naive
reference written here) is captured from a module that calls it, compiled on every backend
through the family's own kernels (the support matrix says so: a lowering, not a
decomposition), and matches the naive reference at the fp32 row of k3c/numerics.py, both as
a prefill (the chunked form) and as a single step (the recurrent form)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import k3c
from k3c.backends import coverage
from k3c.backends import tables as L
from k3c.errors import UsageError
from k3c.ir.ops import OPS, defop
from k3c.ir.ops.delta_family import DeltaForm
from k3c.numerics import assert_close
from k3c.registry import scope

OP = "user_head_decay_rule"
FORM = DeltaForm("head")
B, H, K, V, SCALE = 2, 2, 16, 8, 0.3


def naive_head_decay_rule(q, k, v, g, beta, state, scale):
    """Written from the recurrence, per token t and head h (state S [K, V], fp32):
        S = exp(g_t) S;  S = S + beta_t k_t (v_t - S^T k_t)^T;  o_t = scale S^T q_t"""
    Bn, T, Hn, _ = q.shape
    S = state.clone().double()
    o = torch.zeros(Bn, T, Hn, v.shape[-1], dtype=torch.float64)
    for t in range(T):
        for b in range(Bn):
            for h in range(Hn):
                St = S[b, h] * torch.exp(g[b, t, h].double())
                kt, vt = k[b, t, h].double(), v[b, t, h].double()
                St = St + beta[b, t, h].double() * torch.outer(kt, vt - St.T @ kt)
                o[b, t, h] = scale * St.T @ q[b, t, h].double()
                S[b, h] = St
    return o.to(v.dtype), S.float()


class Mixer(torch.nn.Module):
    def forward(self, q, k, v, g, beta, state):
        return getattr(torch.ops.k3c, OP)(q, k, v, g, beta, state, SCALE)


def inputs(T: int, seed: int = 0) -> tuple:
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    q, k = F.normalize(r(B, T, H, K), dim=-1), F.normalize(r(B, T, H, K), dim=-1)
    g = F.logsigmoid(2.0 + r(B, T, H))  # one log-decay <= 0 per head
    return q, k, r(B, T, H, V), g, torch.sigmoid(r(B, T, H)), r(B, H, K, V) * 0.5


BACKENDS = ["reference", "onnx", "onnx:ort", "tvm", "triton"]
# prefill: T dynamic, so chunk-delta-rule rewrites the op into the chunk pieces (gate "head")
# where the backend asks for them; step: T the constant 1, the op stays whole and runs the
# family's recurrent kernel
DIMS = {"prefill": dict.fromkeys("q k v".split(), "B T _ _") | {"g": "B T _", "beta": "B T _", "state": "B _ _ _"},
        "step": dict.fromkeys("q k v".split(), "B _ _ _") | {"g": "B _ _", "beta": "B _ _", "state": "B _ _ _"}}


@pytest.fixture(scope="module")
def declared():
    """The op, declared inside a registry scope so that it leaves no trace for other tests."""
    with scope():
        defop(OP, FORM.inputs, FORM.outputs, delta=FORM, ref=naive_head_decay_rule, eager=True,
              doc="a per-head decay rule declared by a user")
        yield


@pytest.fixture(scope="module")
def compiled(declared, tmp_path_factory):
    cache = {}

    def get(backend: str, form: str):
        if (backend, form) not in cache:
            name, _, flavour = backend.partition(":")
            out = tmp_path_factory.mktemp(f"{name}-{flavour or 'default'}-{form}")
            options = {"flavour": flavour} if flavour else {}
            T = 12 if form == "prefill" else 1
            cache[backend, form] = k3c.compile(Mixer(), name, inputs(T), out_dir=out, dims=DIMS[form],
                                               **options)
        return cache[backend, form]
    return get


def test_the_support_matrix_says_lowered_by_the_family_kernels(declared):
    row = {op: cells for _, op, cells in coverage.matrix()}[OP]
    assert row == {op: cells for _, op, cells in coverage.matrix()}["gated_delta_rule"], row
    for table in L.TABLES:
        low = L.load(table)[OP]
        assert low.fn is L.load(table)["kda"].fn, f"{table}: not the family's lowering"
        assert low.kind not in ("decomposed", "user"), (table, low.kind)
    assert OPS[OP].decompose is None and OPS[OP].families >= {"recurrent", "delta_family"}
    assert f"  {OP}: gate {FORM.gate}" in coverage.text().splitlines()  # what `k3c ops` prints


def _case(backend: str, form: str):
    marks = [pytest.mark.slow] if (backend, form) in SLOW else []
    return pytest.param(backend, form, id=f"{backend}-{form}", marks=marks)


# a TVM prefill build and its run take about 20 s here (2 shared cores): the slow tier;
# its single step, and every other backend, run in the default tier
SLOW = {("tvm", "prefill")}


@pytest.mark.parametrize("backend, form", [_case(b, f) for b in BACKENDS for f in ("prefill", "step")])
def test_compiled_op_matches_its_naive_reference(compiled, backend, form):
    run = compiled(backend, form)
    graph = run.graphs["forward"]
    ops = {n.op for n in graph.nodes}
    # onnxruntime's LinearAttention takes the op whole; TVM on llvm chunks only where the
    # chunked form has fewer FLOPs (chunk-delta-rule by="flops"), which it does not here
    whole = form == "step" or backend in ("onnx:ort", "tvm")
    assert (OP in ops) == whole, sorted(ops)
    if not whole:
        gates = {n.attrs["gate"] for n in graph.nodes if n.op == "chunk_prepare"}
        assert gates == {FORM.gate}, gates
    for T, seed in ((12, 1), (37, 2)) if form == "prefill" else ((1, 3),):
        x = inputs(T, seed)
        o, S = run(*x)
        want_o, want_S = naive_head_decay_rule(*x, SCALE)
        assert_close(o, want_o, torch.float32, what=f"{backend} {form} o (T={T})")
        assert_close(S, want_S, torch.float32, what=f"{backend} {form} state (T={T})")


def test_a_form_that_does_not_fit_the_gate_kind_is_one_line():
    with pytest.raises(UsageError, match="takes inputs 'q k v g beta state'"):
        with scope():
            defop("user_bad_rule", "q k v beta state", "o state_out", delta=FORM, ref=naive_head_decay_rule)
    with pytest.raises(UsageError, match="gate kind must be one of"):
        DeltaForm("diagonal")
