"""Pieces shared by the TensorIR kernels of the TVM backend.

A kernel is written once; what differs per target is how its loops run. The outer
data-parallel loops are scheduled with `s_tir` primitives (parallel on llvm, thread blocks on
cuda) by each kernel's `SCHEDULES`; the innermost data-parallel loops, which sit inside a
block next to sequential loops that the schedule primitives cannot reorder around, take their
kind when the kernel is built: vectors on llvm, threads on cuda (`inner_loop`).
"""

from __future__ import annotations

from tvm.script import tirx as T

TARGETS = ("llvm", "cuda")


def inner_loop(target: str):
    """The loop constructor of a kernel's innermost data-parallel loops on `target`."""
    if target not in TARGETS:
        raise ValueError(f"unknown TVM target {target!r}; known: {', '.join(TARGETS)}")
    if target == "cuda":
        return lambda n: T.thread_binding(n, thread="threadIdx.x")
    return T.vectorized
