"""The routed-expert GEMMs on MXFP4 experts in Triton, decoding the codes in the kernel.

Under the interpreter (E = 4 experts, K = 64 and 96 inputs, N = 32 outputs, a few tokens):
gate/up, down with the combine weights, and the whole expert with SiTU, against the naive
per-expert loops of kernels/moe on weights decoded by the numpy decoder written from the
format's definition (tests/mxfp4_reference.py). K = 96 leaves a partial block of K. Then the
kernels compiled ahead of time for sm_90 (a subprocess with TRITON_INTERPRET=0, on meta
tensors, as `k3c compile --target` does) with no spills and their dots on the tensor cores, and
the Triton backend lowering `moe_experts_mxfp4` to them.
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

from k3c.kernels.moe.naive import moe_down as down_ref
from k3c.kernels.moe.naive import moe_gate_up as gate_up_ref
from k3c.kernels.moe.triton import moe_down_mxfp4, moe_experts_mxfp4, moe_gate_up_mxfp4
from k3c.kernels.situ.naive import activation
from k3c.numerics import assert_close

E, TOP_K, N_OUT, TOKENS = 4, 2, 32, 5
dtypes = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
widths = pytest.mark.parametrize("K", [64, 96], ids=["K64", "K96"])


def packed_experts(rows: int, K: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random codes (every byte value likely) and E8M0 scales around 2^-5 .. 2^2."""
    g = gen(seed)
    return (torch.randint(0, 256, (E, rows, K // 2), dtype=torch.uint8, generator=g),
            torch.randint(122, 130, (E, rows, K // 32), dtype=torch.uint8, generator=g))


def numpy_decode(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """[E, rows, K/2], [E, rows, K/32] -> float32 [E, rows, K] by the definition's decoder."""
    return torch.stack([torch.from_numpy(reference_decode(p.numpy(), s.numpy())) for p, s in zip(packed, scale)])


def routing(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = gen(seed)
    idx = torch.stack([torch.randperm(E, generator=g)[:TOP_K] for _ in range(TOKENS)])
    return idx, torch.rand(TOKENS, TOP_K, generator=g)


def on_device(*ts):
    return [t.to(DEVICE) for t in ts]


@dtypes
@widths
def test_gate_up_decodes_in_the_kernel(dtype, K):
    p13, s13 = packed_experts(2 * N_OUT, K, seed=1)
    h = torch.randn(TOKENS, K, generator=gen(2)).to(dtype)
    idx, _ = routing()
    got = moe_gate_up_mxfp4(*on_device(h, p13, s13, idx))
    want = gate_up_ref(h.float(), numpy_decode(p13, s13), idx)
    assert got.dtype == dtype and got.shape == (TOKENS, TOP_K, 2 * N_OUT)
    assert_close(got.float().cpu(), want, dtype, "gate/up")


@dtypes
@widths
def test_down_decodes_in_the_kernel_and_combines(dtype, K):
    p2, s2 = packed_experts(N_OUT, K, seed=3)
    a = torch.randn(TOKENS, TOP_K, K, generator=gen(4)).to(dtype)
    idx, w = routing(1)
    got = moe_down_mxfp4(*on_device(a, p2, s2, idx, w))
    want = down_ref(a.float(), numpy_decode(p2, s2), idx, w)
    assert got.dtype == dtype and got.shape == (TOKENS, N_OUT)
    assert_close(got.float().cpu(), want, dtype, "down")


@dtypes
def test_whole_expert_with_situ(dtype):
    D, I = 64, 32  # K = D for gate/up, K = I for down
    p13, s13 = packed_experts(2 * I, D, seed=5)
    p2, s2 = packed_experts(N_OUT, I, seed=6)
    h = torch.randn(TOKENS, D, generator=gen(7)).to(dtype)
    idx, w = routing(2)
    got = moe_experts_mxfp4(*on_device(h, p13, s13, p2, s2, idx, w), act="situ", beta=4.0, linear_beta=2.0)
    gu = gate_up_ref(h.float(), numpy_decode(p13, s13), idx)
    want = down_ref(activation(gu[..., :I], gu[..., I:], "situ", 4.0, 2.0), numpy_decode(p2, s2), idx, w)
    assert got.dtype == dtype and got.shape == (TOKENS, N_OUT)
    assert_close(got.float().cpu(), want, dtype, "experts")


def test_mismatched_codes_and_scales_are_a_clear_error():
    p13, s13 = packed_experts(2 * N_OUT, 64, seed=1)
    h = torch.randn(TOKENS, 64)
    idx, _ = routing()
    with pytest.raises(ValueError, match="moe_gate_up_mxfp4: mxfp4: packed .* K = 64 .* scale has 1"):
        moe_gate_up_mxfp4(*on_device(h, p13, s13[..., :1], idx))
    with pytest.raises(ValueError, match=r"packed experts must be \[E, out, 48\]"):
        moe_gate_up_mxfp4(*on_device(torch.randn(TOKENS, 96), p13, s13, idx))


AOT_SCRIPT = textwrap.dedent("""
    import json, sys, tempfile
    from pathlib import Path
    import torch
    from k3c.backends.triton.aot import TARGETS
    from k3c.backends.triton.aot_build import build
    from k3c.backends.triton.aot_record import Recorder
    from k3c.kernels.moe.triton import moe_experts_mxfp4

    E, D, I, k = 8, 256, 128, 2   # k3-tiny's experts: K = 256 for gate/up, 128 for down
    target = TARGETS["sm_90"]
    rec = Recorder(target.gpu_target())
    meta = dict(device="meta")
    with rec.intercepting():
        for dtype in (torch.bfloat16, torch.float32):
            for N in (1, 512):  # a decode step (16-row blocks) and a prefill (64-row blocks)
                moe_experts_mxfp4(torch.empty(N, D, dtype=dtype, **meta),
                                  torch.empty(E, 2 * I, D // 2, dtype=torch.uint8, **meta),
                                  torch.empty(E, 2 * I, D // 32, dtype=torch.uint8, **meta),
                                  torch.empty(E, D, I // 2, dtype=torch.uint8, **meta),
                                  torch.empty(E, D, I // 32, dtype=torch.uint8, **meta),
                                  torch.empty(N, k, dtype=torch.int64, **meta),
                                  torch.empty(N, k, dtype=dtype, **meta), "situ", 4.0, None)
    out = Path(tempfile.mkdtemp())
    rows = [build(launch, target, out) for launch in rec.launches.values()]
    json.dump(rows, sys.stdout)
""")


@pytest.fixture(scope="module")
def aot_rows():
    env = dict(os.environ, TRITON_INTERPRET="0")
    r = subprocess.run([sys.executable, "-c", AOT_SCRIPT], capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_the_kernels_compile_for_sm90_without_spills_on_tensor_cores(aot_rows):
    names = {row["name"] for row in aot_rows}
    assert names == {"moe_gated_mxfp4_kernel", "moe_gemm_mxfp4_kernel"}, names
    for row in aot_rows:
        what = f"{row['name']} {row['constexprs']}"
        assert row["ok"], f"{what}: {row.get('error')}"
        assert row["spill_bytes"] == 0 and row["local_bytes"] == 0, f"{what}: spills {row['spill_bytes']} bytes"
        assert row["shared_bytes"] <= 227 * 1024, what
        assert row["dots"] >= 2 and row["tensor_cores"] in ("wgmma", "mma"), f"{what}: {row['tensor_cores']}"
    kinds = {kind for row in aot_rows for kind in row["dot_kinds"]}
    assert "bf16" in kinds and "ieee" not in kinds, kinds  # bf16 operands for bf16 activations
    assert {row["constexprs"]["BM"] for row in aot_rows} == {16, 64}
