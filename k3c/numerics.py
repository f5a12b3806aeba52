"""The one tolerance table, and the error measures every comparison in k3c uses.

Long recurrences accumulate rounding, so a comparison checks both the worst element
(max-abs, scaled by the reference's magnitude) and the relative RMS error
`rms(a - b) / rms(b)`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Tolerance:
    max_abs: float  # on |a - b| / max(1, max|b|)
    rel_rms: float  # on rms(a - b) / rms(b)


# One row per dtype of the compared computation.
TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float64: Tolerance(max_abs=1e-10, rel_rms=1e-12),
    torch.float32: Tolerance(max_abs=1e-4, rel_rms=1e-5),
    torch.float16: Tolerance(max_abs=2e-2, rel_rms=5e-3),
    torch.bfloat16: Tolerance(max_abs=6e-2, rel_rms=2e-2),
}


def max_abs_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().double() - b.detach().double()).abs().max()) if a.numel() else 0.0


def scaled_max_abs_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max(1, max |b|): absolute for O(1) values, relative for large ones
    (a linear-attention state sums T outer products and grows with T)."""
    if not a.numel():
        return 0.0
    return max_abs_err(a, b) / max(1.0, float(b.detach().double().abs().max()))


def rel_rms_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """rms(a - b) / rms(b); 0 when both are zero, inf when only b is."""
    if a.numel() == 0:
        return 0.0
    a, b = a.detach().double(), b.detach().double()
    num = (a - b).pow(2).mean().sqrt()
    den = b.pow(2).mean().sqrt()
    if den == 0:
        return 0.0 if num == 0 else float("inf")
    return float(num / den)


@dataclass(frozen=True)
class Comparison:
    max_abs_err: float
    rel_rms_err: float
    finite: bool
    ok: bool


def compare(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None) -> Comparison:
    """Compare two tensors of one shape under the table row of `dtype` (default: expected's)."""
    if tuple(actual.shape) != tuple(expected.shape):
        raise ValueError(f"shape mismatch: {tuple(actual.shape)} vs {tuple(expected.shape)}")
    tol = TOLERANCES.get(dtype or expected.dtype, TOLERANCES[torch.float32])
    finite = bool(torch.isfinite(actual).all()) if actual.is_floating_point() else True
    mae, rr = max_abs_err(actual, expected), rel_rms_err(actual, expected)
    ok = finite and scaled_max_abs_err(actual, expected) <= tol.max_abs and rr <= tol.rel_rms
    return Comparison(mae, rr, finite, ok)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None,
                 what: str = "") -> Comparison:
    """Raise AssertionError with both measures when `actual` is off; return the comparison."""
    c = compare(actual, expected, dtype)
    if not c.ok:
        raise AssertionError(
            f"{what or 'tensor'} off: max_abs_err={c.max_abs_err:.3e} rel_rms_err={c.rel_rms_err:.3e}"
            f" finite={c.finite}")
    return c
