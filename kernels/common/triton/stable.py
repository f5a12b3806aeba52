"""Elementwise forms for generated Triton kernels that keep their relative accuracy for every
input (the generated elementwise kernels import them by name).

log(1 + exp(x)) rounds away the digits of exp(x) once x < -2 (1.4e-4 relative at x = -8, 100%
below -16.6), and Kimi Linear's gate multiplies its softplus by exp(A_log). Written instead as
max(y, 0) + log1p(exp(-|y|)), with log1p(e) = log(u) e / (u - 1), u = 1 + e (Goldberg's form,
a few ulp; e itself when u rounds to 1), from tl.exp and tl.log alone, which the interpreter
and every GPU target have.
"""

from __future__ import annotations

from . import INTERPRET  # noqa: F401  (decides the mode before triton is imported)

import triton  # isort: skip
import triton.language as tl  # isort: skip


@triton.jit
def softplus(x, beta, threshold):
    y = x * beta
    e = tl.exp(-tl.abs(y))
    u = 1.0 + e
    log1p_e = tl.where(u == 1.0, e, tl.log(u) * e / (u - 1.0))
    return tl.where(y > threshold, x, (tl.maximum(y, 0.0) + log1p_e) / beta)
