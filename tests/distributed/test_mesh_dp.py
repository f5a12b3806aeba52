"""Data-parallel attention with expert parallelism (dp=N,ep=N, and with tp): each copy runs its
own batch rows on whole attention weights, the routed experts spread over the copies and
reached by all-to-all. The eager parts against the one-process model (simulator); the rank
artifacts in gloo rank processes against it; the bytes each collective moved in that run
against what `k3c plan` predicts for the mesh; the layout and its one-line refusals. (The
kimi-linear-tiny and 20-step runs of `k3c diff --mesh dp=2,ep=2` are README's commands; dp and
ep of different sizes: test_mesh_dp_ep.py.)"""

from __future__ import annotations

import pytest
import torch
from mesh_cases import SMALL, balanced, bytes_equal_plan, eager_parts, gloo_run_equals_one_process_and_plan
from mesh_cases import job as _job

from k3c import models
from k3c.distributed.diff import compare_mesh
from k3c.distributed.mesh import Mesh
from k3c.distributed.partition import partition
from k3c.distributed.state import join_state, split_state
from k3c.errors import UsageError
from k3c.plan_mesh import DeployMesh
from k3c.plan_model import profile
from k3c.plan_roofline import comm_per_token


@pytest.mark.parametrize("name", ["k3-tiny", "kimi-linear-tiny"])
@pytest.mark.parametrize("mesh", ["dp=2,ep=2", "dp=2,tp=2,ep=2"])
def test_partitioned_eager_matches_one_process(name, mesh):
    """Each rank gets its copy's row of the batch of 2; its logits are that row's, its state
    that row's heads; every MoE layer exchanges tokens (all-to-all), none sums over copies."""
    model = models.build(name, **SMALL).eval()
    m, job = Mesh.parse(mesh), _job()
    results, comms = eager_parts(model, m, job)
    assert all(r["logits"].shape[0] == 1 for r in results)
    report = compare_mesh(model, results, job, m)
    assert report["ok"], report
    assert all(c.calls["all_to_all"] > 0 for c in comms)
    if m.tp == 1:  # nothing is summed over the copies: their tokens differ
        assert all("all_reduce" not in c.calls for c in comms)


def test_dp_alone_on_a_model_without_experts():
    """Gated DeltaNet on dp=2 x tp=2: each copy its row, the heads over its tp group, the
    all-reduces within the tp group only (2 ranks each)."""
    model = models.build("gated-deltanet-tiny").eval()
    m, job = Mesh.parse("dp=2,tp=2"), _job(7)
    results, comms = eager_parts(model, m, job)
    assert compare_mesh(model, results, job, m)["ok"]
    assert all(c.calls["all_reduce"] > 0 and set(c.calls) == {"all_reduce"} for c in comms)


def test_mxfp4_experts():
    """Packed MXFP4 routed experts (as K3 is released) split over the copies like dense ones."""
    model = models.build("k3-tiny", experts="mxfp4", **SMALL).eval()
    m, job = Mesh.parse("dp=2,tp=2,ep=2"), _job(4)
    results, _ = eager_parts(model, m, job)
    report = compare_mesh(model, results, job, m)
    assert report["ok"], report


def test_layout_and_refusals():
    m = Mesh.parse("dp=2,tp=2,ep=2")
    assert m.world == 4 and m.tp_group(3) == [2, 3] and m.ep_group(1) == [1, 3]
    assert [m.dp_index(r) for r in range(4)] == [0, 0, 1, 1]
    assert [m.batch_rows(r, 5) for r in (0, 3)] == [slice(0, 2), slice(2, 5)]
    assert Mesh.from_json(m.to_json()) == m and str(m) == "dp=2,tp=2,ep=2"
    assert DeployMesh.parse("dp=2,ep=2").runtime() == Mesh(1, 2, dp=2)
    assert DeployMesh.parse("dp=2,ep=4").runtime() == Mesh(1, 4, dp=2)  # more in test_mesh_dp_ep.py
    state = {"layers.0.S": torch.randn(4, 4, 3, 3), "layers.1.ckv": torch.randn(4, 5, 6)}
    joined = join_state([split_state(state, m, r) for r in range(m.world)], m)
    assert all(torch.equal(joined[k], state[k]) for k in state)
    with pytest.raises(UsageError, match="dp=3,ep=2 is neither"):
        Mesh.parse("dp=3,ep=2")
    with pytest.raises(UsageError, match="pp with ep or dp is plan-only"):
        Mesh.parse("dp=2,ep=2,pp=2")
    with pytest.raises(UsageError, match="combine by all_to_all only"):
        partition(models.build("k3-tiny", **SMALL), "dp=2,ep=2", 0, combine="all_reduce")
    with pytest.raises(UsageError, match="a batch of 1 sequence.s. cannot give each of the 2"):
        m.batch_rows(0, 1)


def test_rank_processes_bytes_equal_the_plan(tmp_path):
    """dp=2 x ep=2 in two gloo processes on ONNX rank artifacts, a batch of 4 (2 rows a copy):
    against the one-process model (prefill, decode, the state joined back), and the bytes each
    rank handed torch.distributed per primitive equal to what `k3c plan` predicts."""
    gloo_run_equals_one_process_and_plan("onnx", "dp=2,ep=2", 4, 5, tmp_path)


def test_with_tp_bytes_equal_the_plan_and_its_arithmetic():
    """dp=2 x tp=2 x ep=2 (the eager parts in the simulator, which counts what it is handed as
    the rank processes do: tests/distributed/test_mesh.py): the all-reduces of tp and the
    all-to-alls equal the plan, and the roofline's arithmetic prices the same collectives."""
    model, job = balanced(4, 6)
    mesh = Mesh.parse("dp=2,tp=2,ep=2")
    results, comms = eager_parts(model, mesh, job)
    assert compare_mesh(model, results, job, mesh)["ok"]
    for res, c in zip(results, comms):
        res["sent"], res["calls"] = dict(c.sent), dict(c.calls)
    dec = bytes_equal_plan(model, mesh, results, 2)
    assert set(dec) == {"all_reduce", "all_to_all"}
    # the same bytes but for the row counts each dispatch exchanges (8 B to each other rank a
    # call), which the arithmetic spreads over 2^16 tokens where a decode step of 2 rows has 2
    arithmetic = comm_per_token(profile(model, "k3-tiny"), DeployMesh.parse(str(mesh)), 0)
    assert {op: v["count"] for op, v in arithmetic.items()} == {op: v["count"] for op, v in dec.items()}
    assert arithmetic["all_reduce"]["bytes"] == pytest.approx(dec["all_reduce"]["bytes"], rel=1e-12)
    counts = 8 * (mesh.world - 1) * (dec["all_to_all"]["count"] // 4)
    exchanged = dec["all_to_all"]["bytes"] - counts / 2
    assert arithmetic["all_to_all"]["bytes"] - counts / 2**16 == pytest.approx(exchanged, rel=1e-12)
