"""The TVM kernels that read weights in their stored formats, against the naive definitions:
the panel GEMM on BF16 panels (torch's own bf16 -> f32 conversion as the reference) and the
routed-expert kernels on MXFP4 panels (kernels/mxfp4/naive.py's decode, then
kernels/moe/naive.py), at awkward shapes: K not a multiple of a vector, N odd, M = 1, 7, 64.
The panels are built here with torch, from the layout the kernels' docstrings give."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import tvm
from tvm import s_tir
from tvm.script import tirx as T

from k3c.backends.tvm.target import CPU_FEATURES, make_target
from k3c.kernels.common.tvm.gemm import PANEL, WIDE_PANEL, packed_linear
from k3c.kernels.moe.naive import moe_down, moe_gate_up
from k3c.kernels.moe.tvm import SCHEDULES, panel
from k3c.kernels.moe.tvm import moe_down as tvm_moe_down
from k3c.kernels.moe.tvm import moe_gate_up as tvm_moe_gate_up
from k3c.kernels.moe.tvm import mxfp4 as mx
from k3c.kernels.mxfp4.naive import decode, e2m1_table, e8m0_to_float
from k3c.numerics import assert_close


def _tvm(t: torch.Tensor):
    """A TVM tensor holding `t` (bfloat16 too, which numpy lacks)."""
    out = tvm.runtime.empty(tuple(t.shape), str(t.dtype).removeprefix("torch."), tvm.cpu())
    torch.from_dlpack(out).copy_(t)
    return out


def _bf16_panels(w: torch.Tensor, c: int) -> torch.Tensor:
    N, K = w.shape
    P = -(-N // c)
    return F.pad(w, (0, 0, 0, P * c - N)).reshape(P, c, K).permute(0, 2, 1).contiguous()


def _gemm(x: torch.Tensor, w: torch.Tensor, rows: int, c: int) -> torch.Tensor:
    (M, K), (N, _) = x.shape, w.shape
    lib = tvm.compile(packed_linear(K, N, rows, c, "bfloat16"), target=make_target("llvm"))
    y = _tvm(torch.full((M, N), float("nan")))
    lib(_tvm(x), _tvm(_bf16_panels(w, c)), y)
    return torch.from_dlpack(y).clone()


@pytest.mark.parametrize("rows, c", [(1, PANEL), (6, PANEL), (1, WIDE_PANEL), (8, WIDE_PANEL)], ids=str)
@pytest.mark.parametrize("M, N, K", [(1, 7, 37), (7, 40, 21), (64, 33, 3), (1, 48, 130)], ids=str)
def test_bf16_panel_gemm_against_torch(M, N, K, rows, c):
    """Panels past N are never written; the GEMV form (rows = 1) splits k over accumulator
    sets, with a remainder when K is not a multiple of them, or only the remainder (K = 3)."""
    gen = torch.Generator().manual_seed(M * 1000 + N * 10 + K)
    x, w = torch.randn(M, K, generator=gen), torch.randn(N, K, generator=gen).to(torch.bfloat16)
    assert_close(_gemm(x, w, rows, c), x @ w.float().T, what=f"bf16 panel GEMM M={M} N={N} K={K} rows={rows}")


@pytest.mark.parametrize("rows", [1, 6])
def test_bf16_widening_is_exact(rows):
    """x = I picks each weight alone (the other products are zeros): the output is the weight
    as torch widens it, bit for bit, subnormals included."""
    gen = torch.Generator().manual_seed(rows)
    w = torch.randn(9, 13, generator=gen).to(torch.bfloat16)
    w[0, :4] = torch.tensor([1e-39, -1e-40, 3e38, -2.0**-126]).to(torch.bfloat16)
    assert torch.equal(_gemm(torch.eye(13), w, rows, PANEL), w.float().T)


@pytest.mark.parametrize("c, prefill_rows", [(PANEL, 6), (WIDE_PANEL, 8)], ids=str)
@pytest.mark.parametrize("M", [1, 8, 13])
def test_float32_decode_and_prefill_forms_agree_bit_for_bit(M, c, prefill_rows):
    """A float32 weight keeps one accumulator chain in k order in every loop form (one row, the
    decode step's tiles of 4 or 8 rows, the prefill tile of 6 or 8), so an fp32 model's result
    does not depend on which form ran."""
    K, N = 37, 40
    gen = torch.Generator().manual_seed(M)
    x, wp = torch.randn(M, K, generator=gen), torch.randn(-(-N // c), K, c, generator=gen)
    outs = []
    for rows in (1, prefill_rows):
        lib = tvm.compile(packed_linear(K, N, rows, c), target=make_target("llvm"))
        y = _tvm(torch.full((M, N), float("nan")))
        lib(_tvm(x), _tvm(wp), y)
        outs.append(torch.from_dlpack(y).clone())
    assert not outs[0].isnan().any() and torch.equal(outs[0], outs[1])


@T.prim_func
def _decode_tables(codes: T.Buffer((16,), "int32"), scales: T.Buffer((256,), "int32"),
                   v: T.Buffer((16,), "float32"), s: T.Buffer((256,), "float32")):
    for i in range(16):
        v[i] = mx.e2m1(codes[i])
    for i in range(256):
        s[i] = mx.e8m0(scales[i])


def test_in_register_decode_is_the_definition_for_every_code_and_scale_byte():
    """Every E2M1 code and every E8M0 byte (0: the subnormal 2^-127, 255: NaN) decodes to the
    bits of kernels/mxfp4/naive.py's tables."""
    lib = tvm.compile(_decode_tables, target=make_target("llvm"))
    v, s = _tvm(torch.zeros(16)), _tvm(torch.zeros(256))
    lib(_tvm(torch.arange(16, dtype=torch.int32)), _tvm(torch.arange(256, dtype=torch.int32)), v, s)
    assert torch.equal(torch.from_dlpack(v).view(torch.int32), e2m1_table().view(torch.int32))
    expected = e8m0_to_float(torch.arange(256, dtype=torch.uint8))
    got = torch.from_dlpack(s)
    assert torch.equal(got[:255].view(torch.int32), expected[:255].view(torch.int32)) and got[255].isnan()


def _mxfp4_panels(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """[E, out, in/2], [E, out, in/32] -> [E, out/F, in/32, 17, F]: per group its 16 code bytes,
    then its scale byte."""
    E, n_out, half = packed.shape
    Fp, groups = panel(n_out), scale.shape[-1]
    codes = packed.reshape(E, n_out // Fp, Fp, groups, half // groups).permute(0, 1, 3, 4, 2)
    scales = scale.reshape(E, n_out // Fp, Fp, groups, 1).permute(0, 1, 3, 4, 2)
    return torch.cat([codes, scales], dim=3).contiguous()


def _experts(gen, E: int, n_out: int, n_in: int) -> tuple[torch.Tensor, torch.Tensor]:
    packed = torch.randint(0, 256, (E, n_out, n_in // 2), dtype=torch.uint8, generator=gen)
    scale = torch.randint(118, 130, (E, n_out, n_in // 32), dtype=torch.uint8, generator=gen)
    return packed, scale


def _build(func):
    sch = s_tir.Schedule(func)
    SCHEDULES["llvm"](sch)
    return tvm.compile(tvm.IRModule({"main": sch.mod["main"]}), target=make_target("llvm"))


def _run(func, args, out_shape):
    lib = func if isinstance(func, tvm.runtime.Executable) else _build(func)
    out = _tvm(torch.full(out_shape, float("nan")))
    lib(*[_tvm(a) for a in args], out)
    return torch.from_dlpack(out).clone()


@pytest.mark.parametrize("rows", [1, 6])
@pytest.mark.parametrize("N", [1, 7, 64])
def test_mxfp4_expert_kernels_against_the_naive_decode_and_gemms(N, rows):
    """gate_up [E=3, 2I=24, D=64] (panels of 8) and down [3, 28, 32] (panels of 4), top-2."""
    E, D, I, Dout, k = 3, 64, 12, 28, 2
    gen = torch.Generator().manual_seed(N * 10 + rows)
    p13, s13 = _experts(gen, E, 2 * I, D)
    p2, s2 = _experts(gen, E, Dout, I * 2 + 8)  # in = 32: one group
    h = torch.randn(N, D, generator=gen)
    a = torch.randn(N, k, 32, generator=gen)
    idx = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(N)])
    cw = torch.rand(N, k, generator=gen)
    gu = _run(tvm_moe_gate_up(E, D, 2 * I, k, "llvm", rows, weights="mxfp4"), [h, _mxfp4_panels(p13, s13), idx],
              (N, k, 2 * I))
    assert_close(gu, moe_gate_up(h, decode(p13, s13), idx), what=f"mxfp4 gate_up N={N}")
    y = _run(tvm_moe_down(E, 32, Dout, k, "llvm", rows, weights="mxfp4"), [a, _mxfp4_panels(p2, s2), idx, cw],
             (N, Dout))
    assert_close(y, moe_down(a, decode(p2, s2), idx, cw), what=f"mxfp4 down N={N}")


@pytest.mark.parametrize("rows", [1, 6])
def test_an_expert_decoded_once_for_its_rows_sums_as_each_row_alone(rows):
    """N = 9 tokens over E = 3 experts: every expert has two rows or more and decodes each panel
    once into a buffer; each token alone (one row an expert) decodes in registers. Each output
    is the same k-ordered chain of products, so the two agree bit for bit, and both are the
    naive decode and GEMMs. D = 96: three groups; panels of 8 (gate/up) and 4 (down)."""
    E, D, I2, Dout, I, k, N = 3, 96, 24, 28, 64, 2, 9
    gen = torch.Generator().manual_seed(rows)
    p13, s13 = _experts(gen, E, I2, D)
    p2, s2 = _experts(gen, E, Dout, I)
    h, a = torch.randn(N, D, generator=gen), torch.randn(N, k, I, generator=gen)
    idx = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(N)])
    cw = torch.rand(N, k, generator=gen)
    w13, w2 = _mxfp4_panels(p13, s13), _mxfp4_panels(p2, s2)
    gate_up = _build(tvm_moe_gate_up(E, D, I2, k, "llvm", rows, weights="mxfp4"))
    down = _build(tvm_moe_down(E, I, Dout, k, "llvm", rows, weights="mxfp4"))
    assert all(int((idx == e).sum()) >= 2 for e in range(E))
    gu, y = _run(gate_up, [h, w13, idx], (N, k, I2)), _run(down, [a, w2, idx, cw], (N, Dout))
    for n in range(N):
        one = _run(gate_up, [h[n:n + 1], w13, idx[n:n + 1]], (1, k, I2))
        assert torch.equal(gu[n:n + 1].view(torch.int32), one.view(torch.int32)), n
        one = _run(down, [a[n:n + 1], w2, idx[n:n + 1], cw[n:n + 1]], (1, Dout))
        assert torch.equal(y[n:n + 1].view(torch.int32), one.view(torch.int32)), n
    assert_close(gu, moe_gate_up(h, decode(p13, s13), idx), what=f"mxfp4 gate_up, buffered, rows={rows}")
    assert_close(y, moe_down(a, decode(p2, s2), idx, cw), what=f"mxfp4 down, buffered, rows={rows}")


def test_a_release_precision_artifact_holds_its_weights_as_stored(tmp_path):
    """K3 as released (BF16, MXFP4 experts; a KDA + dense layer and an MLA + MoE layer): after
    the load's parameter transform, the VM's parameters hold within 10% of the release bytes.
    A float32 copy of the BF16 weights (what the transform made before) holds about twice."""
    import json

    from safetensors.torch import load_file
    from tvm import relax

    import k3c
    from k3c import models
    from k3c.models.weight_bytes import weight_bytes

    model = models.build("k3-tiny", seed=0, dtype=torch.bfloat16, experts="mxfp4", num_layers=2, mla_layers=(2,))
    out = k3c.compile(model, "tvm", (torch.randint(0, model.config.vocab_size, (1, 8)),), out_dir=tmp_path).out_dir
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(out / "lib.so")), tvm.cpu())
    tensors = load_file(str(out / "weights.safetensors"))
    manifest = json.loads((out / "manifest.json").read_text())
    params = vm["transform_params"]([_tvm(tensors[w]) for w in manifest["weights"]])
    held = {}
    for p in params:
        held[str(p.dtype)] = held.get(str(p.dtype), 0) + p.numel() * tvm.runtime.DataType(str(p.dtype)).bits // 8
    release = weight_bytes(model)["total"]
    assert sum(held.values()) <= 1.1 * release, (held, release)
    assert held.get("float32", 0) < 0.1 * release, held  # the release's few F32 tensors and folded norms
    # the host the kernels were chosen for: its -mcpu, and the features the OS reports for it
    assert manifest["target_string"] == str(make_target("llvm")) and "mcpu" in manifest["target_string"]
    flags = next(line.split(":", 1)[1].split() for line in open("/proc/cpuinfo") if line.startswith("flags"))
    os_names = {"avx512bf16": "avx512_bf16", "avx512vnni": "avx512_vnni"}
    assert manifest["cpu_features"] == [f for f in CPU_FEATURES if os_names.get(f, f.replace("-", "_")) in flags]
