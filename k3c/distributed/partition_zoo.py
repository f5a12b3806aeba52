"""The partition for the zoo's models with heads and no experts: the linear-attention
family (linear attention, DeltaNet, Gated DeltaNet: models/linear_lm.py) and GPT-2, on tp.

    tp (group: the rank's tp group)
      linear mixer  q/k/v projections and their convs, b (beta) and a (gate) projections,
                    A_log and dt_bias by head (colwise), g_proj by head; o_proj by its input
                    columns (rowwise) + all_reduce. The state S [B, H, K, V], the normaliser
                    z [B, H, K] and the conv tails are the rank's heads. o_norm (one [V] weight
                    shared by the heads) is replicated.
      GPT-2         c_attn's q, k and v blocks by head (colwise, with their biases); c_proj
                    rowwise + all_reduce, its bias kept on tp index 0 only (the sum adds it
                    once); the KV cache [B, P, H, D] is the rank's heads.
      MLP           GPT-2's c_fc colwise, c_proj rowwise + all_reduce (bias on index 0); the
                    SiLU-GLU MLP as k3c/distributed/partition.py splits it.
    replicated: embeddings, positions, norms, the LM head.

The Kimi models are partition.py's own; this file is called from it for the others.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..models.common import GatedMLP


def _colwise(linear: nn.Linear, blocks: list[tuple[int, int]]) -> None:
    """Keep the output rows of `blocks` ([lo, hi) each, in order), bias alike."""
    linear.weight = nn.Parameter(torch.cat([linear.weight.detach()[lo:hi] for lo, hi in blocks]).clone(),
                                 requires_grad=False)
    if linear.bias is not None:
        linear.bias = nn.Parameter(torch.cat([linear.bias.detach()[lo:hi] for lo, hi in blocks]).clone(),
                                   requires_grad=False)
    linear.out_features = linear.weight.shape[0]


def _rowwise(linear: nn.Linear, lo: int, hi: int, t: int, group: list[int]) -> None:
    from .partition import ReducedLinear

    linear.weight = nn.Parameter(linear.weight.detach()[:, lo:hi].clone(), requires_grad=False)
    linear.in_features = hi - lo
    if linear.bias is not None and t != 0:  # the all_reduce sums the ranks' products: one bias
        linear.bias = nn.Parameter(torch.zeros_like(linear.bias), requires_grad=False)
    linear.__class__, linear.group = ReducedLinear, list(group)


def _linear_mixer(m: nn.Module, t: int, tp: int, group: list[int]) -> None:
    H = m.H // tp
    hk, hv, hh = (t * H * m.K, (t + 1) * H * m.K), (t * H * m.V, (t + 1) * H * m.V), (t * H, (t + 1) * H)
    for name, block in (("q_proj", hk), ("k_proj", hk), ("v_proj", hv), ("b_proj", hh), ("a_proj", hh),
                        ("g_proj", hv)):
        if hasattr(m, name):
            _colwise(getattr(m, name), [block])
    for name, (lo, hi) in (("q_conv1d", hk), ("k_conv1d", hk), ("v_conv1d", hv)):
        if hasattr(m, name):
            conv = getattr(m, name)
            conv.weight = nn.Parameter(conv.weight.detach()[lo:hi].clone(), requires_grad=False)
    for name in ("A_log", "dt_bias"):
        if hasattr(m, name):
            setattr(m, name, nn.Parameter(getattr(m, name).detach()[hh[0]:hh[1]].clone(), requires_grad=False))
    _rowwise(m.o_proj, *hv, t, group)
    m.H = H


def _gpt2_block(block: nn.Module, t: int, tp: int, group: list[int]) -> None:
    a = block.attn
    H, D = a.H // tp, a.D
    C = a.H * D
    lo, hi = t * H * D, (t + 1) * H * D
    _colwise(a.c_attn, [(lo, hi), (C + lo, C + hi), (2 * C + lo, 2 * C + hi)])  # q, k, v blocks
    _rowwise(a.c_proj, lo, hi, t, group)
    a.H = H
    n = block.mlp.c_fc.out_features // tp
    _colwise(block.mlp.c_fc, [(t * n, (t + 1) * n)])
    _rowwise(block.mlp.c_proj, t * n, (t + 1) * n, t, group)


def partition_zoo(part: nn.Module, t: int, tp: int, group: list[int]) -> None:
    """Split `part` (a copy of a linear-attention model or GPT-2) in place for tp index `t`."""
    from .partition import _mlp

    if tp == 1:
        return
    if hasattr(part, "transformer"):  # GPT-2
        for block in part.transformer.h:
            _gpt2_block(block, t, tp, group)
        return
    for layer in part.model.layers:
        _linear_mixer(layer.attn, t, tp, group)
        if isinstance(layer.mlp, GatedMLP):
            _mlp(layer.mlp, t, tp, group)


def zoo_widths(config) -> dict[str, int] | None:
    """What tp must divide in a zoo config (None: not a model this file partitions)."""
    family = getattr(config, "family", None)
    if family == "linear":
        return {"heads (num_heads)": config.num_heads, "MLP width (intermediate_size)": config.intermediate_size}
    if family == "gpt2":
        return {"heads (n_head)": config.n_head, "MLP width (4 * n_embd)": 4 * config.n_embd}
    return None
