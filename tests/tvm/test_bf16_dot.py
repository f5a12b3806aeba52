"""The BF16 dot-product GEMM (kernels/common/tvm/gemm_bf16.py) against a naive torch GEMM of the
compute="bf16" policy: x and W rounded to BF16 by torch, multiplied and summed in float64.

On a host with AVX-512 BF16 the kernel runs on `vdpbf16ps`; on one without (this project's CI
machines: AVX2), the same packing and loops run with the dot written as two float32 FMAs
(`dot="emulated"`), and a build for `-mcpu=sapphirerapids` is checked to hold the instruction.
Awkward shapes: K odd (a half pair of zeros), N not a multiple of the 32-column panel, M = 1, 7
and 64 (tiles of 8 rows with a clamped tail)."""

from __future__ import annotations

import pytest
import torch
import tvm

from k3c.backends.tvm.target import host_features, make_target
from k3c.kernels.common.tvm.gemm_bf16 import PANEL, dot_linear, pack_panels, pack_rows
from k3c.numerics import assert_close

NATIVE = "avx512bf16" in host_features()
SHAPES = pytest.mark.parametrize("M, N, K", [(1, 7, 37), (7, 45, 21), (64, 33, 3), (7, 64, 130)], ids=str)


def _tvm(t: torch.Tensor):
    out = tvm.runtime.empty(tuple(t.shape), str(t.dtype).removeprefix("torch."), tvm.cpu())
    torch.from_dlpack(out).copy_(t)
    return out


def _run(x: torch.Tensor, w: torch.Tensor, dot: str) -> torch.Tensor:
    (M, K), (N, _) = x.shape, w.shape
    tgt = make_target("llvm")
    xp, wp = _tvm(torch.zeros(M, (K + 1) // 2, dtype=torch.uint32)), _tvm(
        torch.zeros(-(-N // PANEL), (K + 1) // 2, PANEL, dtype=torch.uint32))
    tvm.compile(pack_rows(K, str(x.dtype).removeprefix("torch.")), target=tgt)(_tvm(x), xp)
    tvm.compile(pack_panels(N, K), target=tgt)(_tvm(w), wp)
    y = _tvm(torch.full((M, N), float("nan")))
    tvm.compile(dot_linear(K, N, dot=dot), target=tgt)(xp, wp, y)
    return torch.from_dlpack(y).clone()


def _reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x.to(torch.bfloat16).double() @ w.to(torch.bfloat16).double().T).float()


def _inputs(M: int, N: int, K: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(M * 1000 + N * 10 + K)
    return torch.randn(M, K, generator=g), torch.randn(N, K, generator=g).to(torch.bfloat16)


@SHAPES
def test_emulated_dot_layout_against_torch(M, N, K):
    """fp32 activations are rounded to BF16 by the packing (to nearest even), as torch rounds."""
    x, w = _inputs(M, N, K)
    assert_close(_run(x, w, "emulated"), _reference(x, w), what=f"bf16 dot (emulated) M={M} N={N} K={K}")


@pytest.mark.skipif(not NATIVE, reason="the host has no avx512_bf16: vdpbf16ps cannot run here")
@SHAPES
def test_native_dot_against_torch(M, N, K):
    x, w = _inputs(M, N, K)
    assert_close(_run(x, w, "native"), _reference(x, w), what=f"bf16 dot (vdpbf16ps) M={M} N={N} K={K}")


def test_packing_is_exact_bits():
    """Each BF16 weight lands in its pair and column: the low half the even k, zeros past K
    and N; activations round to nearest even (ties too) and a NaN stays a NaN."""
    N, K = 3, 5
    w = (torch.arange(N * K, dtype=torch.float32).reshape(N, K) - 7).to(torch.bfloat16)
    wp = _tvm(torch.full((1, 3, PANEL), 7, dtype=torch.uint32))
    tvm.compile(pack_panels(N, K), target=make_target("llvm"))(_tvm(w), wp)
    got = torch.from_dlpack(wp).to(torch.int64)
    bits = w.view(torch.int16).to(torch.int64) & 0xFFFF
    for n in range(N):
        for q in range(3):
            hi = bits[n, 2 * q + 1].item() if 2 * q + 1 < K else 0
            assert got[0, q, n].item() == bits[n, 2 * q].item() | hi << 16, (n, q)
    assert (got[0, :, N:] == 0).all()
    x = torch.tensor([[1 + 2**-8, 1 + 3 * 2**-8, float("nan"), -2.5]], dtype=torch.float32)  # two ties, NaN
    xp = _tvm(torch.zeros(1, 2, dtype=torch.uint32))
    tvm.compile(pack_rows(4), target=make_target("llvm"))(_tvm(x), xp)
    halves = torch.from_dlpack(xp).to(torch.int64)
    pairs = torch.stack([halves & 0xFFFF, halves >> 16], -1).reshape(1, 4).to(torch.int16)
    got_x = pairs.view(torch.bfloat16).float()
    want = x.to(torch.bfloat16).float()
    assert torch.equal(got_x[:, [0, 1, 3]], want[:, [0, 1, 3]]) and got_x[0, 2].isnan(), (got_x, want)


def test_sapphirerapids_build_holds_vdpbf16ps():
    lib = tvm.compile(dot_linear(130, 45), target=make_target("llvm -mcpu=sapphirerapids"))
    asm = lib.mod.inspect_source("asm")
    assert asm.count("vdpbf16ps") >= 16, "8 rows x 2 vectors of a tile: one vdpbf16ps each per k pair"


GRAPH = """graph g {{
  dim M in [1, inf]
  input %x: f32[M, 37]
  weight %w: bf16[45, 37]
  %xb: bf16[M, 37] = cast(%x) {{dtype="bf16"}}
  %xr: f32[M, 37] = cast(%xb) {{dtype="f32"}}
  %wf: f32[45, 37] = cast(%w) {{dtype="f32"}}
  %y: f32[M, 45] = linear(%{x}, %wf)
  output y = %y
}}
"""


def _graphs(x: str = "xr") -> dict:
    """A linear of compute="bf16" (the activation rounded to BF16: %xr) or of compute="f32" (%x)."""
    from k3c.ir import parse

    g = parse(GRAPH.format(x=x))
    g.weights["w"] = torch.randn(45, 37, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    return {"forward": g}


def test_a_bf16_compute_gemm_takes_the_dot_only_for_a_cpu_with_avx512_bf16():
    """Decided from the target when the module is lowered: a sapphirerapids build packs the
    weight once at load (transform_params) and calls the dot kernel; this host's build (AVX2)
    and a float32 activation on any CPU keep the float32 panel kernel."""
    from k3c.backends.tvm import TvmBackend

    there = TvmBackend(target="llvm -mcpu=sapphirerapids").show(_graphs())
    params = there[there.index("def transform_params"):]
    assert "cls.dot_linear_bf16" in there and "cls.pack_panels_bf16" in params, there
    assert "cls.dot_linear_bf16" not in TvmBackend(target="llvm -mcpu=sapphirerapids").show(_graphs("x"))
    here = TvmBackend().show(_graphs())
    assert ("cls.dot_linear_bf16" in here) == NATIVE and ("cls.packed_linear" in here) != NATIVE


@pytest.mark.parametrize("M", [1, 7, 64])
def test_the_host_build_of_a_bf16_compute_linear_matches_torch(tmp_path, M):
    """Whichever kernel this host's features chose, the product of the BF16 operands."""
    from k3c.backends.tvm import TvmBackend

    graphs = _graphs()
    be = TvmBackend()
    out = be.lower(graphs, tmp_path)
    x = torch.randn(M, 37, generator=torch.Generator().manual_seed(M))
    (y,) = be.load(out).run("forward", x)
    assert_close(y, _reference(x, graphs["forward"].weights["w"]), what=f"host build M={M}")


def test_a_compiled_bf16_model_rounds_each_gemm_operand(tmp_path):
    """Two linears of a BF16 module through k3c.compile(..., compute="bf16") on this host: the
    eager policy (models.precision.bf16_policy) at float32's row, and off from float32 compute
    by more than that row. (TVM's TIR dropped the cast to bf16 and back when Relax fused the
    two casts: the operands went unrounded until the cast rounded on the bits.)"""
    import k3c
    from k3c.models.precision import bf16_policy, fp32_copy
    from k3c.numerics import TOLERANCES, compare

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 96, bias=False), torch.nn.SiLU(),
                            torch.nn.Linear(96, 37, bias=False)).to(torch.bfloat16)
    x = torch.randn(2, 9, 64).to(torch.bfloat16)
    got = k3c.compile(m, "tvm", (x,), out_dir=tmp_path, compute="bf16", dynamic=False)(x.float())
    with torch.no_grad():
        want, fp32 = bf16_policy(m)(x.float()), fp32_copy(m)(x.float())
    assert compare(got, want, tolerance=TOLERANCES[torch.float32]).ok, compare(got, want)
    assert not compare(got, fp32, tolerance=TOLERANCES[torch.float32]).ok


def test_a_sapphirerapids_build_of_a_bf16_compute_linear_holds_vdpbf16ps(tmp_path):
    """The whole build (Relax's passes after scheduling too), not only the scheduled module:
    the library's code holds the BF16 dot; this host would refuse to load it."""
    from k3c.backends.tvm import TvmBackend
    from k3c.backends.tvm.build import build
    from k3c.errors import ArtifactError

    ex, _ = build(_graphs(), "llvm", mcpu="sapphirerapids")
    mods, asm = [ex.mod], ""
    while mods:
        m = mods.pop()
        mods.extend(m.imports)
        if m.kind == "llvm":
            asm += m.inspect_source("asm")
    assert asm.count("vdpbf16ps") >= 16, "8 rows x 2 vectors of a tile"
    out = TvmBackend(target="llvm -mcpu=sapphirerapids").lower(_graphs(), tmp_path)
    if not NATIVE:
        with pytest.raises(ArtifactError, match="avx512bf16"):
            TvmBackend().load(out).run("forward", torch.zeros(2, 37))


def test_a_decode_step_shares_the_prefills_packed_bf16_weights():
    """Under compute="bf16" the decode step takes the dot kernel too: the packing of a weight is
    lifted to load time only when every entry packs it alike, and a decode step on the float32
    panels packed the weight again on every call."""
    from k3c.backends.tvm import TvmBackend

    graphs = {"prefill": _graphs()["forward"], "decode": _graphs()["forward"].copy()}
    graphs["decode"].meta["entry"] = "decode"
    shown = TvmBackend(target="llvm -mcpu=sapphirerapids").show(graphs)
    decode = shown[shown.index("def decode"):]
    decode = decode[:decode.index("\n    @R.function") if "\n    @R.function" in decode else len(decode)]
    assert "cls.dot_linear_bf16" in decode, decode
    assert "pack_panels" not in decode and "transpose" not in decode, f"a weight packed per call:\n{decode}"
    assert "cls.pack_panels_bf16" in shown[shown.index("def transform_params"):]
