"""Elementwise forms that keep their relative accuracy for every input, as Relax expressions.

TVM legalizes `softplus` as log(1 + exp(x)): for x < -2 the 1 + exp(x) rounds away the digits
of exp(x) (1.4e-4 relative at x = -8, 100% below -16.6, where the value is 6e-8 and the result
0). Kimi Linear's gate multiplies the softplus by exp(A_log), so with a large A_log that error
is the decay's. Its `tanh` is (1 - e) / (1 + e) with e = exp(-2|x|), which cancels for small
|x| (1e-5 relative at |x| = 0.01, 100% at 1e-4). Both are written here from exp and log alone
(each accurate to 6e-8 relative over the float range on llvm). Goldberg's log(u) e / (u - 1),
u = 1 + e, is no use here: TVM's simplifier rewrites (1 + e) - 1 to e.

    softplus(y) = max(y, 0) + log1p(exp(-|y|)), and for e = exp(-|y|) in (0, 1]
                  log1p(e) = 2 atanh(s) = 2 s (1 + s^2/3 + ... + s^16/17), s = e / (2 + e) <= 1/3
                  (every term positive, so no cancellation; truncation below 3e-10 relative)
    tanh(x)     = sign(x) (1 - e) / (1 + e), e = exp(-2|x|), and for |x| < 1/4, where that
                  cancels, the odd Taylor series to x^11 (relative error below 1e-9 there)
"""

from __future__ import annotations

from tvm import relax

R = relax.op
_TANH_TAYLOR = (1.0, -1.0 / 3, 2.0 / 15, -17.0 / 315, 62.0 / 2835, -1382.0 / 155925)


def log1p_exp_neg_abs(y, c):
    """log(1 + exp(-|y|)) to a few ulp of its value, for every y."""
    e = R.exp(R.negative(R.abs(y)))
    s = R.divide(e, R.add(c(2.0), e))
    s2 = R.multiply(s, s)
    p = c(1.0 / 17)
    for k in range(15, 0, -2):
        p = R.add(R.multiply(p, s2), c(1.0 / k))
    return R.multiply(R.multiply(c(2.0), s), p)


def softplus(x, beta: float, threshold: float, dtype: str):
    """torch's softplus: x where beta x > threshold, else log(1 + exp(beta x)) / beta."""
    def c(v):
        return relax.const(v, dtype)

    y = R.multiply(x, c(beta))
    soft = R.divide(R.add(R.maximum(y, c(0.0)), log1p_exp_neg_abs(y, c)), c(beta))
    return R.where(R.greater(y, c(threshold)), x, soft)


def tanh(x, dtype: str):
    def c(v):
        return relax.const(v, dtype)

    a = R.abs(x)
    e = R.exp(R.multiply(c(-2.0), a))
    far = R.divide(R.subtract(c(1.0), e), R.add(c(1.0), e))
    a2 = R.multiply(a, a)
    p = c(_TANH_TAYLOR[-1])
    for k in reversed(_TANH_TAYLOR[:-1]):
        p = R.add(R.multiply(p, a2), c(k))
    t = R.where(R.less(a, c(0.25)), R.multiply(a, p), far)
    return R.where(R.less(x, c(0.0)), R.negative(t), t)
