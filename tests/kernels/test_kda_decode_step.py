"""kda_decode_step, KDA's fused decode step: its TVM and Triton kernels and its decomposition
against the naive definition (kernels/kda_decode/naive.py, composed from the definitions of
the short conv, l2norm, KDA and the gated RMSNorm), at awkward shapes (B = 1 and 3, H = 3,
K != V, neither a power of two) and both forget gates; every output, the new state and the
three conv tails included. A malformed step is a one-line shape error."""

from __future__ import annotations

import itertools

import pytest
import torch
from kernel_inputs import randn

from k3c import ir, passes
from k3c.kernels.kda_decode import naive_kda_decode_step
from k3c.numerics import assert_close

W = 4
SHAPES = [(1, 3, 5, 7), (3, 3, 12, 20), (3, 2, 16, 16)]  # B, H, K, V
NAMES = ["o", "state", "q_conv", "k_conv", "v_conv"]


def step_inputs(B: int, H: int, K: int, V: int, gate: str, seed: int = 0) -> list[torch.Tensor]:
    """The op's inputs in its order, shaped as a KDA layer feeds them; a = exp(A_log) for the
    sigmoid gate, -exp(A_log) for softplus."""
    seeds = itertools.count(seed)
    r = lambda *s, scale=1.0: randn(*s, seed=next(seeds), scale=scale)  # noqa: E731
    a = r(H, 1, scale=0.5).exp()
    return [r(B, 1, H * K), r(B, 1, H * K), r(B, 1, H * V), r(H * K, W, scale=0.5), r(H * K, W, scale=0.5),
            r(H * V, W, scale=0.5), r(B, H * K, W - 1), r(B, H * K, W - 1), r(B, H * V, W - 1), r(B, 1, H, K),
            a if gate == "sigmoid" else -a, r(H, K), r(B, 1, H), r(B, H, K, V), r(B, 1, H, V), 1 + r(V, scale=0.1)]


def attrs(K: int, gate: str) -> dict:
    return {"scale": K ** -0.5, "gate": gate, "lower_bound": -5.0, "activation": "silu", "qk_eps": 1e-6, "eps": 1e-5}


def check(got, ref, what: str) -> None:
    for name, x, y in zip(NAMES, got, ref):
        assert_close(torch.as_tensor(x), y, torch.float32, what=f"{what} {name}")


CASES = [pytest.param(s, g, id=f"B{s[0]}-H{s[1]}-K{s[2]}-V{s[3]}-{g}") for s in SHAPES for g in ("sigmoid", "softplus")]


@pytest.mark.parametrize("shape, gate", CASES)
def test_triton_kernel(shape, gate):
    from k3c.kernels.kda_decode.triton import kda_decode_step

    ins = step_inputs(*shape, gate)
    check(kda_decode_step(*ins, **attrs(shape[2], gate)), naive_kda_decode_step(*ins, **attrs(shape[2], gate)),
          "triton")


@pytest.mark.parametrize("shape, gate", CASES[2:4])
def test_triton_kernel_one_head_a_program(shape, gate):
    """At a GPU's tile, one head a program (test_triton_kernel runs the interpreter's: every
    head of a batch row in one program, here H = 3 in a block of 4, one head masked)."""
    from k3c.kernels.common.triton import gpu_tiles
    from k3c.kernels.kda_decode.triton import kda_decode_step
    from k3c.kernels.kda_decode.triton.step import heads_per_program

    assert heads_per_program(shape[1]) == 4
    ins = step_inputs(*shape, gate)
    with gpu_tiles():
        assert heads_per_program(shape[1]) == 1
        check(kda_decode_step(*ins, **attrs(shape[2], gate)), naive_kda_decode_step(*ins, **attrs(shape[2], gate)),
              "triton at a GPU's tile")


@pytest.mark.parametrize("shape, gate", CASES)
def test_tvm_kernel(shape, gate):
    import tvm
    from tvm import s_tir

    from k3c.kernels.kda_decode.tvm import SCHEDULES, kda_decode_step

    B, H, K, V = shape
    a = attrs(K, gate)
    sch = s_tir.Schedule(kda_decode_step(H, K, V, W, a["scale"], gate, a["lower_bound"], a["activation"],
                                         a["qk_eps"], a["eps"]))
    SCHEDULES["llvm"](sch)
    lib = tvm.compile(sch.mod, target="llvm")
    ins = step_inputs(*shape, gate)
    outs = [torch.empty(B, 1, H, V), torch.empty(B, H, K, V), *(torch.empty_like(ins[i]) for i in (6, 7, 8))]
    args = [tvm.runtime.tensor(x.numpy()) for x in ins + outs]
    lib["main"](*args)
    check([torch.from_numpy(t.numpy()) for t in args[len(ins):]], naive_kda_decode_step(*ins, **a), "tvm")


def test_cuda_schedule_builds():
    """The cuda schedule (a thread block per batch and head) generates device code; no GPU needed."""
    import tvm
    from tvm import s_tir

    from k3c.backends.tvm.build import device_source
    from k3c.kernels.kda_decode.tvm import SCHEDULES, kda_decode_step

    sch = s_tir.Schedule(kda_decode_step(2, 8, 8, W, 0.35, "sigmoid", -5.0, "silu", 1e-6, 1e-5, target="cuda"))
    SCHEDULES["cuda"](sch)
    source = device_source(tvm.compile(sch.mod, target={"kind": "cuda", "arch": "sm_90"}))
    assert "__global__" in source and "blockIdx.x" in source


def _graph(B: int, H: int, K: int, V: int, gate: str, dt_shape: str | None = None) -> ir.Graph:
    HK, HV, P = H * K, H * V, W - 1
    types = {"q_x": f"[{B}, 1, {HK}]", "k_x": f"[{B}, 1, {HK}]", "v_x": f"[{B}, 1, {HV}]", "q_w": f"[{HK}, {W}]",
             "k_w": f"[{HK}, {W}]", "v_w": f"[{HV}, {W}]", "q_conv": f"[{B}, {HK}, {P}]", "k_conv": f"[{B}, {HK}, {P}]",
             "v_conv": f"[{B}, {HV}, {P}]", "f": f"[{B}, 1, {H}, {K}]", "a": f"[{H}, 1]",
             "dt_bias": dt_shape or f"[{H}, {K}]", "b": f"[{B}, 1, {H}]", "state": f"[{B}, {H}, {K}, {V}]",
             "o_gate": f"[{B}, 1, {H}, {V}]", "norm_w": f"[{V}]"}
    lines = [f"  input %{n}: f32{t}" for n, t in types.items()]
    outs = (f"%o: f32[{B}, 1, {H}, {V}], %s: f32[{B}, {H}, {K}, {V}], %cq: f32[{B}, {HK}, {P}], "
            f"%ck: f32[{B}, {HK}, {P}], %cv: f32[{B}, {HV}, {P}]")
    args = ", ".join(f"%{n}" for n in types)
    lines.append(f'  {outs} = kda_decode_step({args}) {{scale={K ** -0.5}, gate="{gate}"}}')
    lines += [f"  output {n} = %{n}" for n in ("o", "s", "cq", "ck", "cv")]
    return ir.parse("graph step {\n" + "\n".join(lines) + "\n}\n")


@pytest.mark.parametrize("shape, gate", CASES[:4])
def test_decomposition_is_the_definition(shape, gate):
    """What a backend without a kernel runs (the ops the pass fused, through the interpreter's
    references of those ops) equals the naive definition."""
    g = _graph(*shape, gate)
    ins = step_inputs(*shape, gate)
    decomposed = passes.run(g, ['decompose{ops=["kda_decode_step"]}'])
    assert "kda_decode_step" not in decomposed.op_counts() and decomposed.op_counts()["kda"] == 1
    check(ir.interpret(decomposed, *ins), naive_kda_decode_step(*ins, **attrs(shape[2], gate)), "decomposed")
    check(ir.interpret(g, *ins), naive_kda_decode_step(*ins, **attrs(shape[2], gate)), "interpreted")


def test_a_wrong_gate_bias_is_one_line():
    with pytest.raises(ir.VerifyError) as e:
        ir.verify(_graph(1, 3, 5, 7, "sigmoid", dt_shape="[3, 7]"))
    msg = str(e.value)
    assert "dt_bias must be [3, 5]" in msg and "\n" not in msg.strip()
