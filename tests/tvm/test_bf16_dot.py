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
