"""What the mesh tests share: a small Kimi shape, a job (prompt and decode ids) and the eager
parts of a model run for every rank in the simulator, decode fed each rank its own state."""

from __future__ import annotations

import torch

from k3c.distributed.mesh import Mesh
from k3c.distributed.partition import partition
from k3c.distributed.simulate import run_ranks
from k3c.distributed.state import local_job

SMALL = {"num_layers": 2, "mla_layers": (2,)}  # a KDA layer (dense MLP), an MLA layer (MoE)
T, STEPS, B = 8, 2, 2


def job(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 1024, (B, T + STEPS), generator=g)
    return {"input_ids": ids[:, :T], "decode_ids": ids[:, T:]}


def eager_parts(model: torch.nn.Module, mesh: Mesh, work: dict, combine: str = "auto", check=None):
    """(results, communicators) of every rank's eager part on `work`: a prefill and two decode
    steps; `check(part)` sees each rank's part first."""
    def one(r):
        part = partition(model, mesh, r, combine=combine)
        if check is not None:
            check(part)
        mine = local_job(work, mesh, r)  # with dp: the rank's own rows
        with torch.no_grad():
            lo, st = part.prefill(mine["input_ids"])
            lo2, st2 = part.decode(mine["decode_ids"][:, :1], st)
            lo3, st3 = part.decode(mine["decode_ids"][:, 1:], st2)
        return {"logits": lo, "state": st, "decode_logits": [lo2, lo3], "decode_state": st3, "sent": {}, "calls": {}}
    return run_ranks(one, mesh.world)
