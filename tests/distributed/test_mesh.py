"""Tensor and expert parallelism: the partition against the one-process eager model, the
simulator against real rank processes (gloo), and the bytes a run sends against `k3c plan`."""

from __future__ import annotations

import pytest
import torch

from k3c import models
from k3c.distributed.diff import compare_mesh, run_mesh
from k3c.distributed.runner import compile_mesh
from k3c.distributed.simulate import RankError, run_ranks
from k3c.errors import UsageError
from k3c.passes.mesh import Mesh
from k3c.passes.partition import partition
from k3c.plan import plan

SMALL = {"num_layers": 2, "mla_layers": (2,)}  # one KDA layer (dense MLP), one MLA layer (MoE)
T, STEPS, B = 8, 2, 2


def _job(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 1024, (B, T + STEPS), generator=g)
    return {"input_ids": ids[:, :T], "decode_ids": ids[:, T:]}


@pytest.fixture(scope="module")
def k3():
    return models.build("k3-tiny", **SMALL).eval()


@pytest.fixture(scope="module")
def tp2_reference(k3, tmp_path_factory):
    job = _job()
    d = compile_mesh(k3, "reference", (job["input_ids"],), "tp=2", tmp_path_factory.mktemp("tp2"))
    return d, job


def test_mesh_errors(k3):
    with pytest.raises(UsageError, match="expected axes"):
        Mesh.parse("tp=2,dp=2")
    with pytest.raises(UsageError, match="tp=3 does not divide the 4 KDA heads"):
        partition(k3, "tp=3", 0)
    with pytest.raises(UsageError, match="ep=3 does not divide the 8 routed experts"):
        partition(k3, "ep=3", 0)


@pytest.mark.parametrize("name", ["k3-tiny", "kimi-linear-tiny"])
@pytest.mark.parametrize("mesh", ["tp=2", "ep=2", "tp=2,ep=2"])
def test_partitioned_eager_matches_one_process(name, mesh):
    """Each rank's eager part, run in the simulator, against the whole model (fp32 row)."""
    model = models.build(name, **SMALL).eval()
    m, job = Mesh.parse(mesh), _job()

    def one(r):
        part = partition(model, m, r)
        with torch.no_grad():
            lo, st = part.prefill(job["input_ids"])
            lo2, st2 = part.decode(job["decode_ids"][:, :1], st)
            lo3, st3 = part.decode(job["decode_ids"][:, 1:], st2)
        return {"logits": lo, "state": st, "decode_logits": [lo2, lo3], "decode_state": st3, "sent": {}, "calls": {}}
    results, _ = run_ranks(one, m.world)
    report = compare_mesh(model, results, job, m)
    assert report["ok"], report


def test_simulator_agrees_with_rank_processes_and_plan(k3, tp2_reference):
    d, job = tp2_reference
    sim = run_mesh(d, job, 2, simulate=True)
    real = run_mesh(d, job, 2, simulate=False, timeout_s=120)
    report = compare_mesh(k3, real, job, Mesh.parse("tp=2"))
    assert report["ok"], report
    for s, r in zip(sim, real):
        torch.testing.assert_close(s["logits"], r["logits"], rtol=0, atol=1e-5)
        assert s["sent"] == r["sent"] and s["calls"] == r["calls"]
    # the bytes counted from the tensors torch.distributed was handed, against the plan (the
    # rank's eager model on meta tensors, counted by a communicator that only counts)
    p = plan("k3-tiny", "tp=2", T, model=k3, batch=B)
    pre, dec = p["per_token"]["prefill"]["all_reduce"], p["per_token"]["decode"]["all_reduce"]
    assert real[0]["sent"]["all_reduce"] == pytest.approx(pre["bytes"] * B * T + dec["bytes"] * B * STEPS)
    assert real[0]["calls"]["all_reduce"] == pre["count"] + dec["count"] * STEPS


def test_dead_rank_is_reported(tp2_reference, tmp_path):
    d, job = tp2_reference
    bad = {"input_ids": job["input_ids"][:, :0], "decode_ids": job["decode_ids"]}  # rank sees an empty prompt
    with pytest.raises(RankError, match="rank"):
        run_mesh(d, bad, 2, simulate=False, timeout_s=60)


@pytest.mark.parametrize("backend", ["onnx"])
def test_backend_segments_tp2(k3, backend, tmp_path):
    job = _job(1)
    d = compile_mesh(k3, backend, (job["input_ids"],), "tp=2", tmp_path / backend)
    report = compare_mesh(k3, run_mesh(d, job, 2, simulate=False, timeout_s=120), job, Mesh.parse("tp=2"))
    assert report["ok"], report


def test_plan_k3_release():
    p = plan("k3", "tp=8,ep=8", 4096)
    assert len(p["ranks"]) == 64
    # the per-rank weights are the release bytes split: at least 1/64 of the whole
    assert p["ranks"][0]["weight_bytes"] * 64 >= 1.4 * 2**40
    assert p["moe_combine"]["chosen"] in ("all_reduce", "all_to_all")
