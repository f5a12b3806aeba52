"""SiTU (and SiLU-GLU) as an elementwise TensorIR kernel: the epilogue of the gate/up GEMM.

    out = beta tanh(gate / beta) sigmoid(gate) * linear_beta tanh(up / linear_beta)    (situ)
    out = silu(gate) * up                                                              (silu)

`packed=True` reads gate and up from one [M, 2I] tensor (gate columns first), the output of
the merged gate/up GEMM of `gated_mlp` and `moe_experts`. The kernel is left unscheduled and
injective, so Relax fuses it into the GEMM that feeds it and the backend's elementwise and
GEMM rules schedule the fused function. tanh and sigmoid are written through `exp_vec`
(kernels/common/tvm) so that the loop vectorizes (LLVM's own are one libm call per lane).
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from ...common.tvm import sigmoid_vec, tanh_vec
from ..naive import ACTIVATIONS, BETA, LINEAR_BETA


def _act(gate, up, act: str, beta: float, linear_beta: float | None):
    if act == "silu":
        return gate * sigmoid_vec(gate) * up
    a = T.float32(beta) * tanh_vec(gate / T.float32(beta)) * sigmoid_vec(gate)
    if linear_beta is None:
        return a * up
    return a * (T.float32(linear_beta) * tanh_vec(up / T.float32(linear_beta)))


def situ(I: int, act: str = "situ", beta: float = BETA, linear_beta: float | None = LINEAR_BETA,
         packed: bool = False) -> tirx.PrimFunc:
    """gate, up [M, I] (or x [M, 2I] when packed) -> out [M, I]; float32."""
    if act not in ACTIVATIONS:
        raise ValueError(f"act must be one of {ACTIVATIONS}, got {act!r}")
    beta = float(beta)
    linear_beta = None if linear_beta is None else float(linear_beta)

    if packed:
        @T.prim_func(s_tir=True)
        def kernel(x_h: T.handle, out_h: T.handle):
            M = T.int64()
            x = T.match_buffer(x_h, (M, 2 * I), "float32")
            out = T.match_buffer(out_h, (M, I), "float32")
            for m, i in T.grid(M, I):
                with T.sblock("situ"):
                    vm, vi = T.axis.remap("SS", [m, i])
                    out[vm, vi] = _act(x[vm, vi], x[vm, vi + I], act, beta, linear_beta)

        return kernel

    @T.prim_func(s_tir=True)
    def kernel(gate_h: T.handle, up_h: T.handle, out_h: T.handle):
        M = T.int64()
        gate = T.match_buffer(gate_h, (M, I), "float32")
        up = T.match_buffer(up_h, (M, I), "float32")
        out = T.match_buffer(out_h, (M, I), "float32")
        for m, i in T.grid(M, I):
            with T.sblock("situ"):
                vm, vi = T.axis.remap("SS", [m, i])
                out[vm, vi] = _act(gate[vm, vi], up[vm, vi], act, beta, linear_beta)

    return kernel
