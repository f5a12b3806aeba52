"""Pieces every model of the zoo shares: the norm, the gated MLP, the LM base class.

A model maps `input_ids [B, T]` to logits `[B, T, vocab]`. Its recurrent state is a flat
dict of tensors named `layers.{i}.{name}`; `prefill` starts from no state and returns it,
`decode` takes one token per sequence and the state, and returns the new state.
"""

from __future__ import annotations

import inspect
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import InputError
from ..kernels.situ.naive import BETA, LINEAR_BETA, silu_glu, situ
from .serving import Seq, last_rows
from .validate import check_decode, check_prefill

State = dict[str, torch.Tensor]


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32 (`aten.rms_norm`, kept whole by the frontend)."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps)
        return y.to(x.dtype)


class GatedMLP(nn.Module):
    """down(act(gate(x), up(x))), act = SiTU (K3) or SiLU-GLU; no biases."""

    def __init__(self, dim: int, hidden: int, act: str = "silu", situ_beta: float = BETA,
                 situ_linear_beta: float | None = LINEAR_BETA):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)
        self.act, self.situ_beta, self.situ_linear_beta = act, situ_beta, situ_linear_beta

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(activate(self.gate_proj(x), self.up_proj(x), self.act,
                                       self.situ_beta, self.situ_linear_beta))


def activate(gate: torch.Tensor, up: torch.Tensor, act: str, beta: float,
             linear_beta: float | None) -> torch.Tensor:
    if act == "situ":
        return situ(gate, up, beta, linear_beta)
    if act == "silu":
        return silu_glu(gate, up)
    raise ValueError(f"unknown gated activation {act!r} (expected 'situ' or 'silu')")


class CausalLM(nn.Module):
    """Base of every model: `forward`, `prefill` and `decode` over `step`.

    Subclasses implement `step(input_ids, state, seq) -> (logits, new_state)`, where `state`
    is None for a fresh sequence and `seq` (models/serving.py) says which prompt tokens are
    real, where each sequence stands in a fixed-capacity cache, and whose logits are wanted.
    A model of one's own may implement `step(input_ids, state)`: it has the plain forms
    (prefill without lengths or max_context, decode with growing caches).

    prefill(ids, lengths=None, logits="all", max_context=None)
        lengths      int64 [B]: right-padded prompts, sequence b holds lengths[b] real tokens
        logits       "all" [B, T, vocab] or "last" [B, 1, vocab] (each sequence's last real token)
        max_context  N: every cache at full capacity [B, N, ...] and the state's `positions`
                     (int64 [B], the tokens each sequence holds); None: caches of T rows that
                     grow by one a step (the batch's sequences then share one length)
    decode(ids, state) takes either state; with `positions` it writes each sequence's row at
    its own position, so the sequences of a batch may stand at different positions.
    """

    config: object

    def step(self, input_ids: torch.Tensor, state: State | None,
             seq: Seq | None = None) -> tuple[torch.Tensor, State]:
        raise NotImplementedError

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        check_prefill(self, input_ids)
        return self.step(input_ids, None)[0]

    def prefill(self, input_ids: torch.Tensor, lengths: torch.Tensor | None = None, logits: str = "all",
                max_context: int | None = None, chunk: int | None = None) -> tuple[torch.Tensor, State]:
        if chunk is not None:  # pieces of `chunk` tokens (models/extend.py): the same result
            from .extend import check_chunk, prefill_chunked

            if check_chunk(chunk) < input_ids.shape[-1]:
                check_prefill(self, input_ids, lengths, logits, max_context)
                return prefill_chunked(
                    lambda ids, n: self.prefill(ids, lengths=n, max_context=max_context),
                    lambda ids, state, n: self.extend(ids, state, lengths=n), input_ids, chunk, lengths, logits)
        # an InputError names a bad id, length or capacity, or a length past the model's bound
        lengths = check_prefill(self, input_ids, lengths, logits, max_context)
        if len(inspect.signature(self.step).parameters) < 3:  # a model of its own: step(input_ids, state)
            if lengths is not None or max_context is not None:
                raise InputError(f"{getattr(self, 'name', type(self).__name__)}: lengths= and max_context= need "
                                 f"a step(input_ids, state, seq) (models/serving.py); this model's takes two")
            out, state = self.step(input_ids, None)
            return (out[:, -1:] if logits == "last" else out), state
        seq = Seq(lengths=lengths, max_context=max_context, last=logits == "last")
        out, state = self.step(input_ids, None, seq)
        if seq.fixed:
            state["positions"] = seq.held(*input_ids.shape, input_ids.device)
        return out, state

    def extend(self, input_ids: torch.Tensor, state: State, lengths: torch.Tensor | None = None,
               logits: str = "all") -> tuple[torch.Tensor, State]:
        """Continue `state` with T >= 1 tokens (models/extend.py): chunked prefill, prefix
        reuse, speculative verify. Decode is extend with T = 1."""
        from .extend import extend

        return extend(self, input_ids, state, lengths, logits)

    def decode(self, input_ids: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        check_decode(self, input_ids, state)  # ... or a state entry that is missing, foreign or misshapen
        positions = state.get("positions")
        if positions is None:
            return self.step(input_ids, state)
        out, new = self.step(input_ids, {k: v for k, v in state.items() if k != "positions"}, Seq(positions=positions))
        new["positions"] = positions + 1
        return out, new

    def logits_of(self, x: torch.Tensor, seq: Seq | None) -> torch.Tensor:
        """The lm_head, on each sequence's last real row only when `seq` asks for it."""
        return self.lm_head(last_rows(x, seq) if seq is not None and seq.last else x)


def sub_state(state: State | None, prefix: str) -> State | None:
    """The entries of `state` under `prefix` (without it), or None when there is no state."""
    if state is None:
        return None
    n = len(prefix)
    return {k[n:]: v for k, v in state.items() if k.startswith(prefix)}


def add_prefix(state: State, prefix: str) -> State:
    return {prefix + k: v for k, v in state.items()}


def _draw_order(name: str) -> str:
    # K3's final AttnRes mix was once named `model.attn_res_*`; it keeps that place in the
    # draw order, so that a seed gives the same weights as before the release name.
    return name.replace("model.output_attn_res_", "model.attn_res_", 1)


@torch.no_grad()
def init_weights(model: nn.Module, seed: int = 0) -> nn.Module:
    """Deterministic weights from `seed`, independent of the global RNG.

    Linear weights ~ N(0, 1/fan_in) keep activations O(1); norm weights are 1 + N(0, 0.1)
    and biases, pseudo-queries and router corrections are random too, so that no fold or
    fusion can pass a test by multiplying by one or adding zero. Parameters are visited by
    name, so the weights of a model do not depend on the order modules were built in.
    """
    gen = torch.Generator().manual_seed(seed)
    for name, p in sorted(model.named_parameters(), key=lambda kv: _draw_order(kv[0])):
        if p.is_meta or not p.is_floating_point():  # MXFP4 codes are encoded, not drawn
            continue
        leaf = name.rsplit(".", 1)[-1]
        shape = p.shape
        if leaf == "A_log":
            val = torch.empty(shape).uniform_(1.0, 16.0, generator=gen).log()
        elif leaf == "dt_bias":
            dt = torch.empty(shape).uniform_(math.log(1e-3), math.log(0.1), generator=gen).exp()
            val = dt + torch.log(-torch.expm1(-dt))  # inverse softplus
        elif leaf == "e_score_correction_bias":
            val = 0.1 * torch.randn(shape, generator=gen)
        elif leaf == "bias":
            val = 0.02 * torch.randn(shape, generator=gen)
        elif p.dim() == 1:  # norm weights
            val = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif "embed" in name or "wte" in name or "wpe" in name:
            val = torch.randn(shape, generator=gen)
        elif "conv" in name:
            val = torch.randn(shape, generator=gen) / math.sqrt(shape[-1])
        else:
            fan_in = shape[-1] if p.dim() >= 2 else 1
            val = torch.randn(shape, generator=gen) / math.sqrt(fan_in)
        p.copy_(val.to(p.dtype))
    return model
