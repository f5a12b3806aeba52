"""Unused cache capacity never matters: rows of a fixed-capacity cache past a sequence's last
written row (never written, or left by an earlier sequence of the slot) hold NaN and huge
values, and the cached attention ops give what they give over the used rows alone, on the
reference (the interpreter), both ONNX flavours, TVM's cache kernel and Triton (which runs the
op's decomposition). The expected values are a float64 softmax
over the visible rows only."""

from __future__ import annotations

import pytest
import torch
from onnx_cases import B_, P_, T_, f32, op_graph, run_ort

from k3c.ir import interpret
from k3c.numerics import assert_close

B, T, N, H, D, DV = 2, 3, 12, 2, 6, 5
POSITIONS = torch.tensor([2, 6])  # rows 0 .. positions + T - 1 are written


def case():
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(B, t, H, d, generator=gen) for t, d in ((T, D), (N, D), (N, DV)))
    used = torch.arange(N)[None, :] < POSITIONS[:, None] + T
    garbage = torch.tensor([float("nan"), 1e30, -float("inf"), float("inf")]).repeat(N)[:N]
    k_bad, v_bad = k.clone(), v.clone()
    k_bad[~used] = garbage[: int((~used).sum())].reshape(-1, 1, 1).expand(-1, H, D).clone()
    v_bad[~used] = float("nan")
    g = op_graph("causal_attention_cached", [("q", f32(B_, T_, H, D)), ("k", f32(B_, P_, H, D)),
                                             ("v", f32(B_, P_, H, DV)), ("positions", _i64(B_))],
                 {"scale": 0.4}, dims=("B", "T", "P"))
    return g, [q, k_bad, v_bad, POSITIONS], (q, k, v)


def _i64(*shape):
    from k3c.ir import TensorType

    return TensorType("i64", shape)


def expected(q, k, v):
    """float64 softmax attention of token t of sequence b over keys 0 .. positions[b] + t."""
    q, k, v = q.double(), k.double(), v.double()
    out = torch.empty(B, T, H, DV, dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            n = int(POSITIONS[b]) + t + 1
            s = torch.einsum("hd,nhd->hn", q[b, t], k[b, :n]) * 0.4
            out[b, t] = torch.einsum("hn,nhv->hv", s.softmax(-1), v[b, :n])
    return out


@pytest.mark.parametrize("where", ["reference", "portable", "ort", "tvm", "triton"])
def test_unused_capacity_is_never_read(where, tmp_path):
    g, inputs, clean = case()
    if where == "reference":
        got = interpret(g, *inputs)[0]
    elif where in ("tvm", "triton"):
        from k3c.backends.triton.backend import TritonBackend
        from k3c.backends.tvm import TvmBackend

        be = TvmBackend(target="llvm") if where == "tvm" else TritonBackend()
        be.lower({"forward": g}, tmp_path)
        got = be.load(tmp_path).run("forward", *inputs)[0]
    else:  # as k3c.compile hands it over: legalize runs the op's decomposition where ONNX has no lowering
        from k3c import passes

        got = run_ort(passes.run(g, ['decompose{ops=["causal_attention_cached"]}']), inputs, where)[0]
    assert torch.isfinite(got).all(), f"{where}: unused capacity reached the output"
    assert_close(got.double(), expected(*clean), dtype=torch.float32, what=f"{where} cached attention")


@pytest.mark.parametrize("where", ["reference", "portable", "ort"])
def test_an_extend_over_a_large_cache_attends_in_key_blocks(where, monkeypatch):
    """Over a static capacity larger than the decomposition's key block, several new tokens
    attend block by block with a running softmax (ir/ops/cache.py `_blocked_attend`): here
    blocks of 5 rows over 12 (the last one ragged), garbage past the written rows as above."""
    from k3c import passes
    from k3c.ir.ops import cache

    monkeypatch.setattr(cache, "KEY_BLOCK", 5)
    _, inputs, clean = case()
    g = op_graph("causal_attention_cached", [("q", f32(B_, T_, H, D)), ("k", f32(B_, N, H, D)),
                                             ("v", f32(B_, N, H, DV)), ("positions", _i64(B_))],
                 {"scale": 0.4}, dims=("B", "T"))
    g = passes.run(g, ['decompose{ops=["causal_attention_cached"]}'])
    assert sum(n.op == "reduce_max" for n in g.nodes) == 3, "three key blocks: 5 + 5 + 2 rows"
    got = interpret(g, *inputs)[0] if where == "reference" else run_ort(g, inputs, where)[0]
    assert torch.isfinite(got).all(), f"{where}: unused capacity reached the output"
    assert_close(got.double(), expected(*clean), dtype=torch.float32, what=f"{where} blocked cached attention")
