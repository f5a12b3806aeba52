"""Tensor and expert parallelism: the partition against the one-process eager model, per-rank
artifacts (reference, onnx, tvm) in gloo rank processes and in the simulator, the simulator
against the real run, and the bytes a run sends against `k3c plan`. One capture of the
tp=2 x ep=2 ranks serves every backend."""

from __future__ import annotations

import pytest
import torch
from mesh_cases import SMALL, STEPS, B, T, eager_parts
from mesh_cases import job as _job

from k3c import models
from k3c.distributed.diff import compare_mesh, run_mesh
from k3c.distributed.mesh import Mesh
from k3c.distributed.partition import partition
from k3c.distributed.runner import compile_mesh, rank_graphs
from k3c.distributed.simulate import RankError
from k3c.distributed.spawn import spawn
from k3c.errors import UsageError
from k3c.plan import plan

MESH = Mesh.parse("tp=2,ep=2")


@pytest.fixture(scope="module")
def k3():
    return models.build("k3-tiny", **SMALL).eval()


@pytest.fixture(scope="module")
def mesh_dir(k3, tmp_path_factory):
    """backend -> the tp=2 x ep=2 artifact of k3 (compiled on first use, from one capture)."""
    captured = list(rank_graphs(k3, MESH, (_job()["input_ids"],)))
    made = {}

    def get(backend):
        if backend not in made:
            made[backend] = compile_mesh(k3, backend, (), MESH, tmp_path_factory.mktemp(backend), captured=captured)
        return made[backend]
    return get


def test_mesh_errors(k3):
    with pytest.raises(UsageError, match="expected axes"):
        Mesh.parse("tp=2,xp=2")
    with pytest.raises(UsageError, match="tp=3 does not divide the 4 KDA heads"):
        partition(k3, "tp=3", 0)
    with pytest.raises(UsageError, match="ep=3 does not divide the 8 routed experts"):
        partition(k3, "ep=3", 0)


@pytest.mark.parametrize("name", ["k3-tiny", "kimi-linear-tiny"])
@pytest.mark.parametrize("mesh", ["tp=2", "ep=2", "tp=2,ep=2"])
def test_partitioned_eager_matches_one_process(name, mesh):
    """Each rank's eager part, all run in the simulator, against the whole model (fp32 row),
    decode fed each rank's own state shard; the state joined from the shards."""
    model = models.build(name, **SMALL).eval()
    m, job = Mesh.parse(mesh), _job()
    results, _ = eager_parts(model, m, job)
    report = compare_mesh(model, results, job, m)
    assert report["ok"], report


def test_rank_processes_agree_with_simulator_eager_and_plan(k3, mesh_dir):
    d, job = mesh_dir("reference"), _job()
    real = run_mesh(d, job, MESH.world, simulate=False, timeout_s=120)
    report = compare_mesh(k3, real, job, MESH)
    assert report["ok"], report
    sim = run_mesh(d, job, MESH.world, simulate=True)
    for s, r in zip(sim, real):
        torch.testing.assert_close(s["logits"], r["logits"], rtol=0, atol=1e-5)
        torch.testing.assert_close(s["decode_logits"], r["decode_logits"], rtol=0, atol=1e-5)
        assert s["sent"] == r["sent"] and s["calls"] == r["calls"]
    # bytes counted from the tensors torch.distributed was handed, against the plan (the rank's
    # eager model on meta tensors under a communicator that only counts)
    p = plan("k3-tiny", MESH, T, model=k3, batch=B)
    pre, dec = p["per_token"]["prefill"]["all_reduce"], p["per_token"]["decode"]["all_reduce"]
    for r in real:
        assert r["sent"]["all_reduce"] == pytest.approx(pre["bytes"] * B * T + dec["bytes"] * B * STEPS)
        assert r["calls"]["all_reduce"] == pre["count"] + dec["count"] * STEPS


def test_onnx_simulated(k3, mesh_dir):
    """The ONNX rank artifacts (the simulator stands for the processes: the test above shows
    it agrees with them)."""
    job = _job(1)
    report = compare_mesh(k3, run_mesh(mesh_dir("onnx"), job, MESH.world, simulate=True), job, MESH)
    assert report["ok"], report


@pytest.fixture(scope="module")
def one_layer():
    """One layer (KDA and a MoE, so both groups' collectives), captured once, for the
    backends whose builds or kernels cost most (tvm builds it once for the four ranks)."""
    model = models.build("k3-tiny", num_layers=1, mla_layers=(), first_k_dense=0).eval()
    return model, list(rank_graphs(model, MESH, (_job()["input_ids"],)))


@pytest.mark.parametrize("backend", ["tvm", "triton"])
def test_one_layer_simulated(one_layer, backend, tmp_path):
    model, captured = one_layer
    job = _job(2)
    d = compile_mesh(model, backend, (), MESH, tmp_path, captured=captured)
    report = compare_mesh(model, run_mesh(d, job, MESH.world, simulate=True), job, MESH)
    assert report["ok"], report


def test_kimi_linear_artifacts_simulated(tmp_path):
    model = models.build("kimi-linear-tiny", **SMALL).eval()
    job = _job(3)
    d = compile_mesh(model, "reference", (job["input_ids"],), MESH, tmp_path)
    report = compare_mesh(model, run_mesh(d, job, MESH.world, simulate=True), job, MESH)
    assert report["ok"], report


def test_dead_rank_is_reported(mesh_dir):
    """One process for a four-rank artifact: the rank exits with an error, which is named."""
    with pytest.raises(RankError, match="rank 0 exited with status 1: .*a mesh of 4 ranks, the launch has 1"):
        spawn(mesh_dir("reference"), _job(), 1, timeout_s=60)


def test_plan_release_bytes():
    """kimi-linear as released (BF16) on tp=4 x ep=8: the per-rank weights against the model's
    own release bytes, split as the partition says (heads and widths over tp, experts over
    all 32 ranks, the rest replicated)."""
    from k3c.models.weight_bytes import weight_bytes

    p = plan("kimi-linear", "tp=4,ep=8", 64)
    assert len(p["ranks"]) == 32 and p["mesh"] == {"tp": 4, "ep": 8, "world": 32, "vocab": False,
                                                 "dp": 1, "pp": 1, "plan_only": False}
    total = weight_bytes(models.build("kimi-linear", dtype=torch.bfloat16))["total"]
    assert total / 32 < p["ranks"][0]["weight_bytes"] < total / 4
    cfg = models.build("kimi-linear").config
    moe_layers = cfg.num_layers - cfg.first_k_dense
    # per pass: one all-reduce per mixer and dense MLP, two per MoE layer (routed, shared)
    assert p["per_token"]["decode"]["all_reduce"]["count"] == cfg.num_layers + cfg.first_k_dense + 2 * moe_layers
