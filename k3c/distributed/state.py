"""A state between one process and a mesh: each rank's shard of it, and the whole from the shards.

The names are the one-process model's (`layers.{i}.S`, `.conv_q`, ..., `.ckv`, `.krope`); a
rank's entries hold its heads: the KDA state S [B, H, K, V] by head (dim 1), the conv tails
[B, H K, W - 1] by channel (dim 1), the MLA latent cache whole on every rank (it has no head
axis). Ranks of one tp index along the ep axis hold equal copies. With dp each copy holds the
state of its own batch rows (Mesh.batch_rows: dim 0 of every entry; with ep = k dp the k copies
of a dp index hold equal ones), and the job it runs is its rows of the prompt and decode ids
(`local_job`). With pp each stage's ranks hold the entries
of its layers only; `join_state` joins the stages' entries into one state.
"""

from __future__ import annotations

import torch

from .mesh import Mesh
from .partition import split_dim


def local_job(job: dict, mesh: Mesh, rank: int) -> dict:
    """The part of a job (a dict of [B, ...] id tensors) that `rank`'s copy runs: its rows."""
    batch = job["input_ids"].shape[0]
    rows = mesh.batch_rows(rank, batch)
    return {k: v[rows] if isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == batch else v
            for k, v in job.items()}


def split_state(state: dict[str, torch.Tensor], mesh: Mesh, rank: int) -> dict[str, torch.Tensor]:
    """Rank `rank`'s shard of a one-process state."""
    _, t = mesh.coords(rank)
    out = {}
    for name, x in state.items():
        x = x[mesh.batch_rows(rank, x.shape[0])]
        d = split_dim(name)
        out[name] = x if d is None else x.chunk(mesh.tp, d)[t].contiguous()
    return out


def join_state(states: list[dict[str, torch.Tensor]], mesh: Mesh) -> dict[str, torch.Tensor]:
    """The one-process state from the ranks' shards: each copy's tp shards joined by head (the
    copies of one dp index hold equal ones, so its first copy serves), then the dp indices'
    rows stacked; with pp each entry from the stage that holds it."""
    copies = [d * (mesh.copies // mesh.dp) for d in range(mesh.dp)]  # the first copy of each dp index
    out = {}
    for name in dict.fromkeys(n for s in states for n in s):
        first = next(r for r, s in enumerate(states) if name in s)  # with pp: the first rank of its stage
        d = split_dim(name)
        rows = []
        for a in copies:
            parts = [states[r][name] for r in mesh.tp_group(first + a * mesh.tp)]
            rows.append(parts[0] if d is None else torch.cat(parts, d))
        out[name] = torch.cat(rows, 0) if len(rows) > 1 else rows[0]
    return out

