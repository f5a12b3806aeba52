"""The hand-written CPU kernels (those of a decode step, and the prefill's attention and delta
rule pieces) keep their small scratch buffers and scalars on the stack. TVM 0.27 allocates a
"local" buffer, and a scalar assigned in TVMScript without `T.let`, from the runtime's
workspace pool at every entry of its scope: a call into the runtime and back, and a pointer
LLVM cannot keep in registers (a k3-small decode step made 13,102 such calls, 645 with the
kernels as they are). What a kernel may still take from the pool is a buffer of 1 KB or more,
which TVM never puts on the stack. Read from the LLVM IR that the build emits: each call
through `__TVMBackendAllocWorkspace` and the bytes it asks for."""

from __future__ import annotations

import re

import pytest
import tvm
from tvm import s_tir

from k3c.backends.tvm.target import make_target
from k3c.kernels.attention.tvm import SCHEDULES as ATTENTION_SCHEDULES
from k3c.kernels.attention.tvm import causal_attention
from k3c.kernels.attn_res.tvm import SCHEDULES as RES_SCHEDULES
from k3c.kernels.attn_res.tvm import attn_res_mix
from k3c.kernels.cache.tvm import MERGE_SCHEDULES, latent_merge
from k3c.kernels.cache.tvm_blocked import latent_split_blocked
from k3c.kernels.common.tvm.gemm import packed_linear
from k3c.kernels.common.tvm.gemm_bf16 import dot_linear
from k3c.kernels.delta.tvm import chunk, recurrent, scores
from k3c.kernels.kda_decode.tvm import SCHEDULES as KDA_SCHEDULES
from k3c.kernels.kda_decode.tvm import kda_decode_step
from k3c.kernels.moe.tvm import SCHEDULES as MOE_SCHEDULES
from k3c.kernels.moe.tvm import moe_down, moe_gate_up

STACK_LIMIT = 1024  # bytes: TVM puts a constant-size "global" buffer under this on the stack


def _scheduled(func, schedules):
    sch = s_tir.Schedule(func)
    schedules["llvm"](sch)
    return sch.mod["main"]


KERNELS = {
    "gemv f32": lambda: packed_linear(64, 40, 1, 32, "float32"),
    "gemv bf16": lambda: packed_linear(64, 40, 1, 32, "bfloat16"),
    "gemm bf16 dot": lambda: dot_linear(64, 40, 4, 32),
    "latent split": lambda: latent_split_blocked(4, 32, 8, 0.3, 16),
    "latent merge": lambda: _scheduled(latent_merge(4, 32), MERGE_SCHEDULES),
    "attn_res mix": lambda: _scheduled(attn_res_mix(3, 16, 1e-6), RES_SCHEDULES),
    "moe gate_up mxfp4": lambda: _scheduled(moe_gate_up(4, 64, 32, 2, "llvm", 1, weights="mxfp4", lut=True),
                                            MOE_SCHEDULES),
    "moe down mxfp4": lambda: _scheduled(moe_down(4, 32, 64, 2, "llvm", 1, weights="mxfp4", lut=True),
                                         MOE_SCHEDULES),
    "moe gate_up f32": lambda: _scheduled(moe_gate_up(4, 64, 32, 2, "llvm", 6), MOE_SCHEDULES),
    "causal attention": lambda: _scheduled(causal_attention(4, 2, 16, 16, 0.25), ATTENTION_SCHEDULES),
    "delta recurrent": lambda: _scheduled(recurrent.delta_recurrent(2, 16, 16, "channel", 0.25), recurrent.SCHEDULES),
    "chunk solve": lambda: _scheduled(chunk.chunk_solve(2, 16, 16, 16, "channel"), chunk.SCHEDULES),
    "chunk state scan": lambda: _scheduled(chunk.chunk_state_scan(2, 16, 16, 16, 16), chunk.SCHEDULES),
    "chunk output": lambda: _scheduled(chunk.chunk_output(2, 16, 16, 16, 0.25), chunk.SCHEDULES),
    "chunk scores": lambda: _scheduled(scores.chunk_scores_channel(2, 16, 16), chunk.SCHEDULES),
    "kda decode step": lambda: _scheduled(kda_decode_step(2, 16, 16, 4, 0.25, "sigmoid", -5.0, "silu", 1e-6, 1e-5),
                                          KDA_SCHEDULES),
}


def workspace_requests(func) -> list[str]:
    """The byte counts the compiled kernel asks the workspace pool for (a symbolic count as its
    LLVM operand)."""
    lib = tvm.compile(tvm.IRModule({"main": func}), target=make_target("llvm"))
    ll = (lib.mod if hasattr(lib, "mod") else lib).inspect_source("ll")
    pools = set(re.findall(r"(%\w+) = load ptr, ptr @__TVMBackendAllocWorkspace", ll))
    calls = re.findall(r"= (?:tail )?call ptr (%\w+)\(i32 [^,]+, i32 [^,]+, i64 ([^,]+),", ll)
    return [size for fn, size in calls if fn in pools]


@pytest.mark.parametrize("name", list(KERNELS))
def test_no_small_buffer_or_scalar_comes_from_the_workspace_pool(name):
    sizes = workspace_requests(KERNELS[name]())
    small = [s for s in sizes if s.lstrip("-").isdigit() and int(s) < STACK_LIMIT]
    assert not small, f"{name}: workspace requests of {small} bytes (a 'local' buffer or an untyped scalar)"


def test_the_check_sees_a_local_scalar():
    """The check above can fail: a kernel with a scalar assigned without `T.let` and a small
    "local" buffer asks the pool for both (8 bytes for the scalar; the buffer TVM narrows to
    the one element used)."""
    from tvm.script import tirx as T

    @T.prim_func
    def kernel(a: T.Buffer((64,), "float32"), n: T.int64):
        T.func_attr({"tirx.noalias": True})
        for i in T.parallel(n):
            x = i * T.int64(3)
            acc = T.decl_buffer((4,), "float32", scope="local")
            acc[0] = a[x % T.int64(64)]
            a[i % T.int64(64)] = acc[0]

    sizes = sorted(int(s) for s in workspace_requests(kernel))
    assert len(sizes) == 2 and 8 in sizes and max(sizes) < STACK_LIMIT, sizes
