"""Pipeline stages (pp, and pp x tp): the mesh's layout, the meshes refused with one line, and
the rank artifacts of k3-tiny and kimi-linear-tiny cut into stages against the one-process eager
model (prefill in micro-batches, decode steps, the state joined from the stages), with the bytes
each rank hands over point-to-point and to its collectives equal to `k3c plan`'s per stage. The
spawning tests (gloo processes) are in the slow tier; each run is bounded by its timeout."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from mesh_cases import SMALL, STEPS, B, T

from k3c import models
from k3c.cli import main
from k3c.distributed.diff import compare_mesh, run_mesh
from k3c.distributed.mesh import Mesh, check_divides, stage_layers
from k3c.distributed.pipeline import cut_stages
from k3c.distributed.runner import compile_mesh
from k3c.distributed.simulate import RankError
from k3c.distributed.spawn import spawn
from k3c.errors import UsageError
from k3c.ir.interpret import interpret
from k3c.ir.text import parse
from k3c.numerics import assert_close
from k3c.plan import plan
from k3c.plan_mesh import DeployMesh
from k3c.plan_model import profile
from k3c.plan_roofline import comm_per_token

GOLDEN = Path(__file__).resolve().parents[1] / "passes" / "golden" / "k3-tiny.decode.k3c"


def _job(model, steps: int = STEPS, seed: int = 0, micro: int = 2) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (B, T + steps), generator=g)
    return {"input_ids": ids[:, :T], "decode_ids": ids[:, T:], "micro_batches": micro}


def test_layout_of_stages():
    mesh = Mesh.parse("pp=2,tp=2")
    assert (mesh.world, mesh.stage_ranks, [mesh.stage(r) for r in range(4)]) == (4, 2, [0, 0, 1, 1])
    assert mesh.tp_group(3) == [2, 3] and mesh.tp_group(0) == [0, 1] and mesh.stage_group(2) == [2, 3]
    assert mesh.groups() == [[0, 1], [2, 3]]  # each stage's tp group is the stage: made once
    assert Mesh.from_json(mesh.to_json()) == mesh and Mesh.parse(str(mesh)) == mesh
    # the plan's stages are the runtime's
    assert DeployMesh.parse("pp=3").stages(9) == stage_layers(9, 3) == [range(0, 3), range(3, 6), range(6, 9)]
    assert DeployMesh.parse("pp=2,tp=2").runtime() == mesh and DeployMesh.parse("pp=2,ep=2").plan_only


@pytest.mark.parametrize("text, says", [
    ("pp=2,ep=2", "pp with ep or dp is plan-only"),
    ("pp=0", "pp must be a whole number >= 1"),
    ("pp=2,pp=2", "pp is given twice"),
])
def test_unsupported_meshes_are_one_line(text, says):
    with pytest.raises(UsageError, match=says) as e:
        Mesh.parse(text)
    assert "\n" not in str(e.value)


def test_more_stages_than_layers_and_a_zoo_model_are_refused():
    with pytest.raises(UsageError, match=r"pp=3 stages for 2 layers"):
        check_divides(Mesh.parse("pp=3"), models.build("k3-tiny", **SMALL, device="meta").config)
    with pytest.raises(UsageError, match="pipeline stages .pp. take the Kimi family"):
        check_divides(Mesh.parse("pp=2"), models.build("gated-deltanet-tiny", device="meta").config)


def test_cli_refuses_an_indivisible_pipeline_with_one_line(capsys):
    assert main(["diff", "--model", "gated-deltanet-tiny", "--backends", "reference", "--mesh", "pp=2"]) == 2
    err = capsys.readouterr().err
    assert "take the Kimi family" in err and err.strip().count("\n") == 0, err


@pytest.mark.parametrize("pp", [3])  # two boundaries: the bank relayed through the middle stage
def test_stages_of_the_k3_tiny_decode_graph_chain_to_the_whole(pp):
    """The k3-tiny decode graph after the default passes (the IR golden), cut into pp stages and
    run one after another by the IR interpreter, each fed what the one before handed over,
    equals the whole graph; what crosses each boundary is what the plan prices (the AttnRes
    bank and the partial sum, [B, 1, d] each) and each stage holds the weights of its layers."""
    g = parse(GOLDEN.read_text())
    model = models.build("k3-tiny").eval()
    named = dict(model.state_dict())
    gen = torch.Generator().manual_seed(0)
    g.weights = {w: named[w] if w in named and named[w].shape == t.shape else 0.02 * torch.randn(t.shape, generator=gen)
                 for w, t in g.weights.items()}
    state = {n: 0.1 * torch.randn([2 if str(d) == "B" else 3 if str(d) == "P" else d for d in g.types[n].shape],
                                  generator=gen) for n in g.inputs[1:]}
    inputs = {"input_ids": torch.tensor([[5], [17]]), **state}
    whole = dict(zip([k for k, _ in g.outputs], interpret(g, *[inputs[n] for n in g.inputs])))
    layers = stage_layers(model.config.num_layers, pp)
    stages = cut_stages(g, pp, layers)
    prof, mesh = profile(model, "k3-tiny"), DeployMesh.parse(f"pp={pp}")
    env, joined = dict(inputs), {}
    for s, st in enumerate(stages):
        out = dict(zip([k for k, _ in st.graph.outputs], interpret(st.graph, *[env[n] for n in st.graph.inputs])))
        joined.update({k: v for k, v in out.items() if k not in st.send})
        env.update({v: out[v] for v in st.send if v in out})
        held = {int(w.split(".")[2]) for w in st.graph.weights if w.startswith("model.layers.")}
        assert held == set(layers[s]), (s, held)
        # a stage's rank has the token ids, its own layers' state and what it received: no more
        assert all(i == "input_ids" or i in st.recv or int(i.split(".")[1]) in layers[s] for i in st.graph.inputs)
        if s < pp - 1:
            want = comm_per_token(prof, mesh, s)["send"]
            assert len(st.send) == want["count"] and st.send == stages[s + 1].recv
            assert all(str(g.types[v]) == "f32[B, 1, 256]" for v in st.send)
    assert stages[-1].send == [] and set(joined) == set(whole)
    for k in whole:
        assert_close(joined[k], whole[k], what=k)


def _bytes_equal_plan(name: str, model, mesh: Mesh, results: list[dict], job: dict) -> None:
    """Each rank's bytes and calls per primitive equal its stage's per-token figures in the plan
    times the tokens it ran (the prefill's micro-batches are passes of their own)."""
    steps, micro = job["decode_ids"].shape[1], job["micro_batches"]
    p = plan(name, DeployMesh.parse(str(mesh)), T, model=model, batch=B)
    for r, res in enumerate(results):
        want = p["per_stage"][mesh.stage(r)]
        assert set(res["sent"]) == set(want), (r, res["sent"], want)
        for op, v in want.items():
            assert res["sent"][op] == pytest.approx(v["bytes"] * B * (T + steps), rel=1e-12, abs=0), (r, op)
            assert res["calls"][op] == v["count"] * (micro + steps), (r, op)
    assert "send" in p["per_stage"][0] and "send" not in p["per_stage"][-1]


@pytest.mark.slow
def test_pp2_in_the_simulator_against_eager_and_plan(tmp_path):
    """pp=2 on a two-layer k3-tiny (the second stage holds the MLA layer and its MoE), reference
    rank artifacts run by the simulator (threads: what the rank processes run, without them)."""
    model = models.build("k3-tiny", **SMALL).eval()
    mesh, job = Mesh.parse("pp=2"), _job(model)
    d = compile_mesh(model, "reference", (job["input_ids"],), mesh, tmp_path)
    results = run_mesh(d, job, mesh.world, simulate=True, timeout_s=60)
    report = compare_mesh(model, results, job, mesh)
    assert report["ok"], report
    assert results[0]["logits"] is None and results[1]["logits"] is not None
    assert set(results[0]["state"]) == {n for n in report_state(model) if n.startswith("layers.0.")}
    _bytes_equal_plan("k3-tiny", model, mesh, results, job)


def report_state(model) -> list[str]:
    with torch.no_grad():
        return list(model.prefill(torch.zeros(1, 2, dtype=torch.long))[1])


@pytest.mark.slow
@pytest.mark.parametrize("name, mesh, backend, overrides", [
    ("k3-tiny", "pp=2", "reference", {}),                  # nine layers: the AttnRes bank crosses
    ("k3-tiny", "pp=2,tp=2", "reference", SMALL),          # four processes: tp inside each stage
    ("kimi-linear-tiny", "pp=2", "onnx", {}),
    ("kimi-linear-tiny", "pp=2,tp=2", "reference", SMALL),  # four processes
    ("k3-tiny", "pp=2", "tvm", {}),                        # a TVM build per stage: minutes on two cores
])
def test_rank_processes_against_eager_and_plan(tmp_path, name, mesh, backend, overrides):
    """Gloo rank processes, 20 decode steps: logits (the last stage), the state joined from the
    stages, and every rank's bytes per primitive equal the plan's for its stage."""
    model = models.build(name, **overrides).eval()
    mesh, job = Mesh.parse(mesh), _job(model, steps=20)
    d = compile_mesh(model, backend, (job["input_ids"],), mesh, tmp_path)
    results = run_mesh(d, job, mesh.world, timeout_s=300)
    report = compare_mesh(model, results, job, mesh)
    assert report["ok"], report
    _bytes_equal_plan(name, model, mesh, results, job)


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG")
def test_a_killed_stage_is_named_and_nothing_is_left(tmp_path):
    """The second stage killed while the run goes on: named within seconds (the
    run's timeout is 60 s), every rank reaped, the run's folder removed."""
    model = models.build("k3-tiny", **SMALL).eval()
    job = _job(model, steps=200)
    d = compile_mesh(model, "reference", (job["input_ids"],), "pp=2", tmp_path / "mesh")
    seen = []

    def kill_stage_1(procs):
        seen.extend(procs)
        threading.Timer(1.0, procs[1].kill).start()
    t0 = time.monotonic()
    with pytest.raises(RankError, match="rank 1 was killed by SIGKILL"):
        spawn(d, job, 2, timeout_s=60, started=kill_stage_1)
    assert time.monotonic() - t0 < 20
    assert all(p.poll() is not None for p in seen)
    work = Path(seen[0].args[-1])
    assert work.name.startswith("k3c-ranks-") and not work.exists()
