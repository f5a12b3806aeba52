"""`k3c plan`: what each rank of a mesh holds and sends, for models too big to run here.

The model is built on the meta device in its release dtypes (BF16, MXFP4 routed experts for
K3), partitioned for each rank (passes/partition.py), and its eager prefill (B = 1, T tokens)
and one decode step at T cached tokens run on meta tensors under a communicator that only
counts (k3c.distributed.comm.ShapeComm, bytes as passes/cost.py's `sent_bytes` defines them).

    plan("k3", "tp=8,ep=8", seq_len=4096) -> {"mesh": {...}, "ranks": [{"rank", "weight_bytes",
        "state_bytes"}, ...], "per_token": {"prefill": {op: {"count", "bytes"}}, "decode": {...}},
        "moe_combine": {...}}

`count` is the collectives per forward pass, `bytes` what one rank sends per token. The routed
experts' combine is run as an all-reduce over the world (reduce-scatter + all-gather); the
all-to-all dispatch and combine it would replace is priced beside it at balanced routing, and
the cheaper is named ("chosen").
"""

from __future__ import annotations

import torch

from .errors import UsageError
from .kernels.collectives import using
from .models.precision import unique_tensors
from .passes.mesh import Mesh
from .passes.partition import ShardedMoE, partition


def _release(name: str, dtype: str | None):
    from . import models

    release = {"k3": ("bfloat16", "mxfp4"), "k3-small": ("bfloat16", "mxfp4"), "k3-tiny": ("bfloat16", "mxfp4"),
               "kimi-linear": ("bfloat16", None), "kimi-linear-tiny": ("bfloat16", None)}
    if name not in release:
        raise UsageError(f"plan: {name!r} is not a Kimi model (k3, kimi-linear and their tiny/small forms)")
    dt, experts = release[name]
    dt = getattr(torch, dtype or dt)
    return models.build(name, dtype=dt, experts=experts if dt != torch.float32 else None, device="meta")


def _a2a_combine(part: ShardedMoE, world: int, tokens: int, item: int) -> tuple[float, float]:
    """Bytes per token one rank sends to combine one MoE layer's routed experts: by the
    all-reduce it runs, and by an all-to-all dispatch + combine (+ the all-gather of the token
    slices) at balanced routing."""
    M, k = world, part.top_k
    width = part.routed_expert_down_proj.out_features if hasattr(part, "routed_expert_down_proj") \
        else part.gate.weight.shape[1]
    away = (M - 1) / M
    allreduce = 2 * away * width * item
    dispatch = k / M * away * (width * item + 8)
    combine = k / M * away * width * item + away * width * item
    return allreduce, dispatch + combine + 8 * (M - 1) / tokens


def plan(name: str, mesh: Mesh | str, seq_len: int = 4096, *, dtype: str | None = None,
         model: torch.nn.Module | None = None, batch: int = 1) -> dict:
    """Per rank bytes of weights and of state at `seq_len`, and bytes sent per token."""
    from .distributed.comm import ShapeComm

    mesh = Mesh.parse(mesh)
    model = model if model is not None else _release(name, dtype)
    dev = next(model.parameters()).device
    ids = torch.zeros(batch, seq_len, dtype=torch.long, device=dev)
    # every split is even (partition checks that the mesh divides each), so every rank holds
    # what rank 0 holds and sends what it sends
    part = partition(model, mesh, 0)
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
    first = (row, part)
    moes = [m for m in first[1].modules() if isinstance(m, ShardedMoE)]
    combine = None
    if moes:
        item = torch.finfo(next(first[1].parameters()).dtype).bits // 8 \
            if next(first[1].parameters()).is_floating_point() else 2
        ar, a2a = (sum(v) for v in zip(*[_a2a_combine(m, mesh.world, batch * seq_len, item) for m in moes]))
        combine = {"layers": len(moes), "all_reduce_bytes_per_token": ar, "all_to_all_bytes_per_token": a2a,
                   "chosen": "all_reduce" if ar <= a2a else "all_to_all", "run": "all_reduce"}
    return {"model": name, "mesh": mesh.to_json(), "seq_len": seq_len,
            "ranks": [{"rank": r, **first[0]} for r in range(mesh.world)],
            "per_token": per_token, "moe_combine": combine}


def format_plan(p: dict) -> str:
    gb = 1e9
    r = p["ranks"][0]
    lines = [f"{p['model']} on {p['mesh']['world']} ranks (tp={p['mesh']['tp']}, ep={p['mesh']['ep']}), "
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
