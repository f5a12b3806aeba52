"""What a deployment plan needs to know of a Kimi model, read off the model built on meta.

Per layer: the bytes and multiply-adds per token of the tensors that tensor parallelism splits,
of those every rank keeps whole, and of the routed experts; the state one sequence holds (the
recurrent KDA state, the conv tails, the MLA latent cache per token). Which tensors tp splits
is not decided here: the partition (k3c/distributed/partition.py) is run for rank 0 of tp=2
and each tensor it halved counts as split. The state is the model's own state spec (names,
shapes, dtypes), so what the plan counts is what `model.prefill` returns.

    prof = profile(model)        # model: a Kimi model, any device (meta will do)
    prof.layers[0].split.bytes, prof.state_per_seq(context=4096)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import torch

from .distributed.partition import partition, split_dim
from .models.precision import unique_tensors
from .models.validate import state_spec

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_ROUTED = re.compile(r"\.experts\.")


@dataclass
class Cost:
    """Bytes held and multiply-adds per token (one per weight of a GEMM a token goes through)."""

    bytes: float = 0.0
    macs: float = 0.0

    def add(self, nbytes: float, macs: float) -> None:
        self.bytes += nbytes
        self.macs += macs


@dataclass
class Layer:
    index: int  # 0-based
    mixer: str  # "kda" | "mla"
    split: Cost = field(default_factory=Cost)       # heads and MLP widths: / tp
    replicated: Cost = field(default_factory=Cost)  # norms, router, latent projections, AttnRes
    routed: Cost = field(default_factory=Cost)      # bytes: all experts; macs: one expert, per token
    recurrent: float = 0.0   # bytes of the KDA state S of one sequence (split by head)
    recurrent_item: int = 4  # its element size as the model keeps it
    conv: float = 0.0        # bytes of the conv tails of one sequence (split by channel)
    latent: float = 0.0      # bytes of the MLA latent cache per token of one sequence (not split)
    fixed: float = 0.0       # bytes of any other fixed-size state of one sequence (not split)


@dataclass
class Profile:
    name: str
    config: object
    layers: list[Layer]
    embed: Cost       # the embedding table (macs 0: a lookup); a token reads one row
    head: Cost        # the LM head (split over tp with "vocab", else replicated)
    final: Cost       # final norm and AttnRes mix: replicated, on the last stage
    item: int         # bytes of an activation element (the model's compute dtype)
    experts_mxfp4: bool = False  # routed experts stored as MXFP4 codes (their GEMMs at the FP4 rate)

    def state_per_seq(self, context: int) -> float:
        """Bytes of the state of one sequence at `context` tokens, over all layers."""
        return sum(lay.recurrent + lay.conv + lay.fixed + lay.latent * context for lay in self.layers)


def _macs(name: str, t: torch.Tensor) -> float:
    """Weights a token multiplies with: a matrix's elements (two per byte of MXFP4 codes);
    norms, biases and MXFP4 scales none."""
    if t.dim() < 2 or name.endswith("_scale"):
        return 0.0
    return t.numel() * (2 if name.endswith("_packed") else 1)


def profile(model: torch.nn.Module, name: str = "") -> Profile:
    """The plan's view of `model` (a Kimi model: KDA/MLA mixers, MoE)."""
    from .models.mla_layer import MLAMixer

    cfg = model.config
    whole = unique_tensors(model)
    half = unique_tensors(partition(model, "tp=2", 0))
    layers = [Layer(i, "mla" if isinstance(lay.self_attn, MLAMixer) else "kda")
              for i, lay in enumerate(model.model.layers)]
    embed, head, final = Cost(), Cost(), Cost()
    for key, t in whole.items():
        nbytes, macs = t.numel() * t.element_size(), _macs(key, t)
        m = _LAYER.search(key)
        if m is None:
            if "embed_tokens" in key:
                embed.add(nbytes, 0.0)
            elif key.startswith("lm_head"):
                head.add(nbytes, macs)
            else:
                final.add(nbytes, macs)
            continue
        lay = layers[int(m.group(1))]
        if _ROUTED.search(key):
            lay.routed.add(nbytes, macs / cfg.num_experts)
        elif key in half and half[key].numel() * 2 == t.numel():
            lay.split.add(nbytes, macs)
        else:
            lay.replicated.add(nbytes, macs)
    for key, (shape, grow, dtype) in state_spec(model).items():
        m = _LAYER.search("." + key)
        if m is None:
            continue
        lay = layers[int(m.group(1))]
        item = torch.empty((), dtype=dtype).element_size()
        nbytes = math.prod(1 if i in grow else n for i, n in enumerate(shape)) * item
        if grow:
            lay.latent += nbytes
        elif key.rsplit(".", 1)[-1] == "S":
            lay.recurrent += nbytes
            lay.recurrent_item = item
        elif split_dim(key) is not None:
            lay.conv += nbytes
        else:  # a fixed-size entry without a head axis: every tp rank keeps it whole
            lay.fixed += nbytes
    item = next(t for k, t in whole.items() if k.endswith("embed_tokens.weight")).element_size()
    mxfp4 = any(_ROUTED.search(k) and k.endswith("_packed") for k in whole)
    return Profile(name, cfg, layers, embed, head, final, item, mxfp4)
