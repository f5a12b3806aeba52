"""`k3c diff --mesh`: a model compiled per rank, run in spawned rank processes (gloo on CPU),
compared with the one-process eager model: prefill logits on every rank, each decode step (the
ranks fed their own state shards), and the state reassembled from the shards, each under the
tolerance k3c diff uses (numerics.model_tolerance: eager's own noise against its float64
copy, at least the fp32 row). Also the simulator on the same artifacts (it must agree with the real
run) and the bytes each rank sent.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path

import torch

from ..numerics import compare, model_tolerance
from ..yardstick import float64_copy, float64_mode
from .mesh import Mesh
from .partition import combine_report
from .runner import RankModel, compile_mesh
from .simulate import run_ranks
from .spawn import spawn
from .state import join_state, local_job


def _worst(triples) -> dict:
    """The largest errors of (actual, eager, exact) triples, each judged under the tolerance
    that eager's own noise against its float64 copy gives (as k3c diff does)."""
    worst = {"max_abs_err": 0.0, "rel_rms_err": 0.0, "ok": True}
    for actual, expected, exact in triples:
        c = compare(actual, expected, tolerance=model_tolerance(expected, exact.to(expected.dtype)))
        worst["max_abs_err"] = max(worst["max_abs_err"], c.max_abs_err)
        worst["rel_rms_err"] = max(worst["rel_rms_err"], c.rel_rms_err)
        worst["ok"] = worst["ok"] and c.ok
    return worst


def run_mesh(mesh_dir: Path, job: dict, world: int, simulate: bool = False, timeout_s: float = 120.0) -> list[dict]:
    """The job on every rank: in rank processes, or (simulate) in this one."""
    if not simulate:
        return spawn(mesh_dir, job, world, timeout_s)

    lock = threading.Lock()

    def one(r: int) -> dict:
        rank = RankModel(mesh_dir, r, lock=lock)
        logits, state, steps, s = _eager(rank, local_job(job, rank.mesh, r),  # the rank's job, as launch runs it
                                         job.get("micro_batches", 1))
        return {"logits": logits, "state": state, "decode_logits": steps, "decode_state": s}
    results, comms = run_ranks(one, world, timeout_s)
    for res, c in zip(results, comms):
        res["sent"], res["calls"] = dict(c.sent), dict(c.calls)
    return results


def _eager(model: torch.nn.Module, job: dict, micro: int = 1):
    """Prefill then decode steps; `micro` > 1: a pipeline rank's prefill in pieces of rows."""
    with torch.no_grad():
        logits, state = model.prefill(job["input_ids"], **({"micro_batches": micro} if micro > 1 else {}))
        steps, s = [], state
        for i in range(job["decode_ids"].shape[1]):
            lo, s = model.decode(job["decode_ids"][:, i:i + 1], s)
            steps.append(lo)
    return logits, state, steps, s


def compare_mesh(model: torch.nn.Module, results: list[dict], job: dict, mesh: Mesh) -> dict:
    """Errors of a mesh run against the eager one-process model on the same job."""
    logits, state, steps, s = _eager(model, job)
    with float64_mode():  # the yardstick float64 throughout, the models' float32 casts included
        x_logits, x_state, x_steps, x_s = _eager(float64_copy(model), job)
    joined, joined_dec = join_state([r["state"] for r in results], mesh), \
        join_state([r["decode_state"] for r in results], mesh)
    B = job["input_ids"].shape[0]
    mine = [mesh.batch_rows(r, B) for r in range(len(results))]  # each rank's own sequences (dp)
    last = [(res, m) for res, m in zip(results, mine) if res["logits"] is not None]  # pp: the last stage
    rows = {"prefill": _worst((res["logits"], logits[m], x_logits[m]) for res, m in last),
            "decode": _worst((res["decode_logits"][i], steps[i][m], x_steps[i][m]) for res, m in last
                             for i in range(len(steps))),
            "state": _worst([(joined[k], state[k], x_state[k]) for k in state]
                            + [(joined_dec[k], s[k], x_s[k]) for k in s])}
    return {**rows, "ok": all(v["ok"] for v in rows.values()),
            "sent": [r["sent"] for r in results], "calls": [r["calls"] for r in results]}


def diff_mesh(model: torch.nn.Module, backends: list[str], mesh: Mesh | str, *, seq_len: int = 16, batch: int = 2,
              decode_steps: int = 2, out_root: str | Path | None = None, timeout_s: float = 120.0,
              simulate: bool = False, seed: int = 0, combine: str = "auto",
              passes: str | list[str] = "default", micro_batches: int | None = None) -> dict:
    """{"mesh": ..., "backends": {name: {"prefill", "decode", "state": {max_abs_err, rel_rms_err, ok},
    "ok", "sent", "calls"}}}; artifacts in out_root (a temporary folder, removed, when None).
    With pp the prefill goes through the stages in `micro_batches` pieces of rows (default:
    min(batch, pp))."""
    mesh = Mesh.parse(mesh)
    mesh.batch_rows(0, batch)  # a batch too small for the dp copies fails before any compile
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (batch, seq_len + decode_steps), generator=g)
    job = {"input_ids": ids[:, :seq_len], "decode_ids": ids[:, seq_len:],
           "micro_batches": micro_batches or min(batch, mesh.pp)}
    root = Path(out_root) if out_root is not None else Path(tempfile.mkdtemp(prefix="k3c-mesh-diff-"))
    report = {"model": getattr(model, "name", type(model).__name__), "mesh": mesh.to_json(), "backends": {},
              "combine": combine_report(model, mesh, combine)}
    try:
        for b in backends:
            d = compile_mesh(model, b, (job["input_ids"],), mesh, root / b.replace(":", "-"), passes, force=True,
                             combine=combine)
            results = run_mesh(d, job, mesh.world, simulate, timeout_s)
            report["backends"][b] = compare_mesh(model, results, job, mesh)
    finally:
        if out_root is None:
            shutil.rmtree(root, ignore_errors=True)
    report["ok"] = all(v["ok"] for v in report["backends"].values())
    return report


def format_report(report: dict) -> str:
    c = report.get("combine")
    how = (", vocabulary split" if report["mesh"].get("vocab") else "") + \
        (f", routed experts combined by {c['run']}" if c else "")
    dp = f"dp={report['mesh']['dp']}, " if report["mesh"].get("dp", 1) > 1 else ""
    pp = f", pp={report['mesh']['pp']}" if report["mesh"].get("pp", 1) > 1 else ""
    lines = [f"{report['model']} on {dp}tp={report['mesh']['tp']}, ep={report['mesh']['ep']}{pp} "
             f"({report['mesh']['world']} ranks{how}) vs the one-process eager model"]
    for b, v in report["backends"].items():
        parts = [f"{k} {v[k]['max_abs_err']:.2e} / {v[k]['rel_rms_err']:.2e}" for k in ("prefill", "decode", "state")]
        sent = sum(sum(s.values()) for s in v["sent"]) / len(v["sent"])
        lines.append(f"  {b:10s} {'ok ' if v['ok'] else 'OFF'} max-abs / rel-rms: {', '.join(parts)}; "
                     f"{sent / 1e3:.1f} kB sent per rank")
    return "\n".join(lines)
