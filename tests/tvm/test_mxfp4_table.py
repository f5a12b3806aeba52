"""The MXFP4 expert kernels' decode by table (kernels/moe/tvm/mxfp4.py `lut_row`: `vpermps` of 8
magnitudes on an AVX2 target, of 16 signed values on an AVX-512 one) against the naive decode
and GEMMs, and bit for bit against the arithmetic decode, at awkward shapes (panels of 8 and
16 features, N = 1, 7, 64, tiles of 1 and 6 rows) with every code and the edge scale bytes
(0: 2^-127, 254, 255: NaN); then the backend's choice of it from the target's features."""

from __future__ import annotations

import re

import pytest
import torch
import tvm
from test_stored_weights import _experts, _mxfp4_panels, _tvm
from tvm import s_tir

from k3c.backends.tvm.target import host_features, make_target
from k3c.kernels.moe.naive import moe_down, moe_gate_up
from k3c.kernels.moe.tvm import SCHEDULES
from k3c.kernels.moe.tvm import moe_down as tvm_moe_down
from k3c.kernels.moe.tvm import moe_gate_up as tvm_moe_gate_up
from k3c.kernels.mxfp4.naive import decode
from k3c.numerics import assert_close

pytestmark = pytest.mark.skipif("avx2" not in host_features(), reason="the table decode needs AVX2 (vpermps)")


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


def _build(func):
    sch = s_tir.Schedule(func)
    SCHEDULES["llvm"](sch)
    lib = tvm.compile(tvm.IRModule({"main": sch.mod["main"]}), target=make_target("llvm"))

    def run(args, out_shape):
        out = _tvm(torch.full(out_shape, float("nan")))
        lib(*[_tvm(x) for x in args], out)
        return torch.from_dlpack(out).clone()

    return run


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@pytest.mark.parametrize("rows", [1, 6])
@pytest.mark.parametrize("F", [8, 16], ids=lambda f: f"panel{f}")
def test_table_decode_against_the_naive_decode_and_the_arithmetic_one(F, rows, isa):
    if isa == "avx512" and "avx512f" not in host_features():
        pytest.skip("the 16-entry table needs AVX-512 (vpermps on zmm)")
    E, D, k = 3, 64, 2
    I2, Dout, I = 2 * F, F, 32  # panel(I2) = panel(Dout) = F
    gen = torch.Generator().manual_seed(F * 10 + rows)
    p13, s13 = _experts(gen, E, I2, D)
    p2, s2 = _experts(gen, E, Dout, I)
    p13[0, 0, :8] = torch.arange(0, 256, 34, dtype=torch.uint8)[:8]  # codes 0..15 in both nibbles
    s13[0, 0, 0], s13[1, 1, 1], s2[0, 0, 0], s2[2, 1, 0] = 0, 254, 255, 1
    w13, w2 = _mxfp4_panels(p13, s13), _mxfp4_panels(p2, s2)
    forms = (False, isa)  # lut: arithmetic, by table
    gate_up = {lut: _build(tvm_moe_gate_up(E, D, I2, k, "llvm", rows, weights="mxfp4", lut=lut)) for lut in forms}
    down = {lut: _build(tvm_moe_down(E, I, Dout, k, "llvm", rows, weights="mxfp4", lut=lut)) for lut in forms}
    for N in (1, 7, 64):
        h, a = torch.randn(N, D, generator=gen), torch.randn(N, k, I, generator=gen)
        idx = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(N)])
        cw = torch.rand(N, k, generator=gen)
        gu = {lut: run([h, w13, idx], (N, k, I2)) for lut, run in gate_up.items()}
        y = {lut: run([a, w2, idx, cw], (N, Dout)) for lut, run in down.items()}
        assert _same_bits(gu[isa], gu[False]) and _same_bits(y[isa], y[False]), N
        want_gu, want_y = moe_gate_up(h, decode(p13, s13), idx), moe_down(a, decode(p2, s2), idx, cw)
        assert torch.equal(gu[isa].isnan(), want_gu.isnan()) and torch.equal(y[isa].isnan(), want_y.isnan()), N
        assert_close(gu[isa].nan_to_num(), want_gu.nan_to_num(), what=f"{isa} table gate_up F={F} N={N}")
        assert_close(y[isa].nan_to_num(), want_y.nan_to_num(), what=f"{isa} table down F={F} N={N}")


GRAPH = """graph g {
  dim N in [1, inf]
  input %h: f32[N, 64]
  input %idx: i64[N, 2]
  weight %p: u8[4, 32, 32]
  weight %s: u8[4, 32, 2]
  %gu: f32[N, 2, 32] = moe_gate_up_mxfp4(%h, %p, %s, %idx)
  output gu = %gu
}
"""


def test_the_backend_decodes_by_table_only_for_a_target_with_avx2_and_by_16_lanes_with_avx512():
    import k3c
    from k3c.backends.tvm import TvmBackend

    g = k3c.ir.parse(GRAPH)
    g.weights.update(p=torch.zeros(4, 32, 32, dtype=torch.uint8), s=torch.full((4, 32, 2), 127, dtype=torch.uint8))
    tables = {cpu: set(re.findall(r"k3c_e2m1_\w+", TvmBackend(target=f"llvm -mcpu={cpu}").show({"forward": g})))
              for cpu in ("x86-64", "haswell", "skylake-avx512")}
    assert tables == {"x86-64": set(), "haswell": {"k3c_e2m1_x16"}, "skylake-avx512": {"k3c_e2m1_x16_avx512"}}
