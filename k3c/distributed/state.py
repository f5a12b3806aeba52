"""A state between one process and a mesh: each rank's shard of it, and the whole from the shards.

The names are the one-process model's (`layers.{i}.S`, `.conv_q`, ..., `.ckv`, `.krope`); a
rank's entries hold its heads: the KDA state S [B, H, K, V] by head (dim 1), the conv tails
[B, H K, W - 1] by channel (dim 1), the MLA latent cache whole on every rank (it has no head
axis). Ranks of one tp index along the ep axis hold equal copies.
"""

from __future__ import annotations

import torch

from ..passes.mesh import Mesh
from ..passes.partition import split_dim


def split_state(state: dict[str, torch.Tensor], mesh: Mesh, rank: int) -> dict[str, torch.Tensor]:
    """Rank `rank`'s shard of a one-process state."""
    _, t = mesh.coords(rank)
    out = {}
    for name, x in state.items():
        d = split_dim(name)
        out[name] = x if d is None else x.chunk(mesh.tp, d)[t].contiguous()
    return out


def join_state(states: list[dict[str, torch.Tensor]], mesh: Mesh) -> dict[str, torch.Tensor]:
    """The one-process state from the ranks' shards (those of ep index 0: the others are copies)."""
    out = {}
    for name in states[0]:
        d = split_dim(name)
        parts = [states[r][name] for r in mesh.tp_group(0)]
        out[name] = parts[0] if d is None else torch.cat(parts, d)
    return out
