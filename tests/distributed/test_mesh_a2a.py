"""Expert parallelism by all-to-all (partition combine="all_to_all"): each rank sends its token
slice's slots to the ranks holding their experts' columns (moe_dispatch) and takes the outputs
back (moe_combine). The eager parts against the one-process model; the artifacts (reference
in rank processes and in the simulator, onnx in rank processes) against it; the bytes a real
run sends against a count made from the one-process model's own routing; the cost model's
choice."""

from __future__ import annotations

import pytest
import torch
from mesh_cases import SMALL, STEPS, B, T, eager_parts
from mesh_cases import job as _job

from k3c import models
from k3c.distributed.diff import compare_mesh, run_mesh
from k3c.distributed.mesh import Mesh
from k3c.distributed.partition import combine_report, partition
from k3c.distributed.runner import compile_mesh, rank_graphs
from k3c.errors import UsageError
from k3c.kernels.collectives import token_slice
from k3c.models.moe_layer import MoE
from k3c.plan import plan

MESH = Mesh.parse("tp=2,ep=2")


@pytest.mark.parametrize("name", ["k3-tiny", "kimi-linear-tiny"])
@pytest.mark.parametrize("mesh", ["ep=2", "tp=2,ep=2"])
def test_partitioned_eager_matches_one_process(name, mesh):
    model = models.build(name, **SMALL).eval()
    m, job = Mesh.parse(mesh), _job()
    results, comms = eager_parts(model, m, job, combine="all_to_all")
    report = compare_mesh(model, results, job, m)
    assert report["ok"], report
    assert all(c.calls["all_to_all"] > 0 for c in comms)


@pytest.fixture(scope="module")
def k3():
    return models.build("k3-tiny", **SMALL).eval()


@pytest.fixture(scope="module")
def captured(k3):
    return list(rank_graphs(k3, MESH, (_job()["input_ids"],), combine="all_to_all"))


def _routing(model: torch.nn.Module, job: dict) -> list[torch.Tensor]:
    """The expert ids [N, k] of every MoE call of the one-process model on the job, in order."""
    seen = []
    for m in model.modules():
        if isinstance(m, MoE):
            def route(x2, _route=m.route):
                idx, w = _route(x2)
                seen.append(idx)
                return idx, w
            m.route = route
    try:
        with torch.no_grad():
            _, s = model.prefill(job["input_ids"])
            for i in range(job["decode_ids"].shape[1]):
                _, s = model.decode(job["decode_ids"][:, i:i + 1], s)
    finally:
        for m in model.modules():
            if isinstance(m, MoE):
                del m.route
    return seen


def _bytes_from_routing(idx_calls: list[torch.Tensor], mesh: Mesh, experts: int, width: int) -> list[int]:
    """What each rank hands torch.distributed for the dispatch and combine, counted from the
    routing: rank r takes tokens token_slice(N, r, W); each slot (token, expert e) goes to the
    tp ranks (e // n) tp + t; rows are fp32 [width], expert ids and row counts int64."""
    W, n = mesh.world, experts // mesh.ep
    sent = [0] * W
    for idx in idx_calls:
        N = idx.shape[0]
        dest = [[] for _ in range(W)]  # per sender: the destination of each slot it sends
        for r in range(W):
            lo, hi = token_slice(N, r, W)
            dest[r] = [int(e) // n * mesh.tp + t for e in idx[lo:hi].reshape(-1) for t in range(mesh.tp)]
        for r in range(W):
            lo, hi = token_slice(N, r, W)
            away = sum(d != r for d in dest[r])
            came = sum(d == r for s in range(W) if s != r for d in dest[s])
            sent[r] += away * (width * 4 + 8) + 8 * (W - 1)  # rows + ids, and the counts exchanged
            sent[r] += came * width * 4 + (W - 1) * (hi - lo) * width * 4  # outputs back, slices gathered
    return sent


def test_rank_processes_agree_with_simulator_eager_and_routing(k3, captured, tmp_path):
    job = _job()
    d = compile_mesh(k3, "reference", (), MESH, tmp_path, captured=captured, combine="all_to_all")
    real = run_mesh(d, job, MESH.world, simulate=False, timeout_s=120)
    report = compare_mesh(k3, real, job, MESH)
    assert report["ok"], report
    sim = run_mesh(d, job, MESH.world, simulate=True)
    for s, r in zip(sim, real):
        torch.testing.assert_close(s["logits"], r["logits"], rtol=0, atol=1e-5)
        assert s["sent"] == r["sent"] and s["calls"] == r["calls"]
    moe = next(m for m in k3.modules() if isinstance(m, MoE))
    want = _bytes_from_routing(_routing(k3, job), MESH, moe.experts.w13.shape[0],
                               moe.routed_expert_down_proj.out_features)
    assert [r["sent"]["all_to_all"] for r in real] == want
    # four all-to-alls per MoE layer and pass (rows, ids, outputs back, slices), as the plan counts
    p = plan("k3-tiny", MESH, T, model=k3, batch=B, combine="all_to_all")
    count = p["per_token"]["prefill"]["all_to_all"]["count"]
    assert count == 4 * sum(isinstance(m, MoE) for m in k3.modules())
    assert all(r["calls"]["all_to_all"] == count * (1 + STEPS) for r in real)


def test_onnx_rank_processes(k3, captured, tmp_path):
    job = _job(1)
    d = compile_mesh(k3, "onnx", (), MESH, tmp_path, captured=captured, combine="all_to_all")
    report = compare_mesh(k3, run_mesh(d, job, MESH.world, simulate=False, timeout_s=120), job, MESH)
    assert report["ok"], report


def test_the_cost_model_chooses_and_plan_reports():
    """The all-to-all sends about (2 top_k / ep + 1) (M - 1) / M rows a token against the
    all-reduce's 2 (M - 1) / M: the all-reduce until ep passes 2 top_k. k3 (top_k 16) on
    the meta device: all-reduce at ep=8, all-to-all at ep=64, and what ran is what plan counts."""
    k3 = models.build("k3", device="meta", dtype=torch.bfloat16, experts="mxfp4")
    small, large = combine_report(k3, Mesh(1, 8)), combine_report(k3, Mesh(1, 64))
    assert small["run"] == "all_reduce" and large["run"] == "all_to_all"
    assert large["all_to_all_bytes_per_token"] < large["all_reduce_bytes_per_token"]
    p = plan("k3", "ep=64", 256, model=k3)
    assert "all_reduce" not in p["per_token"]["prefill"]  # no tp, and the experts exchanged
    assert p["moe_combine"]["run"] == "all_to_all"
    assert p["per_token"]["prefill"]["all_to_all"]["bytes"] == pytest.approx(large["all_to_all_bytes_per_token"],
                                                                            rel=1e-3)
    with pytest.raises(UsageError, match="combine must be one of"):
        partition(models.build("k3-tiny", **SMALL), "ep=2", 0, combine="ring")
