"""The routed experts through `tl.dot_scaled` (kernels/moe/triton/mxfp4_scaled.py), with BF16
activations (the default) or MXFP8 ones (the block-scaled tensor cores, opt-in).

What the kernels compute is the naive expert (kernels/moe/naive.py) on the MXFP4 weights
decoded by the numpy decoder written from the format's definition (tests/mxfp4_reference.py)
and on activations rounded to BF16 by torch, or to MXFP8 by `mxfp8_reference` below, written
from the OCP MX v1.0 conversion with torch's own float8_e4m3fn cast (it shares nothing with
the kernel's bit arithmetic). Under the interpreter, which has no `tl.dot_scaled`, the kernels multiply the
decoded operands with `tl.dot` (exact there): the quantizer, the loads of the stored layout,
the masks and epilogues are the ones the GPU runs. Then the kernels compiled ahead of time for
sm_100 (a subprocess with TRITON_INTERPRET=0, on meta tensors), with no spills at a decode
step's and a prefill's blocks: with MXFP8 every dot is the block-scaled `tcgen05.mma ...
block_scale`; with BF16 activations a tcgen05 BF16 MMA (`kind::f16`: the hardware's
block-scaled kinds take MX operands on both sides, so Triton decodes the weights for it).
Last, the backend's choice: a module written for sm_100 calls these kernels (and runs), one
for sm_90 or for no target the kernels that decode in registers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from mxfp4_reference import reference_decode
from triton_inputs import DEVICE, gen

from k3c import ir
from k3c.backends.triton import generate_module
from k3c.backends.triton.backend import TritonBackend, _import, expert_forms
from k3c.errors import UsageError
from k3c.kernels.moe.naive import moe_down as down_ref
from k3c.kernels.moe.naive import moe_gate_up as gate_up_ref
from k3c.kernels.moe.triton import moe_down_mxfp4_scaled as down_scaled
from k3c.kernels.moe.triton import moe_experts_mxfp4_scaled, moe_gate_up_mxfp4_scaled, mxfp8_quantize
from k3c.kernels.situ.naive import activation
from k3c.numerics import assert_close

E, TOP_K, N_OUT, TOKENS = 4, 2, 32, 5
dtypes = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])


def mxfp8_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(E4M3 values as float32 [R, K], scales as float32 [R, K/32]) of rows x by OCP MX v1.0:
    scale 2^(floor(log2 amax) - 8) per 32 (E8M0, clamped to 2^-127), x / scale clamped to the
    largest normal 448, then rounded to E4M3 by torch's cast (nearest, ties to even)."""
    g = x.double().reshape(x.shape[0], -1, 32)
    amax = g.abs().amax(-1)
    e = torch.where(amax > 0, torch.floor(torch.log2(amax)), torch.full_like(amax, -200.0))
    scale = torch.exp2((e - 8).clamp(min=-127.0))
    v = (g / scale[..., None]).clamp(-448.0, 448.0).float().to(torch.float8_e4m3fn).float()
    return v.reshape(x.shape), scale.float()


def mxfp8_qdq(x: torch.Tensor) -> torch.Tensor:
    v, s = mxfp8_reference(x)
    return (v.double().reshape(x.shape[0], -1, 32) * s[..., None].double()).reshape(x.shape).float()


def packed_experts(rows: int, K: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = gen(seed)
    return (torch.randint(0, 256, (E, rows, K // 2), dtype=torch.uint8, generator=g),
            torch.randint(122, 130, (E, rows, K // 32), dtype=torch.uint8, generator=g))


def numpy_decode(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return torch.stack([torch.from_numpy(reference_decode(p.numpy(), s.numpy())) for p, s in zip(packed, scale)])


def routing(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = gen(seed)
    idx = torch.stack([torch.randperm(E, generator=g)[:TOP_K] for _ in range(TOKENS)])
    return idx, torch.rand(TOKENS, TOP_K, generator=g)


def on_device(*ts):
    return [t.to(DEVICE) for t in ts]


def e4m3_from_bits(code: torch.Tensor) -> torch.Tensor:
    """E4M3 codes -> float64 from the fields: sign bit 7, exponent bits 6-3 (bias 7), mantissa 2-0."""
    c = code.to(torch.int64)
    exp, man = (c >> 3) & 15, (c & 7).double()
    mag = torch.where(exp == 0, man / 8 * 2.0**-6, (1 + man / 8) * torch.exp2(exp.double() - 7))
    mag = torch.where((c & 0x7F) == 0x7F, float("nan"), mag)
    return torch.where(c & 0x80 != 0, -mag, mag)


def test_the_activation_quantizer_is_ocp_mxfp8():
    """Rows with each case of the conversion: ordinary values, a group of zeros, values that
    saturate at 448 (x / scale in (448, 512)), E4M3 subnormals next to a large value, ties,
    negative zero, and bf16 inputs, against the reference by torch's cast."""
    g = gen(11)
    signs = torch.tensor([1.0, -1.0]).repeat(32)
    rows = [torch.randn(64, generator=g), torch.zeros(64), torch.full((64,), 1.95) * signs,
            torch.cat([torch.tensor([1e3]), torch.randn(31, generator=g) * 1e-3, torch.randn(32, generator=g) * 1e4]),
            torch.tensor([256.0, 9.0, 11.0, 13.0] * 16), torch.cat([torch.tensor([-0.0] * 32), torch.ones(32)]),
            torch.randn(64, generator=g) * 1e-30]
    x = torch.stack(rows)
    for dtype in (torch.float32, torch.bfloat16):
        xd = x.to(dtype)
        codes, scales = mxfp8_quantize(*on_device(xd))
        values, want_scale = mxfp8_reference(xd.float())
        got_scale = torch.exp2(scales.cpu().double() - 127).float()
        assert torch.equal(got_scale, want_scale), (got_scale, want_scale)
        got = e4m3_from_bits(codes.cpu()).float()
        assert torch.equal(got, values), (got - values).abs().max()
    x[0, 3], x[1, 40] = float("inf"), float("nan")  # nothing non-finite turns finite
    codes, scales = mxfp8_quantize(*on_device(x))
    assert scales[0, 0] == 255 and scales[0, 1] != 255 and codes[1, 40] & 0x7F == 0x7F


def test_gate_up_on_mxfp8_activations():
    K = 96  # a partial block of K (BK = 128) and three scale groups
    p13, s13 = packed_experts(2 * N_OUT, K, seed=1)
    for dtype in (torch.float32, torch.bfloat16):
        h = torch.randn(TOKENS, K, generator=gen(2)).to(dtype)
        idx, _ = routing()
        got = moe_gate_up_mxfp4_scaled(*on_device(h, p13, s13, idx), activations="mxfp8")
        want = gate_up_ref(mxfp8_qdq(h.float()), numpy_decode(p13, s13), idx)
        assert got.dtype == dtype and got.shape == (TOKENS, TOP_K, 2 * N_OUT)
        assert_close(got.float().cpu(), want, dtype, "gate/up")


@dtypes
def test_down_on_mxfp8_activations_combines(dtype):
    K = 64
    p2, s2 = packed_experts(N_OUT, K, seed=3)
    a = torch.randn(TOKENS, TOP_K, K, generator=gen(4)).to(dtype)
    idx, w = routing(1)
    got = down_scaled(*on_device(a, p2, s2, idx, w), activations="mxfp8")
    want = down_ref(mxfp8_qdq(a.float().reshape(-1, K)).reshape(a.shape), numpy_decode(p2, s2), idx, w)
    assert got.dtype == dtype and got.shape == (TOKENS, N_OUT)
    assert_close(got.float().cpu(), want, dtype, "down")


@dtypes
def test_whole_expert_writes_its_activation_as_mxfp8(dtype):
    """The activation is rounded to E4M3 from the kernel's fp32 accumulators and the reference's:
    the two differ in their last bits, so inputs stay where SiTU does not saturate (saturated
    values pile up at beta * linear_beta; at a power of two a last-bit difference moves a
    group's scale)."""
    D, I = 64, 32
    p13, s13 = packed_experts(2 * I, D, seed=5)
    p2, s2 = packed_experts(N_OUT, I, seed=6)
    h = (0.05 * torch.randn(TOKENS, D, generator=gen(7))).to(dtype)
    idx, w = routing(2)
    got = moe_experts_mxfp4_scaled(*on_device(h, p13, s13, p2, s2, idx, w), act="situ", beta=4.0, linear_beta=3.0,
                                   activations="mxfp8")
    gu = gate_up_ref(mxfp8_qdq(h.float()), numpy_decode(p13, s13), idx)
    a = activation(gu[..., :I], gu[..., I:], "situ", 4.0, 3.0)
    want = down_ref(mxfp8_qdq(a.reshape(-1, I)).reshape(a.shape), numpy_decode(p2, s2), idx, w)
    assert got.dtype == dtype and got.shape == (TOKENS, N_OUT)
    assert_close(got.float().cpu(), want, dtype, "experts")



def bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


@dtypes
def test_gemms_on_bf16_activations(dtype):
    """The default: the activations go into tl.dot_scaled as BF16 (float32 ones rounded to it)."""
    K = 96  # a partial block of K (BK = 128) and three scale groups
    p13, s13 = packed_experts(2 * N_OUT, K, seed=12)
    h = torch.randn(TOKENS, K, generator=gen(13)).to(dtype)
    idx, w = routing(4)
    got = moe_gate_up_mxfp4_scaled(*on_device(h, p13, s13, idx))
    assert got.dtype == dtype and got.shape == (TOKENS, TOP_K, 2 * N_OUT)
    assert_close(got.float().cpu(), gate_up_ref(bf16(h), numpy_decode(p13, s13), idx), dtype, "gate/up bf16")
    p2, s2 = packed_experts(N_OUT, K, seed=14)
    a = torch.randn(TOKENS, TOP_K, K, generator=gen(15)).to(dtype)
    got = down_scaled(*on_device(a, p2, s2, idx, w))
    assert got.dtype == dtype and got.shape == (TOKENS, N_OUT)
    assert_close(got.float().cpu(), down_ref(bf16(a), numpy_decode(p2, s2), idx, w), dtype, "down bf16")


def test_whole_expert_on_bf16_activations_writes_its_hidden_in_bf16():
    D, I = 64, 32
    p13, s13 = packed_experts(2 * I, D, seed=16)
    p2, s2 = packed_experts(N_OUT, I, seed=17)
    h = (0.05 * torch.randn(TOKENS, D, generator=gen(18))).to(torch.bfloat16)
    idx, w = routing(5)
    got = moe_experts_mxfp4_scaled(*on_device(h, p13, s13, p2, s2, idx, w), act="situ", beta=4.0, linear_beta=3.0)
    gu = gate_up_ref(h.float(), numpy_decode(p13, s13), idx)
    a = activation(gu[..., :I], gu[..., I:], "situ", 4.0, 3.0)
    want = down_ref(bf16(a), numpy_decode(p2, s2), idx, w)
    assert got.dtype == torch.bfloat16 and got.shape == (TOKENS, N_OUT)
    assert_close(got.float().cpu(), want, torch.bfloat16, "experts bf16")


AOT_SCRIPT = textwrap.dedent("""
    import json, sys, tempfile
    from pathlib import Path
    import torch
    from k3c.backends.triton.aot import TARGETS
    from k3c.backends.triton.aot_build import build
    from k3c.backends.triton.aot_record import Recorder
    from k3c.kernels.moe.triton import moe_experts_mxfp4_scaled

    E, D, I, k = 8, 256, 128, 2   # k3-tiny's experts: K = 256 for gate/up, 128 for down
    target = TARGETS["sm_100"]
    rec = Recorder(target.gpu_target())
    meta = dict(device="meta")
    with rec.intercepting():
        for N, acts in ((1, "bf16"), (512, "bf16"), (1, "mxfp8"), (512, "mxfp8")):  # decode, prefill blocks
            moe_experts_mxfp4_scaled(torch.empty(N, D, dtype=torch.bfloat16, **meta),
                                     torch.empty(E, 2 * I, D // 2, dtype=torch.uint8, **meta),
                                     torch.empty(E, 2 * I, D // 32, dtype=torch.uint8, **meta),
                                     torch.empty(E, D, I // 2, dtype=torch.uint8, **meta),
                                     torch.empty(E, D, I // 32, dtype=torch.uint8, **meta),
                                     torch.empty(N, k, dtype=torch.int64, **meta),
                                     torch.empty(N, k, dtype=torch.bfloat16, **meta), "situ", 4.0, None,
                                     activations=acts)
    out = Path(tempfile.mkdtemp())
    rows = [build(launch, target, out) for launch in rec.launches.values()]
    json.dump(rows, sys.stdout)
""")


@pytest.fixture(scope="module")
def aot_rows(tmp_path_factory):
    env = dict(os.environ, TRITON_INTERPRET="0")
    r = subprocess.run([sys.executable, "-c", AOT_SCRIPT], capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_the_expert_gemms_compile_for_sm100_without_spills(aot_rows):
    """MXFP8 activations: every dot on the block-scaled MMA. BF16 ones (the default): a tcgen05
    BF16 MMA, as the hardware's block-scaled kinds take MX operands on both sides."""
    names = {row["name"] for row in aot_rows}
    assert names == {"moe_gated_scaled_kernel", "moe_gemm_scaled_kernel", "mxfp8_quantize_kernel"}, names
    forms = set()
    for row in aot_rows:
        what = f"{row['name']} {row['constexprs']}"
        assert row["ok"], f"{what}: {row.get('error')}"
        assert row["spill_bytes"] == 0 and row["local_bytes"] == 0, f"{what}: spills {row['spill_bytes']} bytes"
        assert row["shared_bytes"] <= 227 * 1024, what
        if row["name"] == "mxfp8_quantize_kernel":
            continue
        fmt = row["constexprs"]["X_FMT"]
        forms.add((fmt, row["constexprs"]["BM"]))
        if fmt == "e4m3":
            assert row["dot_kinds"] == ["e2m1 x e4m3"], what
            assert row["tensor_cores"] == "tcgen05.block_scale", f"{what}: {row['tensor_cores']}"
            assert all("block_scale" in m for m in row["mma"]), f"{what}: {row['mma']}"
        else:
            assert row["dot_kinds"] == ["e2m1 x bf16"], what
            assert row["tensor_cores"] == "tcgen05", f"{what}: {row['tensor_cores']}"
            assert row["mma"] and all("kind::f16" in m for m in row["mma"]), f"{what}: {row['mma']}"
    assert forms == {(f, bm) for f in ("e4m3", "bf16") for bm in (16, 64)}, forms


EXPERTS_GRAPH = """
graph experts {
  dim N in [1, inf]
  input %h: f32[N, 64]
  input %idx: i64[N, 2]
  input %w: f32[N, 2]
  weight %w13p: u8[4, 64, 32]
  weight %w13s: u8[4, 64, 2]
  weight %w2p: u8[4, 32, 16]
  weight %w2s: u8[4, 32, 1]
  %y: f32[N, 32] = moe_experts_mxfp4(%h, %w13p, %w13s, %w2p, %w2s, %idx, %w) {act="situ", beta=4.0, linear_beta=3.0}
  output y = %y
}
"""


def _experts_graph(dtype: str = "f32"):
    g = ir.parse(EXPERTS_GRAPH.replace("f32[N, 64]", f"{dtype}[N, 64]").replace("f32[N, 32]", f"{dtype}[N, 32]"))
    p13, s13 = packed_experts(64, 64, seed=8)
    p2, s2 = packed_experts(32, 32, seed=9)
    g.weights.update(w13p=p13, w13s=s13, w2p=p2, w2s=s2)
    return ir.verify(g)


def _run_module(tmp_path, source: str, g, h: torch.Tensor) -> torch.Tensor:
    (tmp_path / "m.py").write_text(source)
    idx, w = routing(3)
    return _import(tmp_path / "m.py").forward("forward", on_device(h, idx, w.to(h.dtype)), dict(zip(
        g.weights, on_device(*g.weights.values()))))[0].float().cpu()


def _want(g, h: torch.Tensor, rounding) -> torch.Tensor:
    idx, w = routing(3)
    p13, s13, p2, s2 = (g.weights[n] for n in ("w13p", "w13s", "w2p", "w2s"))
    gu = gate_up_ref(rounding(h.float()), numpy_decode(p13, s13), idx)
    a = activation(gu[..., :32], gu[..., 32:], "situ", 4.0, 3.0)
    return down_ref(rounding(a.reshape(-1, 32)).reshape(a.shape), numpy_decode(p2, s2), idx, w.to(h.dtype).float())


def test_the_target_picks_the_kernels_once_when_the_module_is_written(tmp_path):
    """sm_90's module and one for no target call the kernels that decode in registers; sm_100's
    calls tl.dot_scaled with BF16 activations where the model's are BF16 (float32 ones keep the
    decode kernels, which multiply them as they are), and with MXFP8 ones when asked for. The
    sm_100 modules run (here under the interpreter) against the naive expert."""
    g = _experts_graph()
    for target in (None, "sm_90", "sm_100"):
        source = generate_module({"forward": g}, "t", target)
        assert "moe_experts_mxfp4(h, " in source and "_scaled" not in source, target
    assert expert_forms("sm_100", {"forward": g}) == [] and expert_forms("sm_90", {"forward": g}, "mxfp8") == []
    assert expert_forms("sm_100", {"forward": g}, "mxfp8") == ["mxfp8"]  # what the manifest records
    source = generate_module({"forward": g}, "t", "sm_100", expert_activations="mxfp8")
    assert "moe_experts_mxfp4_scaled(h, " in source and "activations='mxfp8')" in source
    h = 0.05 * torch.randn(TOKENS, 64, generator=gen(10))
    assert_close(_run_module(tmp_path, source, g, h), _want(g, h, mxfp8_qdq), torch.float32, "sm_100 mxfp8")
    g16 = _experts_graph("bf16")
    source = generate_module({"forward": g16}, "t", "sm_100")
    assert "moe_experts_mxfp4_scaled(h, " in source and "activations='bf16')" in source
    assert expert_forms("sm_100", {"forward": g16}) == ["bf16"]
    h16 = h.to(torch.bfloat16)
    assert_close(_run_module(tmp_path, source, g16, h16), _want(g16, h16, bf16), torch.bfloat16, "sm_100 bf16")


@pytest.mark.parametrize("target", [None, "sm_90"])
def test_mxfp8_activations_need_the_block_scaled_target(target):
    with pytest.raises(UsageError) as e:
        TritonBackend(target=target, expert_activations="mxfp8")
    assert "\n" not in str(e.value) and "sm_100" in str(e.value)
    assert TritonBackend(target="sm_100", expert_activations="mxfp8").expert_activations == "mxfp8"
    assert TritonBackend(target="sm_100").expert_activations == "bf16"
