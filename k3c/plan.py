"""`k3c plan`: what each rank of a mesh holds and sends, whether it fits a device, and how fast
it could decode and prefill, for models too big to run here.

The model is built on the meta device in its release dtypes (BF16, MXFP4 routed experts for
K3). On a mesh the runtime runs without pp (tp, ep and dp: k3c/distributed/mesh.py) it is
partitioned for rank 0 and its eager prefill (B = `batch`, T = `seq_len`) and one decode step
run on meta tensors under a communicator that only counts (k3c.distributed.comm.ShapeComm,
bytes as passes/cost.py's `sent_bytes` defines them): "per_token" and the ranks' weights are
what the runtime holds and sends. A mesh with pp (with ep or dp it is plan-only:
k3c/plan_mesh.py) is priced by the arithmetic of k3c/plan_roofline.py, which also gives every
rank's state pool and, with a device, the estimate (k3c/plan_devices.py).

    plan("k3", "dp=16,ep=16", device="gb300", concurrency=256, context=9216)
      -> {"mesh": {...}, "ranks": [{"rank", "stage", "weight_bytes", "state_bytes"}, ...],
          "per_token": {"prefill": {op: {"count", "bytes"}}, "decode": {...}},
          "moe_combine": {...} | None, "estimate": {"fits", "max_concurrency",
          "decode_tokens_per_s_per_gpu", "decode_tokens_per_s_per_user",
          "prefill_tokens_per_s_per_gpu", ...}}

`count` is the collectives per forward pass, `bytes` what one rank sends per token. The routed
experts' combine is priced both ways (an all-reduce over the expert group, or the all-to-all
dispatch and combine over it at balanced routing, then the tp columns summed), the cheaper
named ("chosen") and the form the partition ran ("run": the chosen one unless `combine` says).
"""

from __future__ import annotations

import torch

from .distributed.partition import combine_report, partition
from .errors import UsageError
from .kernels.collectives import using
from .models.precision import unique_tensors
from .plan_devices import HEADROOM, device
from .plan_mesh import DeployMesh, check_divides
from .plan_model import profile
from .plan_roofline import comm_per_token, estimate, rank_weights, seq_state

STATE_DTYPES = {"f32": 4, "fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2}


def _release(name: str, dtype: str | None):
    from . import models

    release = {"k3": ("bfloat16", "mxfp4"), "k3-small": ("bfloat16", "mxfp4"), "k3-tiny": ("bfloat16", "mxfp4"),
               "kimi-linear": ("bfloat16", None), "kimi-linear-tiny": ("bfloat16", None)}
    if name not in release:
        raise UsageError(f"plan: {name!r} is not a Kimi model (k3, kimi-linear and their tiny/small forms)")
    dt, experts = release[name]
    dt = getattr(torch, dtype or dt)
    return models.build(name, dtype=dt, experts=experts if dt != torch.float32 else None, device="meta")


def _counted(model: torch.nn.Module, mesh, seq_len: int, batch: int, combine: str) -> tuple[dict, float]:
    """Per token bytes the runtime's rank 0 sends, counted on meta tensors, and its weights."""
    from .distributed.comm import ShapeComm

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
    per_token = {"prefill": {k: {"count": pre[1][k], "bytes": pre[0][k] / (batch * seq_len)} for k in pre[0]},
                 "decode": {k: {"count": dec[1][k], "bytes": dec[0][k] / batch} for k in dec[0]}}
    return per_token, sum(t.nbytes for t in unique_tensors(part).values())


def plan(name: str, mesh: DeployMesh | str, seq_len: int = 4096, *, dtype: str | None = None,
         model: torch.nn.Module | None = None, batch: int = 1, combine: str = "auto",
         device_name: str | None = None, concurrency: int | None = None, context: int | None = None,
         state_dtype: str | None = None, headroom: float = HEADROOM) -> dict:
    """Per rank weights and state pool (`concurrency` sequences, default `batch`, at `context`
    tokens, default `seq_len`), bytes sent per token, and with `device_name` the estimate.
    `state_dtype` "bf16" keeps the recurrent KDA state in bf16 (half of f32)."""
    mesh = DeployMesh.parse(mesh)
    if state_dtype is not None and state_dtype not in STATE_DTYPES:
        raise UsageError(f"plan: state dtype must be f32 or bf16, got {state_dtype!r}")
    if not 0 <= headroom < 1:
        raise UsageError(f"plan: headroom is a share of the memory in [0, 1), got {headroom}")
    dev = device(device_name) if device_name is not None else None
    model = model if model is not None else _release(name, dtype)
    check_divides(mesh, model.config)
    concurrency = batch if concurrency is None else concurrency
    context = seq_len if context is None else context
    if concurrency < 1 or context < 1:
        raise UsageError(f"plan: concurrency and context must be >= 1, got {concurrency} and {context}")
    prof = profile(model, name)
    item = STATE_DTYPES.get(state_dtype) if state_dtype else None
    runtime = mesh.runtime()
    weights = [rank_weights(prof, mesh, s) for s in range(mesh.pp)]
    per_stage = None
    if runtime is not None and runtime.world > 1 and runtime.pp == 1:
        per_token, weights[0] = _counted(model, runtime, seq_len, batch, combine)
        moe = combine_report(model, runtime, combine)
    else:  # arithmetic: plan-only meshes, and pp (each stage's own sends, the handover included)
        per_stage = [comm_per_token(prof, mesh, s, combine) for s in range(mesh.pp)]
        busiest = max(per_stage, key=lambda c: sum(v["bytes"] for v in c.values()))
        per_token = {"prefill": busiest, "decode": busiest}
        moe = None
    seqs = -(-concurrency // mesh.dp)
    ranks = [{"rank": r, "stage": r // mesh.stage_ranks, "weight_bytes": weights[r // mesh.stage_ranks],
              "state_bytes": seqs * seq_state(prof, mesh, r // mesh.stage_ranks, context, item)}
             for r in range(mesh.world)]
    out = {"model": name, "mesh": mesh.to_json(), "seq_len": seq_len, "concurrency": concurrency,
           "context": context, "state_dtype": state_dtype or "f32", "ranks": ranks,
           "state_bytes_per_seq": seq_state(prof, DeployMesh(), 0, context, item),
           "per_token": per_token, "moe_combine": moe}
    if per_stage is not None and mesh.pp > 1:
        out["per_stage"] = per_stage
    if dev is not None:
        out["estimate"] = estimate(prof, mesh, dev, concurrency, context, state_item=item,
                                   headroom=headroom, combine=combine)
    return out


def _gb(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale / 10:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def format_plan(p: dict) -> str:
    m = p["mesh"]
    axes = ", ".join(f"{a}={m[a]}" for a in ("dp", "tp", "ep", "pp") if a in ("tp", "ep") or m.get(a, 1) > 1)
    vocab = ", vocabulary split" if m.get("vocab") else ""
    lines = [f"{p['model']} on {m['world']} ranks ({axes}{vocab}), {p['concurrency']} sequence(s) at "
             f"context {p['context']}, recurrent state {p['state_dtype']}"]
    if m.get("plan_only"):
        lines.append("  plan-only: the runtime runs pp only with tp (not with ep or dp); these figures are "
                     "arithmetic (k3c/plan_roofline.py)")
    lines.append(f"  state of one sequence (whole model): {_gb(p['state_bytes_per_seq'])}")
    stages = {}
    for r in p["ranks"]:
        stages.setdefault(r.get("stage", 0), r)
    for s, r in stages.items():
        where = f" of stage {s}" if len(stages) > 1 else ""
        lines.append(f"  per rank{where}: weights {_gb(r['weight_bytes'])}, state pool {_gb(r['state_bytes'])}, "
                     f"total {_gb(r['weight_bytes'] + r['state_bytes'])}")
    sends = {f"stage {s}": rows for s, rows in enumerate(p["per_stage"])} if "per_stage" in p else p["per_token"]
    for phase, rows in sends.items():  # with pp each stage's own (prefill and decode alike)
        for op, v in sorted(rows.items()):
            lines.append(f"  {phase:8s} {op:15s} {v['count']:4d} per pass, "
                         f"{v['bytes'] / 1e3:10.1f} kB sent per token")
    c = p["moe_combine"]
    if c and c["all_reduce_bytes_per_token"] is None:  # dp: the copies' tokens differ, nothing to sum
        lines.append(f"  routed-expert combine ({c['layers']} layers): all-to-all "
                     f"{c['all_to_all_bytes_per_token'] / 1e3:.1f} kB/token (dp: the only form)")
    elif c:
        ar = c["all_reduce_bytes_per_token"] / 1e3
        lines.append(f"  routed-expert combine ({c['layers']} layers): all-reduce {ar:.1f}"
                     f" kB/token vs all-to-all {c['all_to_all_bytes_per_token'] / 1e3:.1f} kB/token: "
                     f"{c['chosen']} moves fewer (run: {c['run']})")
    e = p.get("estimate")
    if e:
        lines += _format_estimate(e)
    return "\n".join(lines)


def _format_estimate(e: dict) -> list[str]:
    mem, st, pre = e["memory"], e["decode_step"], e["prefill_pass"]
    verdict = "fits" if e["fits"] else "does NOT fit"
    lines = [f"  on {e['device']}: {_gb(mem['usable_bytes'])} usable a GPU ({e['headroom']:.0%} left for "
             f"activations and runtime): {verdict}; at most {e['max_concurrency']} sequences at this context",
             f"  decode step (slowest stage): reads {_gb(st['bytes'])} ({st['experts_touched']:.1%} of the routed "
             f"experts: 1 - (1 - {st['top_k']}/{st['experts']})^{st['moe_tokens']}), "
             f"{st['flops'] / 1e12:.2f} + {st['expert_flops'] / 1e12:.2f} (experts) TFLOP, sends "
             f"{st['sent_bytes'] / 1e6:.1f} MB: HBM {st['hbm_s'] * 1e3:.2f} ms, "
             f"compute {st['compute_s'] * 1e3:.2f} ms, link {st['link_s'] * 1e3:.2f} ms",
             f"  roofline (an upper bound): decode {e['decode_tokens_per_s_per_gpu']:.1f} tokens/s per GPU, "
             f"{e['decode_tokens_per_s_per_user']:.1f} per user; prefill {e['prefill_tokens_per_s_per_gpu']:.0f} "
             f"tokens/s per GPU ({pre['bound']}-bound)"]
    return lines
