"""`k3c diff --stress NAME`: the comparison at weights the seeded defaults never reach.

Each stress edits a copy of the model's weights so that one numerically delicate path is
taken everywhere, and the diff then runs as usual: a backend whose elementwise forms or
kernels lose accuracy there is off. The stresses:

- router-low: two experts forced into every token's top-k by a +100 score bias, their router
  rows scaled by 40, so their sigmoid scores are tiny and the router's renormalisation
  (w / sum w) turns a relative error of the sigmoid into an error of the expert weights;
- strong-decay: the gate biases shifted (+10 into softplus, sigmoid gates at their lower bound),
  so each step decays the state by up to e^-5 per channel (k3) or more (softplus gates):
  exponents of a chunk far below the float range, where only pairwise forms stay finite;
- large-a-log: A_log raised by log(100) and the softplus input shifted by -12, so the decay
  is exp(A_log) times a softplus of very negative arguments: its relative accuracy is what counts;
- spiky-gates: A_log set to log(1000), the gate input projection x8 and its bias set to -8,
  so most steps decay by ~0.3 and some by hundreds: chunk cumulative sums reach -1e4 while the
  decay between two later tokens stays small, which a chunked form that takes it as a
  difference of cumulative sums loses (cancellation), and an exact one keeps;
- situ-saturated: gate and up projections of every SiTU MLP scaled by 20, so tanh saturates
  and sigmoid(gate) runs down to its tiny negative tail;
- router-ties: the router rows and score biases of experts 0-2 and 3-5 made equal, so tokens
  meet exact ties among three experts for two slots and every backend must break them as the
  eager model does (the lower index first).

One stress edits inputs, not weights: garbage-capacity (k3c/stress_capacity.py) runs serving
artifacts with NaN, inf and huge values in every cache row no sequence uses, and other ids in
the padding of ragged prompts, against the same calls run clean.
"""

from __future__ import annotations

import copy
import math

import torch

from .errors import UsageError


def _routers(model):
    from .models.moe_layer import Router

    return [m for m in model.modules() if isinstance(m, Router)]


def _gates(model):
    """(module, kind) of every decay gate: kind "softplus" or "sigmoid"."""
    from .models.kda_layer import KDAMixer
    from .models.linear_lm import LinearMixer

    out = []
    for m in model.modules():
        if isinstance(m, KDAMixer):
            out.append((m, m.gate))
        elif isinstance(m, LinearMixer) and m.kind == "gated_deltanet":
            out.append((m, "softplus"))
    return out


def _situ_mlps(model):
    """(gate/up weight tensors) of every SiTU MLP: routed experts' w13 and dense/shared MLPs."""
    from .models.common import GatedMLP
    from .models.moe_layer import MoE

    out = []
    for m in model.modules():
        if isinstance(m, GatedMLP) and m.act == "situ":
            out += [m.gate_proj.weight, m.up_proj.weight]
        elif isinstance(m, MoE) and m.act == "situ":
            out.append(m.experts.w13)
    return out


def _router_low(model) -> str:
    for r in _routers(model):
        r.e_score_correction_bias[:2] += 100.0
        r.weight[:2] *= 40.0
    return "two experts forced into every top-k, router rows x40"


def _strong_decay(model) -> str:
    for m, kind in _gates(model):
        m.dt_bias += 10.0 if kind == "softplus" else 20.0  # sigmoid gates: at their lower bound
    return "gate biases +10 (softplus) / +20 (sigmoid)"


def _large_a_log(model) -> str:
    for m, kind in _gates(model):
        m.A_log += math.log(100.0)
        if kind == "softplus":
            m.dt_bias -= 12.0
    return "A_log + log(100), softplus inputs - 12"


def _spiky_gates(model) -> str:
    for m, _kind in _gates(model):
        m.A_log.fill_(math.log(1000.0))
        (m.f_b_proj if hasattr(m, "f_b_proj") else m.a_proj).weight.mul_(8.0)
        m.dt_bias.fill_(-8.0)
    return "A_log = log(1000), gate projection x8, gate bias -8"


def _situ_saturated(model) -> str:
    for w in _situ_mlps(model):
        w *= 20.0
    return "SiTU gate and up projections x20"


def _router_ties(model) -> str:
    for r in _routers(model):
        if r.weight.shape[0] < 6:
            raise UsageError("stress router-ties needs 6 or more routed experts")
        for lead in (0, 3):
            r.weight[lead + 1: lead + 3] = r.weight[lead]
            r.e_score_correction_bias[lead + 1: lead + 3] = r.e_score_correction_bias[lead]
    return "experts 0-2 and 3-5 with equal router rows and biases"


# name -> (what the model must have, its finder, the edit)
STRESSES = {
    "router-low": ("a MoE router", _routers, _router_low),
    "strong-decay": ("a decay gate (KDA or Gated DeltaNet)", _gates, _strong_decay),
    "large-a-log": ("a decay gate (KDA or Gated DeltaNet)", _gates, _large_a_log),
    "spiky-gates": ("a decay gate (KDA or Gated DeltaNet)", _gates, _spiky_gates),
    "situ-saturated": ("a SiTU MLP", _situ_mlps, _situ_saturated),
    "router-ties": ("a MoE router", _routers, _router_ties),
}


# stresses of the inputs: name -> what runs it
INPUT_STRESSES = {"garbage-capacity": "k3c.stress_capacity.garbage_capacity"}


def check(name: str) -> None:
    if name not in STRESSES and name not in INPUT_STRESSES:
        raise UsageError(f"unknown stress {name!r}; known: {', '.join([*STRESSES, *INPUT_STRESSES])}")


@torch.no_grad()
def stressed(model: torch.nn.Module, name: str) -> torch.nn.Module:
    """A copy of `model` with the weights of stress `name` (the model itself is untouched)."""
    check(name)
    if name in INPUT_STRESSES:
        raise UsageError(f"stress {name} edits the inputs, not the weights: run it with {INPUT_STRESSES[name]} "
                         f"(k3c diff --stress {name})")
    needs, find, edit = STRESSES[name]
    if not find(model):
        raise UsageError(f"stress {name} needs a model with {needs}; "
                         f"{getattr(model, 'name', type(model).__name__)} has none")
    out = copy.deepcopy(model)
    out.stress = edit(out)
    return out
