"""The vocabulary split over tp (a mesh with "vocab"): the embedding by rows, the lm_head by
output columns. The eager parts and the reference artifacts against the one-process model,
the bytes of the all_gather against `k3c plan`, and the weights a rank no longer holds."""

from __future__ import annotations

import pytest
from mesh_cases import SMALL, STEPS, B, T, eager_parts
from mesh_cases import job as _job

from k3c import models
from k3c.distributed.diff import compare_mesh, run_mesh
from k3c.distributed.mesh import Mesh
from k3c.distributed.partition import partition
from k3c.distributed.runner import compile_mesh
from k3c.errors import UsageError
from k3c.plan import plan


def test_mesh_text_and_errors():
    assert Mesh.parse("tp=2,vocab") == Mesh(2, 1, True) and str(Mesh(2, 2, True)) == "tp=2,ep=2,vocab"
    with pytest.raises(UsageError, match="'vocab' splits the vocabulary over tp, and tp is 1"):
        Mesh.parse("ep=2,vocab")
    model = models.build("k3-tiny", **SMALL, vocab_size=1000)
    with pytest.raises(UsageError, match="tp=16 does not divide the 1000 vocabulary entries"):
        partition(model, "tp=16,vocab", 0)


@pytest.mark.parametrize("name", ["k3-tiny", "kimi-linear-tiny"])
def test_partitioned_eager_matches_one_process(name):
    model = models.build(name, **SMALL).eval()
    m, job = Mesh.parse("tp=2,ep=2,vocab"), _job()

    def halved_head(part):
        assert part.lm_head.weight.shape[0] == model.config.vocab_size // 2
    results, comms = eager_parts(model, m, job, check=halved_head)
    assert compare_mesh(model, results, job, m)["ok"]
    assert all(c.calls["all_gather"] == 3 for c in comms)  # the logits, once a pass


def test_reference_artifacts_and_plan_bytes(tmp_path):
    model = models.build("k3-tiny", **SMALL).eval()
    m, job = Mesh.parse("tp=2,vocab"), _job(1)
    d = compile_mesh(model, "reference", (job["input_ids"],), m, tmp_path)
    res = run_mesh(d, job, m.world, simulate=True)
    assert compare_mesh(model, res, job, m)["ok"]
    p = plan("k3-tiny", m, T, model=model, batch=B)
    pre, dec = p["per_token"]["prefill"]["all_gather"], p["per_token"]["decode"]["all_gather"]
    V = model.config.vocab_size
    assert pre["bytes"] == dec["bytes"] == V // 2 * 4  # each rank's half of a token's fp32 logits
    for r in res:
        assert r["sent"]["all_gather"] == pytest.approx(pre["bytes"] * B * T + dec["bytes"] * B * STEPS)
    # what a rank no longer holds: half the embedding and half the lm_head (and it holds the
    # int64 offset of its rows)
    whole = plan("k3-tiny", "tp=2", T, model=model, batch=B)["ranks"][0]["weight_bytes"]
    table = model.model.embed_tokens.weight.nbytes + model.lm_head.weight.nbytes
    assert whole - p["ranks"][0]["weight_bytes"] == table // 2 - 8
