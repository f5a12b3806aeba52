"""k3c diff's worker process (k3c/diff_runs.py): the runs it returns are the runs made in this
process on the same artifact, a failure there is a failed backend with its reason, and the
diff of an interpreted backend goes through it and still checks it."""

from __future__ import annotations

import pytest
import torch
from factories import example_ids

import k3c
from k3c.compiler import capture_entries, prepare
from k3c.diff import backend_for, diff
from k3c.diff_runs import Names, Worker, run_artifact


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    model = k3c.models.build("gpt2-tiny")
    ids = example_ids(model, 2, 12)
    be = backend_for("reference")
    graphs = prepare(capture_entries(model, (ids[:, :8],), entries=("prefill", "decode")), be)
    out = tmp_path_factory.mktemp("artifact") / "reference"
    k3c.backends.artifact.write(be, graphs, out)
    return be, graphs, out, ids


def test_the_workers_runs_are_the_runs_made_here(built):
    be, graphs, out, ids = built
    here = run_artifact(be.load(out), ids, 9, 3, Names.of(graphs))
    worker = Worker()
    try:
        worker.submit("reference", out, ids, 9, 3, Names.of(graphs))
        there = worker.result("reference")
    finally:
        worker.close()
    assert there.error is None and len(there.steps) == len(here.steps) == 3
    for a, b in zip([there.prefill, *there.steps], [here.prefill, *here.steps]):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, rtol=0, atol=0)  # the same artifact on the same inputs


def test_a_failure_in_the_worker_is_named(built, tmp_path):
    _, graphs, _, ids = built
    worker = Worker()
    try:
        worker.submit("reference", tmp_path, ids, 9, 1, Names.of(graphs))  # no artifact there
        with pytest.raises(RuntimeError, match="manifest"):
            worker.result("reference")
    finally:
        worker.close()


def test_an_interpreted_backend_is_checked_through_the_worker(monkeypatch):
    """With the reference backend taken for an interpreted one, its runs come from the worker,
    and the diff still fails a wrong answer: the check is made on what the worker returned."""
    import k3c.diff as diff_mod

    submitted = []
    real_submit = Worker.submit
    import k3c.diff_builds as builds_mod

    for mod in (diff_mod, builds_mod):  # where the order of the builds and the checks is decided
        monkeypatch.setattr(mod, "simulated", lambda spec: spec == "reference")
    monkeypatch.setattr(Worker, "submit", lambda self, spec, *a: (submitted.append(spec), real_submit(self, spec, *a)))
    model = k3c.models.build("gpt2-tiny")
    report = diff(model, ["reference", "onnx"], seq_len=20, decode_steps=2)
    assert submitted == ["reference"] and report.ok, report.table()
    assert report.backends["reference"].prefill_seconds == 0.0  # an interpreter's speed is not timed

    real_result = Worker.result

    def wrong(self, spec):
        runs = real_result(self, spec)
        runs.prefill[0] = runs.prefill[0] * 1.01
        return runs

    monkeypatch.setattr(Worker, "result", wrong)
    report = diff(model, ["reference"], seq_len=20, decode_steps=2)
    assert not report.backends["reference"].ok
