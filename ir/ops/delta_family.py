"""The delta-rule family's varying facts, carried on each member's spec (`OpSpec.delta`).

Every member computes, per token t and head, with a state S [K, V] fp32:

    S = diag(exp g_t) S                      decay: the gate kind says which g, if any
    S = S + beta_t k_t (v_t - k_t^T S)^T     the delta correction (beta form), or S += k_t v_t^T
    o_t = scale q_t^T S                      or, with the normaliser z += k_t, o_t = q_t^T S / q_t^T z

and differs from the others only in these facts, all read from its `DeltaForm`:

    gate      inputs                  g (a log-decay, <= 0)   beta        normaliser z
    channel   q k v g beta state      [B, T, H, K]            [B, T, H]   -
    head      q k v g beta state      [B, T, H]               [B, T, H]   -
    none      q k v beta state        -                       [B, T, H]   -
    linear    q k v state z           -                       -           [B, H, K]

Declaring a member is one `defop(name, form.inputs, form.outputs, delta=DeltaForm(gate),
ref=...)`: the shapes, the cost rule, the families and the `scale` attribute come from the
form (spec.py), the chunk-delta-rule pass and every backend's family lowering read the form,
so a new op of an existing gate kind reaches every backend through the family's own kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import UsageError
from .. import dims as D
from ..types import TensorType

GATE_KINDS = ("channel", "head", "none", "linear")
FAMILY = "delta_family"
FAMILIES = f"recurrent {FAMILY}"
# FLOPs per (token, head, key channel, value channel): the state update and read
_FLOPS = {"channel": 7, "head": 7, "none": 6, "linear": 4}


@dataclass(frozen=True)
class DeltaForm:
    """The gate kind of a delta-family op; the beta form, the normaliser and the decay follow
    from it (the table of this module's docstring)."""

    gate: str

    def __post_init__(self) -> None:
        if self.gate not in GATE_KINDS:
            raise UsageError(f"delta gate kind must be one of {', '.join(GATE_KINDS)}, got {self.gate!r}")

    @property
    def decays(self) -> bool:
        """Whether the op has a log-decay input `g` (<= 0: the TVM and Triton kernels assume it)."""
        return self.gate in ("channel", "head")

    @property
    def beta(self) -> bool:
        """Whether the op has the delta correction with a per-head `beta` [B, T, H]."""
        return self.gate != "linear"

    @property
    def normaliser(self) -> bool:
        """Whether the op carries linear attention's normaliser state `z` [B, H, K]."""
        return self.gate == "linear"

    @property
    def inputs(self) -> str:
        if self.normaliser:
            return "q k v state z"
        return "q k v " + ("g " if self.decays else "") + "beta state"

    @property
    def outputs(self) -> str:
        return "o state_out z_out" if self.normaliser else "o state_out"

    def g_shape(self, B, T, H, K) -> tuple:
        return (B, T, H, K) if self.gate == "channel" else (B, T, H)

    def decay_width(self, K):
        """How many decays a (token, head) has: K per channel, else 1 (one per head, or none)."""
        return K if self.gate == "channel" else 1

    @property
    def flops_per_kv(self) -> int:
        return _FLOPS[self.gate]


def _same_dims(a, b) -> bool:
    return len(a) == len(b) and all(D.equal(x, y) for x, y in zip(a, b))


def _fmt(shape) -> str:
    return "[" + ", ".join(D.to_str(d) for d in shape) + "]"


def infer(form: DeltaForm):
    """The shape rule of a member: q, k [B, T, H, K], v [B, T, H, V], the gate and beta of its
    form, state [B, H, K, V] fp32 (and z [B, H, K] fp32) -> o [B, T, H, V] and the new state."""
    from .recurrent import check_qkv, check_state
    from .spec import expect

    def run(q, k, v, *rest, scale) -> list[TensorType]:
        x = dict(zip(form.inputs.split()[3:], rest))
        B, T, H, K, V = check_qkv(q, k, v)
        if form.decays:
            want = form.g_shape(B, T, H, K)
            expect(_same_dims(x["g"].shape, want), "gate-shape", f"g must be {_fmt(want)}, got {x['g']}")
        if form.beta:
            expect(_same_dims(x["beta"].shape, (B, T, H)), "beta-shape",
                   f"beta must be {_fmt((B, T, H))}, got {x['beta']}")
        check_state(x["state"], (B, H, K, V))
        outs = [v.with_shape((B, T, H, V)), x["state"]]
        if form.normaliser:
            check_state(x["z"], (B, H, K), "normaliser z")
            outs.append(x["z"])
        return outs
    return run


def flops(form: DeltaForm):
    def count(ins, outs, a) -> int:
        B, T, H, K = ins[0]
        return form.flops_per_kv * B * T * H * K * ins[2][3]
    return count


def members() -> dict[str, DeltaForm]:
    """op -> its form, for every declared member (ops declared after import included)."""
    from .spec import OPS

    return {op: s.delta for op, s in OPS.items() if s.delta is not None}


__all__ = ["DeltaForm", "GATE_KINDS", "FAMILY", "members"]
