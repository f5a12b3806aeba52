"""Bytes of a model's weights as released: on disk, by dtype, and read per token.

    weight_bytes(build("k3", device="meta", **release_precision(cfg)))

Read off the module itself (meta tensors will do): Kimi models through the release layout's
plan, so the figure is what `save_pretrained` writes (K3's `A_log` padded to `[head_dim]`,
MXFP4 codes and scales per expert), the others from their unique tensors. Per token, a
decode step reads every weight once except the routed experts (top_k / num_experts of them)
and the embedding tables (one row each), unless a table is also the LM head (GPT-2), which
reads it whole.
"""

from __future__ import annotations

import math
import re
from collections import Counter

import torch

from .checkpoint.layouts import TEXT_PREFIX, plan, tied_aliases
from .configs import KimiConfig, kimi_model_type
from .moe_layer import MoE
from .precision import unique_tensors

_ROUTED = re.compile(r"\.experts\.(\d+\.w[123]\.|w13|w2)")
_EMBEDDING = re.compile(r"(embed_tokens|\bwte|\bwpe)\.weight$")


def _rows(model: torch.nn.Module) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """(name, shape, dtype) of every tensor as stored."""
    cfg = model.config
    if isinstance(cfg, KimiConfig):
        k3 = kimi_model_type(cfg) == "kimi_k3"
        sd = model.state_dict()
        entries = plan(model, "official", prefix=TEXT_PREFIX if k3 else "", k3_release=k3)
        return [(e.key, e.shape, sd[e.pieces[0].model_key].dtype) for e in entries]
    return [(k, tuple(t.shape), t.dtype) for k, t in unique_tensors(model).items()]


def weight_bytes(model: torch.nn.Module) -> dict:
    """{"total", "by_dtype", "held", "active_per_token", "active_per_token_by_dtype"} in bytes."""
    moe = [m for m in model.modules() if isinstance(m, MoE)]
    share = moe[0].top_k / moe[0].gate.weight.shape[0] if moe else 0.0
    read_whole = set(tied_aliases(model).values())  # an embedding that is also the LM head
    total: Counter[str] = Counter()
    active: Counter[str] = Counter()
    size = {d: torch.empty((), dtype=d).element_size() for d in {t.dtype for t in unique_tensors(model).values()}}
    for name, shape, dtype in _rows(model):
        n = math.prod(shape) * size[dtype]
        kind = str(dtype).removeprefix("torch.")
        total[kind] += n
        if _ROUTED.search(name):
            active[kind] += n * share
        elif _EMBEDDING.search(name) and name not in read_whole:
            active[kind] += n // shape[0]  # one row
        else:
            active[kind] += n
    held = sum(t.numel() * t.element_size() for t in unique_tensors(model).values())
    return {"total": sum(total.values()), "by_dtype": dict(total.most_common()), "held": held,
            "active_per_token": round(sum(active.values())),
            "active_per_token_by_dtype": {k: round(v) for k, v in active.most_common()}}


__all__ = ["weight_bytes"]
