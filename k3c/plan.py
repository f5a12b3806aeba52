"""`k3c plan`: what each rank of a mesh holds and sends, for models too big to run here.

The model is built on the meta device in its release dtypes (BF16, MXFP4 routed experts for
K3), partitioned for each rank (passes/partition.py), and its eager prefill (B = 1, T tokens)
and one decode step at T cached tokens run on meta tensors under a communicator that only
counts (k3c.distributed.comm.ShapeComm, bytes as passes/cost.py's `sent_bytes` defines them).

    plan("k3", "tp=8,ep=8", seq_len=4096) -> {"mesh": {...}, "ranks": [{"rank", "weight_bytes",
        "state_bytes"}, ...], "per_token": {"prefill": {op: {"count", "bytes"}}, "decode": {...}},
        "moe_combine": {...}}

`count` is the collectives per forward pass, `bytes` what one rank sends per token. The routed
experts' combine is priced both ways (an all-reduce over the world, or the all-to-all dispatch
and combine over the ep group at balanced routing, then the tp columns summed), the cheaper
named ("chosen") and the form the partition ran ("run": the chosen one unless `combine` says).
"""

from __future__ import annotations

import torch

from .errors import UsageError
from .kernels.collectives import using
from .models.precision import unique_tensors
from .passes.mesh import Mesh
from .passes.partition import combine_report, partition


def _release(name: str, dtype: str | None):
    from . import models

    release = {"k3": ("bfloat16", "mxfp4"), "k3-small": ("bfloat16", "mxfp4"), "k3-tiny": ("bfloat16", "mxfp4"),
               "kimi-linear": ("bfloat16", None), "kimi-linear-tiny": ("bfloat16", None)}
    if name not in release:
        raise UsageError(f"plan: {name!r} is not a Kimi model (k3, kimi-linear and their tiny/small forms)")
    dt, experts = release[name]
    dt = getattr(torch, dtype or dt)
    return models.build(name, dtype=dt, experts=experts if dt != torch.float32 else None, device="meta")


def plan(name: str, mesh: Mesh | str, seq_len: int = 4096, *, dtype: str | None = None,
         model: torch.nn.Module | None = None, batch: int = 1, combine: str = "auto") -> dict:
    """Per rank bytes of weights and of state at `seq_len`, and bytes sent per token, with the
    routed experts combined as `combine` says (passes/partition.py)."""
    from .distributed.comm import ShapeComm

    mesh = Mesh.parse(mesh)
    model = model if model is not None else _release(name, dtype)
    dev = next(model.parameters()).device
    ids = torch.zeros(batch, seq_len, dtype=torch.long, device=dev)
    # every split is even (partition checks that the mesh divides each), so every rank holds
    # what rank 0 holds and sends what it sends
    part = partition(model, mesh, 0, combine)
    comm = ShapeComm(0)
    with using(comm), torch.no_grad():
        _, state = part.step(ids, None)
        pre = dict(comm.sent), dict(comm.calls)
        comm.sent.clear(), comm.calls.clear()
        part.step(ids[:, :1], state)
        dec = dict(comm.sent), dict(comm.calls)
    row = {"weight_bytes": sum(t.nbytes for t in unique_tensors(part).values()),
           "state_bytes": sum(t.nbytes for t in state.values())}
    per_token = {"prefill": {k: {"count": pre[1][k], "bytes": pre[0][k] / (batch * seq_len)} for k in pre[0]},
                 "decode": {k: {"count": dec[1][k], "bytes": dec[0][k] / batch} for k in dec[0]}}
    return {"model": name, "mesh": mesh.to_json(), "seq_len": seq_len,
            "ranks": [{"rank": r, **row} for r in range(mesh.world)],
            "per_token": per_token, "moe_combine": combine_report(model, mesh, combine)}


def format_plan(p: dict) -> str:
    gb = 1e9
    r = p["ranks"][0]
    vocab = ", vocabulary split" if p["mesh"].get("vocab") else ""
    lines = [f"{p['model']} on {p['mesh']['world']} ranks (tp={p['mesh']['tp']}, ep={p['mesh']['ep']}{vocab}), "
             f"state at T = {p['seq_len']}",
             f"  per rank: weights {r['weight_bytes'] / gb:.2f} GB, state {r['state_bytes'] / gb:.3f} GB, "
             f"total {(r['weight_bytes'] + r['state_bytes']) / gb:.2f} GB (every rank the same)"]
    for phase, rows in p["per_token"].items():
        for op, v in sorted(rows.items()):
            lines.append(f"  {phase:8s} {op:15s} {v['count']:4d} per pass, "
                         f"{v['bytes'] / 1e3:10.1f} kB sent per token")
    c = p["moe_combine"]
    if c:
        ar = c["all_reduce_bytes_per_token"] / 1e3
        lines.append(f"  routed-expert combine ({c['layers']} layers): all-reduce {ar:.1f}"
                     f" kB/token vs all-to-all {c['all_to_all_bytes_per_token'] / 1e3:.1f} kB/token: "
                     f"{c['chosen']} moves fewer (run: {c['run']})")
    return "\n".join(lines)
