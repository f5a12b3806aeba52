"""Recurrent-state ops: pure functions of (inputs, state) -> (outputs, new state).

Shapes follow fla: q, k [B, T, H, K], v [B, T, H, V], state [B, H, K, V] fp32. The
references are the recurrent definitions in k3c.kernels; the chunked forms are what the
chunk-delta-rule pass rewrites these into.
"""

from __future__ import annotations

import math

from ...kernels.delta.chunk import eager_chunk_size
from ...kernels.delta_rule.naive import naive_recurrent_delta_rule
from ...kernels.gated_delta_rule.naive import naive_recurrent_gated_delta_rule
from ...kernels.kda.naive import naive_recurrent_kda
from ...kernels.linear_attention.naive import naive_recurrent_linear_attention
from ...kernels.short_conv.naive import naive_short_conv
from .. import dims as D
from ..types import TensorType
from .delta_family import DeltaForm
from .spec import attr, defop, expect


def _same_dims(a, b) -> bool:
    return len(a) == len(b) and all(D.equal(x, y) for x, y in zip(a, b))


def _fmt(shape) -> str:
    return "[" + ", ".join(D.to_str(d) for d in shape) + "]"


def check_qkv(q: TensorType, k: TensorType, v: TensorType) -> tuple:
    expect(q.rank == 4, "qkv-shape", f"q must be [B, T, H, K], got {q}")
    expect(k.same_as(q.with_dtype(k.dtype)), "qkv-shape", f"k {k} must have q's shape {_fmt(q.shape)}")
    expect(v.rank == 4 and _same_dims(v.shape[:3], q.shape[:3]), "qkv-shape",
           f"v must be [B, T, H, V] with q's B, T, H; got {v} for q {q}")
    B, T, H, K = q.shape
    return B, T, H, K, v.shape[3]


def check_state(state: TensorType, expected: tuple, what: str = "state") -> None:
    expect(state.dtype == "f32", "state-dtype", f"{what} must be f32, got {state.dtype}")
    expect(_same_dims(state.shape, expected), "state-shape",
           f"{what} must be f32{_fmt(expected)}, got {state}")


SCALE = {"scale": attr("float", lo=0, lo_open=True)}


def _eager(kernel: str):
    """The eager implementation: chunked in prefill, the recurrence for one step."""
    def run(q, k, v, *rest, scale):
        from ... import kernels

        *gates, state = rest
        return getattr(kernels, kernel)(q, k, v, *gates, scale=scale, initial_state=state,
                                        chunk_size=eager_chunk_size(q.shape[1]))
    return run


# The delta family: each member's gate kind is its DeltaForm (delta_family.py), which also
# gives its inputs, shape rule, cost and families.
_KDA, _GATED, _DELTA, _LINEAR = (DeltaForm(g) for g in ("channel", "head", "none", "linear"))
defop("kda", _KDA.inputs, _KDA.outputs, delta=_KDA,
      ref=lambda q, k, v, g, beta, state, scale: naive_recurrent_kda(q, k, v, g, beta, scale, state),
      eager=_eager("kda"), doc="KDA: S = diag(exp g_t) S; S += beta_t k_t (v_t - k_t^T S)^T; o_t = scale q_t^T S")
defop("gated_delta_rule", _GATED.inputs, _GATED.outputs, delta=_GATED,
      ref=lambda q, k, v, g, beta, state, scale: naive_recurrent_gated_delta_rule(q, k, v, g, beta, scale,
                                                                                   state),
      eager=_eager("gated_delta_rule"), doc="KDA with one decay per head: g [B, T, H]")
defop("delta_rule", _DELTA.inputs, _DELTA.outputs, delta=_DELTA,
      ref=lambda q, k, v, beta, state, scale: naive_recurrent_delta_rule(q, k, v, beta, scale, state),
      eager=_eager("delta_rule"), doc="DeltaNet: KDA without decay")


def _linear_ref(q, k, v, state, z, scale):
    o, (S, zz) = naive_recurrent_linear_attention(q, k, v, scale, (state, z))
    return o, S, zz


def _linear_eager(q, k, v, state, z, scale):
    from ...kernels import linear_attention

    o, (S, zz) = linear_attention(q, k, v, scale=scale, initial_state=(state, z),
                                  chunk_size=eager_chunk_size(q.shape[1]))
    return o, S, zz


defop("linear_attention", _LINEAR.inputs, _LINEAR.outputs, delta=_LINEAR, ref=_linear_ref, eager=_linear_eager,
      doc="S += k_t v_t^T; z += k_t; o_t = q_t^T S / q_t^T z")


def _conv_infer(x, w, state, *, activation) -> list[TensorType]:
    expect(x.rank == 3, "conv-shape", f"short_conv input must be [B, T, C], got {x}")
    expect(w.rank == 2 and D.equal(w.shape[0], x.shape[2]), "conv-shape",
           f"short_conv weight must be [C, W] with C = {D.to_str(x.shape[2])}, got {w}")
    expected = (x.shape[0], x.shape[2], D.normalize(w.shape[1] - 1))
    expect(_same_dims(state.shape, expected), "state-shape",
           f"conv state must be {x.dtype}{_fmt(expected)}, got {state}")
    return [x, state]


def _conv_ref(x, w, state, activation):
    y, s = naive_short_conv(x, w, state, None if activation == "none" else activation)
    return y, s.to(state.dtype)


defop("short_conv", "x w state", "y state_out", attrs={"activation": attr("str", "none", choices=("none", "silu"))},
      infer=_conv_infer, ref=_conv_ref, eager=True, families="recurrent",
      flops=lambda ins, outs, a: (2 * ins[1][1] + 2) * math.prod(ins[0]),
      doc="causal depthwise conv over [state ++ x]; state = last W-1 inputs")
