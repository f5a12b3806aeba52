"""TVM's latent attention over a fixed-capacity cache (mla_attention_absorbed_cached, the decode
form fold-latent-moe makes) against the interpreter: sequences of one batch at different
positions (the first row, a block's edge, the last rows of the capacity), one and several new
tokens, a capacity that is no multiple of the kernel's key block, and the rows past each
sequence's position holding NaN in the kernel's cache, which must never read them."""

from __future__ import annotations

import pytest
import torch

import k3c
from k3c.backends.tvm import TvmBackend
from k3c.numerics import assert_close

N, H, DN, DC, DR, DV = 150, 3, 20, 28, 12, 16

GRAPH = f"""graph cached {{
  dim B in [1, inf]
  dim T in [1, inf]
  input %q: f32[B, T, {H}, {DN + DR}]
  input %ckv: f32[B, {N}, {DC}]
  input %krope: f32[B, {N}, {DR}]
  input %pos: i64[B]
  weight %wuk: f32[{H}, {DN}, {DC}]
  weight %wuv: f32[{H}, {DV}, {DC}]
  %o: f32[B, T, {H}, {DV}] = mla_attention_absorbed_cached(%q, %ckv, %krope, %wuk, %wuv, %pos) {{scale=0.17}}
  output o = %o
}}
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    g = k3c.ir.parse(GRAPH)
    gen = torch.Generator().manual_seed(3)
    for name in g.weights:
        g.weights[name] = 0.3 * torch.randn(tuple(int(d) for d in g.types[name].shape), generator=gen)
    out = tmp_path_factory.mktemp("tvm-cached-mla")
    be = TvmBackend(target="llvm")
    be.lower({"forward": g}, out)
    return g, be.load(out), be.show({"forward": g})


@pytest.mark.parametrize("T, positions", [(1, [0, 31, 32, 149]), (3, [0, 64, 100, 147])],
                         ids=["decode", "three-tokens"])
def test_cached_latent_attention_matches_interpreter(built, T, positions):
    g, runner, shown = built
    assert "latent_split_blocked" in shown, "llvm lowers the cached attention with the blocked kernel"
    B = len(positions)
    gen = torch.Generator().manual_seed(T)
    q = torch.randn(B, T, H, DN + DR, generator=gen)
    ckv, krope = torch.randn(B, N, DC, generator=gen), torch.randn(B, N, DR, generator=gen)
    pos = torch.tensor(positions)
    seen = torch.arange(N)[None, :] <= pos[:, None] + T - 1  # [B, N]: the rows the last token sees
    clean = [x.masked_fill(~seen[:, :, None], 0.0) for x in (ckv, krope)]
    poisoned = [x.masked_fill(~seen[:, :, None], float("nan")) for x in (ckv, krope)]
    want = k3c.ir.interpret(g, q, *clean, pos)[0]
    got = runner.run("forward", q, *poisoned, pos)[0]
    assert torch.isfinite(got).all(), "a row past a sequence's position was read"
    assert_close(got, want, what=f"cached latent attention T={T} positions={positions}")
