"""What the mesh tests share: a small Kimi shape, a job (prompt and decode ids) and the eager
parts of a model run for every rank in the simulator, decode fed each rank its own state; a
model with balanced routing and the check of a run's bytes against `k3c plan`."""

from __future__ import annotations

import pytest
import torch

from k3c import models
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


def balanced(batch: int, seed: int) -> tuple[torch.nn.Module, dict]:
    """k3-tiny (a KDA layer with a dense MLP, an MLA layer with a MoE) where every token picks
    every expert (top_k = E): the routing is balanced by construction, so the all-to-all bytes
    the plan prices at balanced routing are exact; and a job of `batch` rows."""
    model = models.build("k3-tiny", **SMALL, top_k=8).eval()
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (batch, T + STEPS), generator=g)
    return model, {"input_ids": ids[:, :T], "decode_ids": ids[:, T:]}


def bytes_equal_plan(model: torch.nn.Module, mesh: Mesh, results: list[dict], rows: int) -> dict:
    """Every rank's bytes and calls per primitive against the plan's per-token figures (counted
    on rank 0's model on meta-free tensors, `rows` sequences a copy) times the tokens it ran;
    returns the plan's decode figures."""
    from k3c.plan import plan
    from k3c.plan_mesh import DeployMesh

    p = plan("k3-tiny", DeployMesh.parse(str(mesh)), T, model=model, batch=rows)
    pre, dec = p["per_token"]["prefill"], p["per_token"]["decode"]
    for r in results:
        assert set(r["sent"]) == set(pre)
        for op in pre:
            assert r["sent"][op] == pytest.approx(pre[op]["bytes"] * rows * T + dec[op]["bytes"] * rows * STEPS,
                                                  rel=1e-12, abs=0)
            assert r["calls"][op] == pre[op]["count"] + dec[op]["count"] * STEPS
    return dec


def gloo_run_equals_one_process_and_plan(backend: str, mesh: str, batch: int, seed: int, tmp_path) -> None:
    """The balanced model's rank artifacts for `backend` in gloo rank processes on `mesh`, a
    batch of `batch` (2 rows a copy): against the one-process model (prefill, decode, the
    state joined back), and the bytes each rank handed torch.distributed per primitive equal
    to what `k3c plan` predicts (all-to-all alone)."""
    from k3c.distributed.diff import compare_mesh, run_mesh
    from k3c.distributed.runner import compile_mesh

    model, work = balanced(batch, seed)
    m = Mesh.parse(mesh)
    d = compile_mesh(model, backend, (work["input_ids"],), m, tmp_path)
    real = run_mesh(d, work, m.world, timeout_s=120)
    report = compare_mesh(model, real, work, m)
    assert report["ok"], report
    assert set(bytes_equal_plan(model, m, real, 2)) == {"all_to_all"}
