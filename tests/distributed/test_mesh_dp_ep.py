"""Data-parallel attention where dp and ep differ, one dividing the other: dp=4,ep=2 (two
expert groups of two copies each: the expert shards copied twice, each group exchanging its
own copies' tokens), the same with tp, dp=2,ep=4 (two copies share each dp index's rows, the
stage one expert group) and dp alone on a model with experts (every copy holds them all).
The eager parts against the one-process model (simulator), each MoE's collectives inside
its rank's expert group; the rank artifacts in four gloo rank processes against it, with the
bytes each collective moved against `k3c plan`; the plan's arithmetic beside what it counts;
the layout and the one-line refusal of the shapes that do not run."""

from __future__ import annotations

import pytest
import torch
from mesh_cases import SMALL, STEPS, T, balanced, bytes_equal_plan, eager_parts, gloo_run_equals_one_process_and_plan

from k3c import models
from k3c.cli import main
from k3c.distributed.diff import compare_mesh
from k3c.distributed.mesh import Mesh
from k3c.distributed.partition import ShardedMoE
from k3c.distributed.state import join_state, split_state
from k3c.errors import UsageError
from k3c.plan import plan
from k3c.plan_devices import device
from k3c.plan_mesh import DeployMesh
from k3c.plan_model import profile
from k3c.plan_roofline import comm_per_token, memory


def _job(batch: int = 4, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 1024, (batch, T + STEPS), generator=g)
    return {"input_ids": ids[:, :T], "decode_ids": ids[:, T:]}


def test_layout():
    m = Mesh.parse("dp=4,ep=2")  # copy a: rows of dp index a, expert shard a % 2
    assert m.world == 4 and [m.coords(r) for r in range(4)] == [(0, 0), (1, 0), (0, 0), (1, 0)]
    assert [m.dp_index(r) for r in range(4)] == [0, 1, 2, 3] and m.token_peers == 1
    assert [m.expert_group(r) for r in (0, 3)] == [[0, 1], [2, 3]] and m.ep_group(2) == [2, 3]
    assert sorted(m.groups()) == [[0, 1], [2, 3]]
    m = Mesh.parse("dp=4,tp=2,ep=2")
    assert m.world == 8 and m.coords(5) == (0, 1) and m.tp_group(5) == [4, 5] and m.ep_group(5) == [5, 7]
    assert m.expert_group(5) == [4, 5, 6, 7] and m.token_peers == 2
    assert m.groups() == [[0, 1], [2, 3], [4, 5], [6, 7], [0, 2], [1, 3], [4, 6], [5, 7], [0, 1, 2, 3], [4, 5, 6, 7]]
    m = Mesh.parse("dp=2,ep=4")  # copies 0, 1 run rows of dp index 0; 2, 3 of dp index 1
    assert m.world == 4 and [m.dp_index(r) for r in range(4)] == [0, 0, 1, 1] and m.token_peers == 2
    assert m.expert_group(3) == [0, 1, 2, 3] and [m.coords(r)[0] for r in range(4)] == [0, 1, 2, 3]
    assert [m.batch_rows(r, 5) for r in (1, 2)] == [slice(0, 2), slice(2, 5)]
    for text in ("dp=4,ep=2", "dp=4,tp=2,ep=2", "dp=2,ep=4", "dp=4"):
        m = Mesh.parse(text)
        assert DeployMesh.parse(text).runtime() == m and Mesh.from_json(m.to_json()) == m
        assert DeployMesh.parse(text).expert_split == m.tp * m.ep
        state = {"layers.0.S": torch.randn(4, 4, 3, 3), "layers.1.ckv": torch.randn(4, 5, 6)}
        joined = join_state([split_state(state, m, r) for r in range(m.world)], m)
        assert all(torch.equal(joined[k], state[k]) for k in state)


def test_refusals_are_one_line(capsys):
    with pytest.raises(UsageError, match=r"dp and ep run where one divides the other .*dp=3,ep=2 is neither"):
        Mesh.parse("dp=3,ep=2")
    with pytest.raises(UsageError, match="pp with ep or dp is plan-only"):
        Mesh.parse("dp=4,ep=2,pp=2")
    assert DeployMesh.parse("dp=4,ep=2,pp=2").plan_only
    assert main(["diff", "--model", "k3-tiny", "--backends", "reference", "--mesh", "dp=6,ep=4"]) == 2
    err = capsys.readouterr().err
    assert "dp=6,ep=4 is neither" in err and err.strip().count("\n") == 0, err


def _in_expert_group(mesh: Mesh, rank: int):
    def check(part):
        moes = [m for m in part.modules() if isinstance(m, ShardedMoE)]
        assert all(m.group == mesh.expert_group(rank) for m in moes)
        assert all(m.peers == mesh.token_peers for m in moes)  # what the all-to-all (ep > 1) exchanges
    return check


@pytest.mark.parametrize("name, mesh", [
    *[("k3-tiny", m) for m in ("dp=4,ep=2", "dp=4,tp=2,ep=2", "dp=2,ep=4", "dp=4", "dp=2,tp=2")],
    ("kimi-linear-tiny", "dp=4,ep=2"), ("kimi-linear-tiny", "dp=2,ep=4")])
def test_partitioned_eager_matches_one_process(name, mesh):
    """Each copy its rows of a batch of 4, the state joined back; the routed experts combined
    within the rank's expert group (all-to-all with ep, never an all-reduce over copies)."""
    model = models.build(name, **SMALL).eval()
    m, job = Mesh.parse(mesh), _job()
    results, comms = eager_parts(model, m, job, check=lambda part: _in_expert_group(m, part.rank)(part))
    report = compare_mesh(model, results, job, m)
    assert report["ok"], report
    for c in comms:
        assert (c.calls.get("all_to_all", 0) > 0) == (m.ep > 1)
        assert ("all_reduce" in c.calls) == (m.tp > 1)


def test_rank_processes_bytes_equal_the_plan(tmp_path):
    """dp=4 x ep=2 in four gloo processes on reference rank artifacts, a batch of 8 (2 rows a
    copy): against the one-process model (prefill, decode, the state joined back), and the
    bytes each rank handed torch.distributed per primitive equal to what `k3c plan` predicts.
    (About 10 s on two cores, most of it the capture.)"""
    gloo_run_equals_one_process_and_plan("reference", "dp=4,ep=2", 8, 7, tmp_path)


@pytest.mark.parametrize("mesh", ["dp=4,ep=2", "dp=4,tp=2,ep=2", "dp=2,ep=4"])
def test_simulated_bytes_equal_the_plan_and_its_arithmetic(mesh):
    """The eager parts in the simulator (which counts what it is handed as the rank processes
    do): the bytes equal the plan; the roofline's arithmetic prices the same collectives (but
    for the row counts, spread over 2^16 tokens there) and the same weights a rank holds. Two
    rows a dp copy, so a decode step's tokens split evenly over the ranks that share them."""
    m = Mesh.parse(mesh)
    rows = 2
    model, job = balanced(rows * m.dp, 8)
    results, comms = eager_parts(model, m, job)
    assert compare_mesh(model, results, job, m)["ok"]
    for res, c in zip(results, comms):
        res["sent"], res["calls"] = dict(c.sent), dict(c.calls)
    dec = bytes_equal_plan(model, m, results, rows)
    arithmetic = comm_per_token(profile(model, "k3-tiny"), DeployMesh.parse(mesh), 0)
    assert {op: v["count"] for op, v in arithmetic.items()} == {op: v["count"] for op, v in dec.items()}
    if "all_reduce" in dec:
        assert arithmetic["all_reduce"]["bytes"] == pytest.approx(dec["all_reduce"]["bytes"], rel=1e-12)
    counts = 8 * (m.tp * m.ep - 1) * (dec["all_to_all"]["count"] // 4)  # each dispatch's row counts
    exchanged = dec["all_to_all"]["bytes"] - counts / rows
    assert arithmetic["all_to_all"]["bytes"] - counts / 2**16 == pytest.approx(exchanged, rel=1e-12)
    counted = plan("k3-tiny", mesh, T, model=model, batch=rows)["ranks"][0]["weight_bytes"]
    held = memory(profile(model, "k3-tiny"), DeployMesh.parse(mesh), device("h200"), 1, T)["stages"][0]
    assert held["weight_bytes"] == pytest.approx(counted, rel=1e-4)
