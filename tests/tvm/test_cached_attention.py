"""TVM's attention over a fixed-capacity cache against the interpreter: the latent form
(mla_attention_absorbed_cached, the decode form fold-latent-moe makes), the expanded MLA form
(mla_attention_cached, an extend of several tokens) and plain causal_attention_cached with key
heads shared. Sequences of one batch at different positions (the first row, a block's edge,
the last rows of the capacity), one and several new tokens, a capacity that is no multiple of
the kernels' key block, and the rows past each sequence's position holding NaN in the
kernel's cache, which must never read them."""

from __future__ import annotations

import pytest
import torch

import k3c
from k3c.backends.tvm import TvmBackend
from k3c.numerics import assert_close

N, H, DN, DC, DR, DV = 150, 3, 20, 28, 12, 16
G, DK = 1, 24  # causal_attention_cached: key/value heads (serving H = 3 query heads), key width

HEAD = """graph cached {
  dim B in [1, inf]
  dim T in [1, inf]
"""


def absorbed(n: int) -> str:
    return HEAD + f"""  input %q: f32[B, T, {H}, {DN + DR}]
  input %ckv: f32[B, {n}, {DC}]
  input %krope: f32[B, {n}, {DR}]
  input %pos: i64[B]
  weight %wuk: f32[{H}, {DN}, {DC}]
  weight %wuv: f32[{H}, {DV}, {DC}]
  %o: f32[B, T, {H}, {DV}] = mla_attention_absorbed_cached(%q, %ckv, %krope, %wuk, %wuv, %pos) {{scale=0.17}}
  output o = %o
}}
"""


GRAPHS = {
    "absorbed": (absorbed(N), "latent_split_blocked"),
    "expanded": (HEAD + f"""  input %q: f32[B, T, {H}, {DN + DR}]
  input %ckv: f32[B, {N}, {DC}]
  input %krope: f32[B, {N}, {DR}]
  input %pos: i64[B]
  weight %wkvb: f32[{H * (DN + DV)}, {DC}]
  %o: f32[B, T, {H}, {DV}] = mla_attention_cached(%q, %ckv, %krope, %wkvb, %pos) {{v_head_dim={DV}, scale=0.17}}
  output o = %o
}}
""", "def causal_attention("),
    "causal": (HEAD + f"""  input %q: f32[B, T, {H}, {DK}]
  input %k: f32[B, {N}, {G}, {DK}]
  input %v: f32[B, {N}, {G}, {DV}]
  input %pos: i64[B]
  %o: f32[B, T, {H}, {DV}] = causal_attention_cached(%q, %k, %v, %pos) {{scale=0.2}}
  output o = %o
}}
""", "def causal_attention("),
}


def build(text: str, kernel: str, name: str, out):
    g = k3c.ir.parse(text)
    gen = torch.Generator().manual_seed(3)
    for w in g.weights:
        g.weights[w] = 0.3 * torch.randn(tuple(int(d) for d in g.types[w].shape), generator=gen)
    be = TvmBackend(target="llvm")
    be.lower({"forward": g}, out)
    shown = be.show({"forward": g})
    assert kernel in shown and "softmax" not in shown, f"{name}: lowered by its kernel, not decomposed"
    return g, be.load(out)


@pytest.fixture(scope="module", params=list(GRAPHS))
def built(request, tmp_path_factory):
    return build(*GRAPHS[request.param], request.param, tmp_path_factory.mktemp(f"tvm-cached-{request.param}"))


@pytest.mark.parametrize("T, positions", [(1, [0, 31, 32, 149]), (3, [0, 64, 100, 147]), (40, [0, 5, 110, 33])],
                         ids=["decode", "three-tokens", "a-piece"])
def test_cached_attention_matches_interpreter(built, T, positions):
    check(built, T, positions, N)


def test_latent_splits_of_more_blocks_than_splits(tmp_path):
    """A cache of more key blocks than the kernel has splits (1100 rows: 35 blocks of 32 over
    16 splits), so that a long sequence's splits take two or three blocks each and its last a
    partial block: positions at a block's edge (63, 64), mid-block and the last row."""
    n = 1100
    check(build(absorbed(n), "latent_split_blocked", "absorbed", tmp_path), 1, [63, 64, 700, n - 1], n)


def check(built, T, positions, N):
    g, runner = built
    B = len(positions)
    gen = torch.Generator().manual_seed(T)
    q, *cache = (torch.randn(B, *g.types[n].shape[1:], generator=gen) if i else
                 torch.randn(B, T, *g.types[n].shape[2:], generator=gen) for i, n in enumerate(g.inputs[:3]))
    pos = torch.tensor(positions)
    seen = torch.arange(N)[None, :] <= pos[:, None] + T - 1  # [B, N]: the rows the last token sees

    def keep(x, fill):
        return x.masked_fill(~seen.reshape(B, N, *[1] * (x.dim() - 2)), fill)

    want = k3c.ir.interpret(g, q, *[keep(x, 0.0) for x in cache], pos)[0]
    got = runner.run("forward", q, *[keep(x, float("nan")) for x in cache], pos)[0]
    assert torch.isfinite(got).all(), "a row past a sequence's position was read"
    assert_close(got, want, what=f"cached attention T={T} positions={positions}")


@pytest.mark.parametrize("op", list(GRAPHS))
def test_cached_attention_compiles_for_cuda(op, tmp_path):
    """The same lowerings generate CUDA (no GPU needed): the causal kernel's rows bound to blocks."""
    g = k3c.ir.parse(GRAPHS[op][0])
    for name in g.weights:
        g.weights[name] = torch.randn(tuple(int(d) for d in g.types[name].shape))
    out = TvmBackend(target="cuda").lower({"forward": g}, tmp_path)
    source = (out / "kernels.cu").read_text()
    assert "blockIdx.x" in source and ("latent_split" if op == "absorbed" else "causal_attention") in source
