"""Elementwise forms that keep their relative accuracy for every input, in standard ONNX ops.

onnxruntime's CPU `Sigmoid` is accurate in absolute terms (1.4e-7) but not in relative ones
for negative inputs: 2e-4 of the value at x = -10, 17% at -15, exactly 0 from -18 down, while
the value itself is 4.5e-5, 3e-7, 1.5e-8 (torch and onnx's reference evaluator: 1e-7 relative).
Where a sigmoid is renormalised (the MoE router divides each routed score by their sum) that
relative error becomes the error of the weights. `Exp` is accurate to 7e-8 relative over the
whole float range, so the sigmoid is written through it, with an exponent that is never
positive (nothing overflows):

    e = exp(-|x|);  sigmoid(x) = 1 / (1 + e) for x >= 0,  e / (1 + e) for x < 0

written as one correctly rounded division of Where(x < 0, e, 1) by 1 + e (seven nodes).
"""

from __future__ import annotations


def sigmoid(b, x: str, dtype: str, outputs: list[str] | None = None) -> str:
    e = b.Exp(b.Neg(b.Abs(x)))
    top = b.Where(b.Less(x, b.const(0.0, dtype)), e, b.const(1.0, dtype))
    return b.Div(top, b.Add(b.const(1.0, dtype), e), **({"outputs": outputs} if outputs else {}))
