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

# BF16 compute against fp32 on the same (bf16-valued) weights and the same inputs, for one
# block (a token mixer, an MLP or MoE block, an AttnRes mix; routing cannot flip there: the
# router is fp32 on identical inputs). Why it is what it is:
#   one rounding to bf16 (8 significant bits, u = 2^-8) errs by about u / sqrt(6) = 1.6e-3
#   relative RMS (uniform over an ulp, weighted by 1/|x| across a binade; 1.66e-3 measured
#   on Gaussian data): take 1.7e-3;
#   a block rounds at most 16 times in sequence (every op's output is cast back to bf16;
#   GEMMs accumulate in fp32 inside), and independent errors add in quadrature: 4 x 1.7e-3;
#   x 2 for ops whose gain exceeds one (SiTU / SiLU slopes up to 1.1, sigmoid gates, the
#   division of a norm): rel_rms 1.4e-2;
#   max_abs (scaled by max(1, max|b|)): an element's error is ~ rel_rms x rms(b), and the
#   largest of ~1e5 Gaussian errors is under 5 sigma: 5 x 1.4e-2 = 7e-2.
# A stack of n blocks (a dense model end to end) adds n such errors: `bf16_vs_fp32(n)`,
# sqrt(n) times the row. Measured (k3-tiny, kimi-linear-tiny, T = 130): 3.6e-3 to 5.6e-3 a
# block; whole dense models 5e-3 (gpt2-tiny, 4 blocks) to 3.2e-2 (k3-tiny, 18 blocks + 19 mixes).
BF16_VS_FP32 = Tolerance(max_abs=7e-2, rel_rms=1.4e-2)


def bf16_vs_fp32(blocks: int = 1) -> Tolerance:
    """The BF16_VS_FP32 row for `blocks` blocks in sequence (errors add in quadrature)."""
    k = max(1, blocks) ** 0.5
    return Tolerance(max_abs=BF16_VS_FP32.max_abs * k, rel_rms=BF16_VS_FP32.rel_rms * k)


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
