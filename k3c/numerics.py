"""The one tolerance table, how a comparison derives its tolerance, and the error measures.

Long recurrences accumulate rounding, so a comparison checks both the worst element
(max-abs, scaled by the reference's magnitude) and the relative RMS error
`rms(a - b) / rms(b)`.

Where each tolerance comes from. Two evaluations of one computation in a dtype with unit
roundoff u that differ only in the order of their roundings (another reduction tree, a
chunked instead of a recurrent form, a fused epilogue) differ by about kappa sqrt(n) u in
relative RMS: n the longest chain of roundings (a reduction's length), kappa the condition
of the computation (how much it amplifies a relative change of its inputs).

- `TOLERANCES[dtype]`: one op, or a kernel against its definition, at the sizes the tests
  use; each row says why it is what it is.
- `model_tolerance`: a whole model (k3c diff). Its kappa sqrt(n) u is not guessed: it is
  measured, as the distance between the eager model in its dtype and the same model in
  float64 (`noise`), and a backend may differ from eager by `MODEL_SAFETY_*` times that, and
  never by less than the dtype's row (see model_tolerance for why that floor is needed).
- `BF16_COMPUTE`: a backend under the BF16 compute policy against the eager policy, whole
  model, on one routing (measured like model_tolerance's noise; its comment says what it
  cannot tell apart).
- `BF16_STATE`: a backend holding the recurrent states in BF16 between calls against the eager
  model under the same policy, whole model, over a chain of calls (derived like BF16_COMPUTE).
- `elementwise_off`: an elementwise op given the reference's own inputs (the bisection): each
  element within `ELEMENTWISE_ULPS` u of the reference, in relative terms.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Tolerance:
    max_abs: float  # on |a - b| / max(1, max|b|)
    rel_rms: float  # on rms(a - b) / rms(b)


UNIT_ROUNDOFF: dict[torch.dtype, float] = {
    torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8,
}

# One row per dtype of the compared computation. rel_rms: kappa sqrt(n) u for the largest op
# the tests compare at this row, with 2.5x to spare; max_abs: the worst of ~1e5 elements of an
# error of that RMS is about 4.5 sigma, on values whose max is about 4 times their RMS.
TOLERANCES: dict[torch.dtype, Tolerance] = {
    # u = 1.1e-16. fp64 runs only the definitions against each other (the recurrent and the
    # chunked form of one op, T <= 130 steps of K = V <= 64): sqrt(130 * 64) u = 1e-14, with
    # kappa up to 40 under strong decay (the WY inverse) -> 4e-13 -> 1e-12.
    torch.float64: Tolerance(max_abs=1e-10, rel_rms=1e-12),
    # u = 6e-8. A recurrence of up to T = 130 steps over K, V <= 64 (the longest chain the op
    # tests run; their inputs are K = 32, V = 48) rounds along at most sqrt(130 * 64) = 91
    # steps: 5.4e-6 at kappa 1 -> 1e-5 allows kappa 1.8.
    torch.float32: Tolerance(max_abs=1e-4, rel_rms=1e-5),
    # u = 4.9e-4 (and bf16 u = 3.9e-3): the reduced-precision kernels keep fp32 state and
    # accumulate in fp32, so only the rounding of inputs and outputs to the narrow type counts,
    # about 10 u in RMS.
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
# The BF16 compute policy (compute="bf16": GEMM operands rounded to BF16, the rest float32) in a
# backend against the same policy in eager PyTorch (models.precision.bf16_policy), whole model,
# on one routing (the backend's; k3c diff). Derived like model_tolerance, from a measurement:
# the eager policy in float32 against the same policy in float64 (same roundings to BF16, same
# routing), k3-tiny (BF16 + MXFP4) and kimi-linear-tiny (BF16), B = 2, T = 130, seeds 0 and 1:
#   kimi-linear-tiny: logits 4.3e-3 / 4.8e-3 rel RMS (max 6.4e-3), states up to 5.4e-3 (max 6.3e-3);
#   k3-tiny:          logits 1.4e-2 / 1.2e-2 rel RMS (max 2.9e-2), states up to 1.7e-2 (max 2.7e-2).
# Why so far above float32's 1e-7: rounding to BF16 is a step function. Two evaluations whose
# inputs differ by a relative d put a share d / u of the elements on different sides of a
# rounding boundary, each then an ulp apart: about sqrt(d u) in RMS after one GEMM, so the
# difference climbs toward BF16's own u / sqrt(6) = 1.6e-3 per stage within a few layers.
# The row: MODEL_SAFETY_RMS x 1.7e-2 -> 7e-2 and MODEL_SAFETY_MAX x 2.9e-2 -> 0.24 (why those
# factors: below). What it cannot do: on these models the policy and float32 compute, on one
# routing, differ by 8e-3 to 1e-2 (kimi-linear-tiny) and 2.2e-2 (k3-tiny): inside the row. So a
# whole-model check at this row shows that a backend's BF16 compute is as close to the eager
# policy as two evaluations of that policy are to each other, not that it rounded where the
# policy rounds; tests/precision checks that per GEMM, on one block's inputs.
BF16_COMPUTE = Tolerance(max_abs=0.24, rel_rms=7e-2)
# The BF16 recurrent state (state_dtype="bf16": KDA / delta-rule states and conv tails rounded
# to BF16 when a call returns them, updated in float32) in a backend against the same policy in
# eager PyTorch (models.precision.BF16State), whole model, over a chain of calls. Derived like
# BF16_COMPUTE: the eager policy in float32 against the same policy in float64, k3-tiny and
# kimi-linear-tiny (float32 weights), B = 2, seeds 0 and 1, two chains: prefill 130 + extend 7
# + 8 decode steps, and a ragged prefill 13/9 (fixed caches) + extend 7 + 3 decode steps:
#   kimi-linear-tiny: logits up to 5.3e-4 rel RMS (max 6.4e-4), states up to 1.9e-3 (max 5.6e-3);
#   k3-tiny:          logits up to 3.1e-3 rel RMS (max 4.9e-3), states up to 2.5e-3 (max 7.2e-3);
# while without the policy the same float32 / float64 pairs differ by 1e-6 to 7e-6 (logits).
# Why: rounding to BF16 is a step function, so where the two evaluations differ by a relative
# d, a share d / u of the state's elements round to neighbouring BF16 values, an ulp (2^-8)
# apart; the next call starts from those states, and over the calls the gap climbs toward a
# BF16 rounding of the state (u / sqrt(6) = 1.6e-3). The row: MODEL_SAFETY_RMS x 3.1e-3 ->
# 1.25e-2 and MODEL_SAFETY_MAX x 7.2e-3 -> 5.8e-2. What it cannot do: the policy and float32
# states differ by 5e-3 to 1e-2 in logits on the short chain (more where a rounding flips a MoE
# routing decision), inside the row; so a whole-chain check shows a backend as close to the
# policy as two evaluations of it are, and tests/serving/test_state_dtype.py checks the sites
# per call: one call from a BF16 state at float32's model tolerance (widened where read, fp32
# inside), the returned state BF16 (rounded where returned).
BF16_STATE = Tolerance(max_abs=5.8e-2, rel_rms=1.25e-2)
# k3c diff: a backend and the eager model are two evaluations in one dtype, each off from the
# exact result by about the measured noise, so they differ by about sqrt(2) noise in RMS; the
# backend's algorithm may round along a different chain (chunked vs recurrent, blocked GEMMs),
# which changes the constant of kappa sqrt(n) u by up to 2: 2 sqrt(2) -> 4. The worst element
# is a tail statistic (its spread over 1e4 to 1e6 elements): twice the RMS factor.
MODEL_SAFETY_RMS = 4.0
MODEL_SAFETY_MAX = 8.0
# One elementwise op on identical inputs: IEEE's +, -, *, /, sqrt are correctly rounded (0.5 u);
# the transcendental functions of onnxruntime, TVM and Triton measure within 5 u of float64 over
# the float range (tests/numerics/test_elementwise.py); compositions (silu = x sigmoid(x),
# softplus's threshold) add two roundings. 16 u leaves 3x; a 1e-4 relative error (onnxruntime's
# Sigmoid at x = -10) is 1700 u.
ELEMENTWISE_ULPS = 16.0
SMALLEST_NORMAL: dict[torch.dtype, float] = {dt: float(torch.finfo(dt).tiny) for dt in UNIT_ROUNDOFF}


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


def compare(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None,
            tolerance: Tolerance | None = None) -> Comparison:
    """Compare two tensors of one shape under `tolerance` (default: the row of `dtype`, or of
    expected's dtype)."""
    if tuple(actual.shape) != tuple(expected.shape):
        raise ValueError(f"shape mismatch: {tuple(actual.shape)} vs {tuple(expected.shape)}")
    tol = tolerance or TOLERANCES.get(dtype or expected.dtype, TOLERANCES[torch.float32])
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


def model_tolerance(eager: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype | None = None) -> Tolerance:
    """The tolerance of a backend against `eager` for one output of a whole model: the safety
    factors times the noise of `eager` (the model in its dtype) against `exact` (the same
    model in float64), and at least the dtype's row.

    The float64 copy is float64 throughout (k3c/yardstick.py): the models' deliberate fp32
    casts (norms, the router, gates, new states, inside the k3c ops too) stay float64 there.
    Before it did, those fp32 islands were shared by the two runs, their rounding was missed,
    and where it is amplified (the router at low scores: a sigmoid of a large negative score
    has a condition of |x|) the measured noise was too low and a correct backend failed.

    Why the floor: the noise is measured on one input, and a tensor whose error happens to
    cancel there (a few elements, a state the step barely changed) would get a tolerance
    below what one op of a different but equally good rounding chain differs by; the row,
    kappa sqrt(n) u of one op, is that at least."""
    row = TOLERANCES.get(dtype or eager.dtype, TOLERANCES[torch.float32])
    return Tolerance(max_abs=max(row.max_abs, MODEL_SAFETY_MAX * scaled_max_abs_err(eager, exact)),
                     rel_rms=max(row.rel_rms, MODEL_SAFETY_RMS * rel_rms_err(eager, exact)))


def elementwise_off(actual: torch.Tensor, expected: torch.Tensor) -> tuple[bool, float]:
    """(off, worst relative error): each element of an elementwise op's result within
    `ELEMENTWISE_ULPS` u of the reference's, relative to its own magnitude. Differences below
    the smallest normal number do not count: a backend may flush subnormals to zero, or keep
    one where torch's form underflowed (1 / (1 + exp(88.7)) is 0, the sigmoid is 2.9e-39)."""
    if not expected.is_floating_point() or not expected.numel():
        return False, 0.0
    dt = expected.dtype
    u, tiny = UNIT_ROUNDOFF.get(dt, UNIT_ROUNDOFF[torch.float32]), SMALLEST_NORMAL.get(dt, 1.2e-38)
    a, b = actual.detach().double(), expected.detach().double()
    diff = (a - b).abs()
    same = (a == b) | (torch.isnan(a) & torch.isnan(b)) | (diff <= tiny)
    err = torch.where(same, torch.zeros_like(a), diff / b.abs())
    worst = float(err.max())
    return not worst <= ELEMENTWISE_ULPS * u, worst
