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


def scratch(target: str) -> str:
    """The storage scope of a kernel's small scratch buffers on `target`. On llvm, "global": a
    buffer of constant size under 1 KB is then an array on the stack, which LLVM keeps in
    registers. TVM 0.27 allocates a "local" buffer on a CPU from the runtime's workspace pool
    at every entry of its scope (two calls into the runtime, and a pointer LLVM cannot keep in
    registers), and so it does a scalar assigned in TVMScript without `T.let` (a one-element
    "local" buffer): a k3-small decode step made 13,102 such calls. On cuda, "local" (registers)."""
    if target not in TARGETS:
        raise ValueError(f"unknown TVM target {target!r}; known: {', '.join(TARGETS)}")
    return "global" if target == "llvm" else "local"


def inner_loop(target: str):
    """The loop constructor of a kernel's innermost data-parallel loops on `target`."""
    if target not in TARGETS:
        raise ValueError(f"unknown TVM target {target!r}; known: {', '.join(TARGETS)}")
    if target == "cuda":
        return lambda n: T.thread_binding(n, thread="threadIdx.x")
    return T.vectorized


_LOG2E = 1.4426950408889634
_LN2_HI = 0.693359375  # ln 2 = _LN2_HI + _LN2_LO; n * _LN2_HI is exact in float32 for |n| < 2^15
_LN2_LO = -2.12194440e-4


def exp_vec(x):
    """exp(x) for x in [-87, 88] from arithmetic alone, so that LLVM keeps it in vectors (its
    `exp` becomes one libm call per lane): x = n ln2 + r with |r| <= ln2 / 2, exp(r) by its
    Taylor series to degree 7 (relative error below 1e-8), 2^n written into the exponent bits.
    r is reduced in two steps (Cody and Waite's split of ln 2), so that it keeps its low bits:
    with one float32 ln 2 the error of n ln2 alone reaches 4e-7 of exp(x) at |x| ~ 10.
    Outside [-87, 88] x is clamped (exp(-87) = 1.6e-38, the bottom of fp32's normal range).
    NaN stays NaN: a clamp by min/max would map it to a number (a NaN weight gave finite
    outputs where eager gives NaN), so the clamp is two selects on comparisons, which are
    false for NaN and pass it through to r and the result. (An isnan select on the result
    costs as much again as the whole exp: LLVM does not keep it in vectors.)"""
    xc = T.max(T.float32(-87.0), T.min(T.float32(88.0), x))
    n = T.floor(xc * T.float32(_LOG2E) + T.float32(0.5))
    r = (xc - n * T.float32(_LN2_HI)) - n * T.float32(_LN2_LO)
    p = T.float32(1.0 / 5040)
    for c in (1.0 / 720, 1.0 / 120, 1.0 / 24, 1.0 / 6, 0.5, 1.0, 1.0):
        p = p * r + T.float32(c)
    return p * T.reinterpret("float32", T.shift_left(T.Cast("int32", n) + 127, 23))


def sigmoid_vec(x):
    """1 / (1 + exp(-x)) through `exp_vec`, so that it stays in vectors."""
    return T.float32(1.0) / (T.float32(1.0) + exp_vec(-x))


_TANH_TAYLOR = (1.0, -1.0 / 3, 2.0 / 15, -17.0 / 315, 62.0 / 2835, -1382.0 / 155925)


def tanh_vec(x):
    """tanh(x) in vectors: 2 sigmoid(2x) - 1 through `exp_vec`, except for |x| < 1/4, where that
    form cancels (its absolute error of 1e-7 would be a large relative one) and the odd Taylor
    series to x^11 is used instead (relative error below 1e-9 there)."""
    x2 = x * x
    p = T.float32(_TANH_TAYLOR[-1])
    for c in reversed(_TANH_TAYLOR[:-1]):
        p = p * x2 + T.float32(c)
    far = T.float32(2.0) * sigmoid_vec(T.float32(2.0) * x) - T.float32(1.0)
    return T.Select(T.abs(x) < T.float32(0.25), x * p, far)
