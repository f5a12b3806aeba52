"""The Triton serving kernels under the interpreter against their definitions
(kernels/cache/naive.py, the ops' references) at the fp32 row: the in-place row write and
attention over a fixed-capacity cache split over the keys (2 and 3 splits, merged; 1: no
merge), with ragged positions, a sequence at position 0, a full cache, grouped and shared
key/value heads and widths that are not powers of two. Rows past a sequence's written ones
hold NaN and inf in one run and zeros in another: the outputs are bit-for-bit the same.
"""

from __future__ import annotations

import pytest
import torch
from triton_inputs import randn

import k3c
from k3c.errors import InputError
from k3c.kernels.attention.triton import cached_attention, causal_attention_cached
from k3c.kernels.cache import naive
from k3c.kernels.cache.triton import cache_write
from k3c.kernels.common.triton import DEVICE
from k3c.kernels.mla.triton import mla_attention_absorbed_cached
from k3c.numerics import assert_close

N = 16  # capacity
# (positions before the call, T new tokens): ragged, one at 0, one filling the cache
CASES = {"decode": ([0, 9], 1), "extend": ([4, 13], 3), "full": ([15, 7], 1)}


def _positions(case: str) -> tuple[torch.Tensor, int]:
    pos, T = CASES[case]
    return torch.tensor(pos, dtype=torch.int64, device=DEVICE), T


def _spoil(x: torch.Tensor, positions: torch.Tensor, T: int, value: float) -> torch.Tensor:
    """x [B, N, ...] with rows past positions[b] + T (never written) set to `value`."""
    x = x.clone()
    for b, p in enumerate(positions.tolist()):
        x[b, p + T:] = value
    return x


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("splits", [1, 2, 3])
@pytest.mark.parametrize("heads", [(4, 2), (3, 3)], ids=["gqa", "mha"])
def test_causal_attention_cached(case, splits, heads):
    H, G = heads
    pos, T = _positions(case)
    q, k, v = randn(2, T, H, 24, seed=1), randn(2, N, G, 24, seed=2), randn(2, N, G, 20, seed=3)
    k, v = _spoil(k, pos, T, 0.0), _spoil(v, pos, T, 0.0)
    got = cached_attention(q, k, v, pos, 0.3, splits=splits)
    assert_close(got, naive.cached_attention(q, k, v, pos, 0.3), what=f"{case} splits={splits}")
    garbage = cached_attention(q, _spoil(k, pos, T, float("nan")), _spoil(v, pos, T, float("inf")), pos, 0.3,
                               splits=splits)
    assert torch.equal(garbage, got), "NaN / inf in the unused capacity changed an output"


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("splits", [1, 3, None])
def test_mla_absorbed_cached(case, splits):
    """q [B, T, 4, 24 + 16], latent 32 (Dc), values 20 wide; splits None: chosen from the shapes."""
    H, Dn, Dr, Dc, Dv = 4, 24, 16, 32, 20
    pos, T = _positions(case)
    q, w_uk, w_uv = randn(2, T, H, Dn + Dr, seed=4), randn(H, Dn, Dc, seed=5, scale=0.2), randn(H, Dv, Dc, seed=6)
    ckv, krope = _spoil(randn(2, N, Dc, seed=7), pos, T, 0.0), _spoil(randn(2, N, Dr, seed=8), pos, T, 0.0)
    got = mla_attention_absorbed_cached(q, ckv, krope, w_uk, w_uv, pos, 0.2, splits=splits)
    want = naive.mla_cached_attention_absorbed(q, ckv, krope, w_uk, w_uv, pos, 0.2)
    assert_close(got, want, what=f"{case} splits={splits}")
    garbage = mla_attention_absorbed_cached(q, _spoil(ckv, pos, T, float("nan")), _spoil(krope, pos, T, float("inf")),
                                            w_uk, w_uv, pos, 0.2, splits=splits)
    assert torch.equal(garbage, got), "NaN / inf in the unused capacity changed an output"


def test_causal_attention_cached_entry_takes_views():
    """The op's entry: a non-contiguous q (a slice of a wider projection) and the cache as written."""
    pos, T = _positions("extend")
    qkv = randn(2, T, 3, 2 * 24, seed=9)
    k, v = randn(2, N, 3, 24, seed=10), randn(2, N, 3, 24, seed=11)
    got = causal_attention_cached(qkv[..., :24], k, v, pos, 0.25)
    assert_close(got, naive.cached_attention(qkv[..., :24], k, v, pos, 0.25))


@pytest.mark.parametrize("case", list(CASES))
def test_cache_write_in_place(case):
    pos, T = _positions(case)
    cache, new = randn(2, N, 3, 5, seed=12), randn(2, T, 3, 5, seed=13)
    want = naive.cache_write(cache, new, pos)
    copy = cache_write(cache, new, pos, inplace=False)
    assert torch.equal(copy, want) and copy.data_ptr() != cache.data_ptr()
    assert not torch.equal(cache, want)  # the copy left the cache as it was
    out = cache_write(cache, new, pos)
    assert out.data_ptr() == cache.data_ptr() and torch.equal(cache, want)


def test_cache_write_bounds():
    """Positions that do not leave room for the new rows are one InputError before any launch;
    unchecked, the kernel still writes no row outside the cache (the memory after it is intact)."""
    cache, new = randn(2, N, 4, seed=14), randn(2, 3, 4, seed=15)
    for pos, says in (([0, N - 2], "do not fit the cache's 16 rows"), ([-1, 0], "position -1 is negative")):
        before = cache.clone()
        with pytest.raises(InputError, match=says):
            cache_write(cache, new, torch.tensor(pos, device=DEVICE))
        assert torch.equal(cache, before)
    big = randn(3, N, 4, seed=16)
    after = big[2].clone()
    out = cache_write(big[:2], new, torch.tensor([N - 1, N - 2], device=DEVICE), check=False)
    assert torch.equal(big[2], after), "a row past the cache was written"
    assert torch.equal(out[0, N - 1], new[0, 0]) and torch.equal(out[1, N - 2:], new[1, :2])


def test_k3c_ops_lists_them_as_kernels():
    table = k3c.backends.tables.load("triton")
    for op in ("cache_write", "causal_attention_cached", "mla_attention_absorbed_cached"):
        assert table.get(op).kind == "kernel", op


# A served step as the module runs it: both caches written in place, then attention over them.
STEP = """graph serve.extend {
  dim B in [1, inf]
  dim T in [1, 16]
  meta {"entry": "extend", "max_context": 16}
  input %q: f32[B, T, 4, 8]
  input %k: f32[B, 16, 2, 8]
  input %v: f32[B, 16, 2, 6]
  input %k_new: f32[B, T, 2, 8]
  input %v_new: f32[B, T, 2, 6]
  input %positions: i64[B]
  %k1: f32[B, 16, 2, 8] = cache_write(%k, %k_new, %positions)
  %v1: f32[B, 16, 2, 6] = cache_write(%v, %v_new, %positions)
  %o: f32[B, T, 4, 6] = causal_attention_cached(%q, %k1, %v1, %positions) {scale=0.35}
  output o = %o
  output k = %k1
  output v = %v1
}
"""


def test_module_writes_in_place_and_the_runner_checks_positions(tmp_path):
    """The generated module against the interpreter (the ops' definitions): equal outputs, the
    caches passed in are the caches returned (written in place), and a position that leaves
    no room is one InputError from the runner before any kernel runs."""
    from k3c.backends.triton import TritonBackend

    graph = k3c.ir.parse(STEP)
    backend = TritonBackend()
    run = backend.load(backend.lower({"extend": graph}, tmp_path))
    assert "inplace=True" in (tmp_path / "model_triton.py").read_text()
    pos, T = _positions("extend")
    inputs = [randn(2, T, 4, 8, seed=20), randn(2, N, 2, 8, seed=21), randn(2, N, 2, 6, seed=22),
              randn(2, T, 2, 8, seed=23), randn(2, T, 2, 6, seed=24), pos]
    want = k3c.ir.interpret(graph, *[x.clone() for x in inputs])
    got = run.run("extend", *inputs)
    for name, g, w in zip(("o", "k", "v"), got, want):
        assert_close(g, w, what=name)
    assert got[1] is inputs[1] and got[2] is inputs[2]
    k = inputs[1].clone()
    with pytest.raises(InputError, match="do not fit the caches' 16 rows"):
        run.run("extend", *inputs[:5], torch.tensor([N - 2, 0], device=DEVICE))
    assert torch.equal(inputs[1], k)
