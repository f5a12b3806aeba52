"""What the BF16 compute policy changes against float32 compute on the same weights.

`k3c diff --compute bf16` checks each backend against the eager policy
(models.precision.bf16_policy); this module measures how far that policy is from float32
compute (models.precision.fp32_copy), in eager PyTorch, on the same inputs:

- per block: the relative RMS distance of the residual stream after each layer (the input of
  the next layer's first norm; the final norm's input after the last layer);
- routing: per MoE layer, the top-k expert ids of each token compared as sets, slot by slot
  (a token whose sets share k - 1 ids has one slot that disagrees); at each token that
  disagrees, the float32 run's gap between its k-th and (k+1)-th biased score, in units of
  BF16's resolution at that score (one ulp: a gap below a few ulps is a near tie);
- greedy generation: the tokens of both runs from one prompt, how many agree position by
  position and where they first differ.
"""

from __future__ import annotations

import math
import types
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from .models.moe_layer import MoE
from .models.precision import bf16_policy, fp32_copy, moe_blocks
from .numerics import rel_rms_err


def _layer_inputs(model: nn.Module) -> list[nn.Module]:
    """The norms whose inputs are the residual stream after each layer: the first norm of
    layers 1.. and the final norm."""
    layers = list(model.model.layers)
    return [layer.input_layernorm for layer in layers[1:]] + [model.model.norm]


@dataclass
class Routing:
    """One MoE layer's decisions on N tokens: ids [N, k] and biased scores [N, E]."""

    ids: torch.Tensor
    scores: torch.Tensor


def _route(self: MoE, x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MoE.route that records the model's own decision and biased scores, and takes its ids
    from `self.forced` (a queue shared by the model's MoE blocks, in call order) when there is
    one: the combine weights are then the model's own scores at the forced ids."""
    own, w = MoE.route(self, x2)
    s = torch.sigmoid(F.linear(x2.float(), self.gate.weight.float()))
    self.recorded.append(Routing(own.detach().clone(), (s + self.gate.e_score_correction_bias.float()).detach()))
    if self.forced is None:
        return own, w
    idx = self.forced.pop(0).to(own.device).long()
    w = s.gather(-1, idx)
    if self.renormalize:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return idx, w * self.scaling


@contextmanager
def instrumented(model: nn.Module, forced: list[torch.Tensor] | None = None):
    """Within: every routing decision of `model` is appended to the list yielded (call order:
    layer by layer, call by call), and with `forced` each MoE block takes its ids from it."""
    recorded: list[Routing] = []
    moes = [m for _, m in moe_blocks(model)]
    for m in moes:
        m.recorded, m.forced = recorded, forced
        m.route = types.MethodType(_route, m)
    try:
        yield recorded
    finally:
        for m in moes:
            del m.route, m.recorded, m.forced


@torch.no_grad()
def trace(model: nn.Module, ids: torch.Tensor, forced: list[torch.Tensor] | None = None
          ) -> tuple[torch.Tensor, list[torch.Tensor], list[Routing]]:
    """Prefill `model` on `ids`: (logits, residual stream after each layer, routing per MoE
    layer), with the ids of `forced` when given."""
    hidden: list[torch.Tensor] = []
    handles = [m.register_forward_pre_hook(lambda mod, args: hidden.append(args[0].detach().clone()))
               for m in _layer_inputs(model)]
    try:
        with instrumented(model, forced) as routing:
            logits, _ = model.prefill(ids)
    finally:
        for h in handles:
            h.remove()
    return logits, hidden, routing


ROUTING = "routing."  # the names of the routing outputs a diff adds to each entry


def with_routing_outputs(graphs: dict) -> None:
    """Add the ids of every top-k (the routing decisions, in graph order: layer by layer) to
    the outputs of each entry, named ROUTING + i, after the entry's own outputs."""
    for g in graphs.values():
        tops = [n.outputs[1] for n in g.nodes if n.op == "topk"]
        g.outputs = g.outputs + [(f"{ROUTING}{i}", v) for i, v in enumerate(tops)]


def routing_check(own: list[Routing], taken: list[torch.Tensor]) -> dict:
    """A backend's routing (`taken`, ids [N, k] per decision in call order) against the
    eager policy's own decisions on the same inputs: slots that agree, and the eager gap (in
    BF16 ulps) at each token whose ids differ. `ok`: every difference is a near tie."""
    if len(own) != len(taken):
        raise ValueError(f"{len(taken)} routing outputs for {len(own)} MoE calls of the eager model")
    slots = agreeing = 0
    gaps: list[float] = []
    for r, ids in zip(own, taken):
        slots += ids.numel()
        agreeing += slots_agreeing(r.ids, ids)
        gaps.extend(flip_gaps(r, Routing(ids, r.scores)))
    return {"slots": slots, "agreeing": agreeing, "share": agreeing / slots if slots else 1.0,
            "gaps_ulps": gaps, "ok": all(g < NEAR_TIE_ULPS for g in gaps)}


def slots_agreeing(a: torch.Tensor, b: torch.Tensor) -> int:
    """Of the (token, slot) decisions in ids a and b [N, k], how many agree: per token, the
    number of ids the two sets share."""
    same = (a[:, :, None] == b[:, None, :]).any(-1)
    return int(same.sum())


# A routing decision two evaluations of the policy may take differently: its k-th and (k+1)-th
# biased scores less than this many BF16 ulps (of the k-th) apart. A score's change grows
# linearly with its input's: on one routing, the policy in float32 and in float64 (1.7e-2 apart
# at most, k3c.numerics.BF16_COMPUTE) take different decisions where the gap is 0.01 to 4.8
# ulps (k3-tiny, kimi-linear-tiny, 2 x 130 tokens, seeds 0 and 1); a backend within the row
# (7e-2) may move a score 7 / 1.7 times as far: 4.8 x 4.1 = 20 -> 24.
NEAR_TIE_ULPS = 24.0


def margins(r: Routing) -> torch.Tensor:
    """[N]: each token's gap between its k-th and (k+1)-th biased score, in BF16 ulps of the
    k-th (inf when every expert is chosen)."""
    k = r.ids.shape[1]
    if k >= r.scores.shape[1]:
        return torch.full((r.scores.shape[0],), math.inf)
    top = r.scores.topk(k + 1, dim=-1).values
    return (top[:, k - 1] - top[:, k]) / bf16_ulp(top[:, k - 1])


def bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    """BF16's resolution at |x|: the spacing of BF16 numbers there (8 significant bits)."""
    e = torch.floor(torch.log2(x.abs().clamp_min(torch.finfo(torch.float32).tiny)))
    return torch.exp2(e - 7)


def flip_gaps(a: Routing, b: Routing) -> list[float]:
    """At each token whose id sets differ, run a's gap between its k-th and (k+1)-th biased
    score, in BF16 ulps of the k-th score."""
    gaps = margins(a)
    differ = ~(a.ids.sort(-1).values == b.ids.sort(-1).values).all(-1)
    return [float(g) for g in gaps[differ]]


@torch.no_grad()
def greedy(model: nn.Module, prompt: torch.Tensor, steps: int) -> list[int]:
    """`steps` greedy tokens after `prompt` [1, T] (prefill, then one decode step a token)."""
    logits, state = model.prefill(prompt)
    out = [int(logits[0, -1].argmax())]
    for _ in range(steps - 1):
        logits, state = model.decode(torch.tensor([[out[-1]]]), state)
        out.append(int(logits[0, -1].argmax()))
    return out


def agreement(a: list[int], b: list[int]) -> tuple[int, int | None]:
    """(positions where the two token lists agree, the first position where they differ)."""
    same = sum(x == y for x, y in zip(a, b))
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return same, first


@dataclass
class PolicyReport:
    """The BF16 policy against float32 compute on the same weights (see the module doc)."""

    prefill_len: int
    logits_rel_rms: float
    blocks_rel_rms: list[float] = field(default_factory=list)
    routing_slots: int = 0
    routing_agreeing: int = 0
    routing_per_layer: list[float] = field(default_factory=list)
    flip_gaps_ulps: list[float] = field(default_factory=list)
    greedy_tokens: int = 0
    greedy_agreeing: int = 0
    greedy_first_divergence: int | None = None

    @property
    def routing_share(self) -> float:
        return self.routing_agreeing / self.routing_slots if self.routing_slots else 1.0

    def to_json(self) -> dict:
        return {**asdict(self), "routing_share": self.routing_share}

    def table(self) -> str:
        from .diff import format_table

        rows = [("BF16 policy vs fp32 compute", "value")]
        rows.append(("prefill logits rel RMS", f"{self.logits_rel_rms:.2e}"))
        rows.extend((f"  after layer {i}", f"{e:.2e}") for i, e in enumerate(self.blocks_rel_rms))
        if self.routing_slots:
            rows.append(("routing slots agreeing", f"{self.routing_agreeing}/{self.routing_slots}"
                         f" ({100 * self.routing_share:.2f}%)"))
            rows.extend((f"  MoE layer {i}", f"{100 * s:.2f}%") for i, s in enumerate(self.routing_per_layer))
            if self.flip_gaps_ulps:
                gaps = sorted(self.flip_gaps_ulps)
                rows.append(("tokens that flip: fp32 gap in BF16 ulps",
                             f"{len(gaps)}: min {gaps[0]:.2g}, median {gaps[len(gaps) // 2]:.2g}, max {gaps[-1]:.2g}"))
        if self.greedy_tokens:
            at = self.greedy_first_divergence
            first = "none differ" if at is None else f"first differs at {at}"
            rows.append((f"greedy {self.greedy_tokens} tokens agreeing", f"{self.greedy_agreeing} ({first})"))
        return format_table(rows)


def compare_policies(model: nn.Module, ids: torch.Tensor, greedy_tokens: int = 128,
                     policy: nn.Module | None = None, reference: nn.Module | None = None) -> PolicyReport:
    """Measure `policy` (default bf16_policy(model)) against `reference` (default
    fp32_copy(model)) on the prefill of `ids` [B, T], and greedy generation of `greedy_tokens`
    from the first sequence's first 8 tokens (0: no generation)."""
    policy = bf16_policy(model) if policy is None else policy
    reference = fp32_copy(model) if reference is None else reference
    lp, hp, rp = trace(policy, ids)
    lf, hf, rf = trace(reference, ids)
    rep = PolicyReport(ids.shape[1], rel_rms_err(lp, lf), [rel_rms_err(a, b) for a, b in zip(hp, hf)])
    for a, b in zip(rf, rp):
        agree = slots_agreeing(a.ids, b.ids)
        rep.routing_slots += a.ids.numel()
        rep.routing_agreeing += agree
        rep.routing_per_layer.append(agree / a.ids.numel())
        rep.flip_gaps_ulps.extend(g for g in flip_gaps(a, b) if math.isfinite(g))
    if greedy_tokens:
        prompt = ids[:1, :8]
        gp, gf = greedy(policy, prompt, greedy_tokens), greedy(reference, prompt, greedy_tokens)
        rep.greedy_tokens = greedy_tokens
        rep.greedy_agreeing, rep.greedy_first_divergence = agreement(gp, gf)
    return rep
