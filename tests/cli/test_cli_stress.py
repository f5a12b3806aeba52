"""`k3c diff --stress garbage-capacity` from the command line: a model with attention caches
passes on the reference (every backend is tests/test_stress.py's; here the command's wiring,
its report and --json), a model with fixed-size states only is told so in one line, and the
weight stresses' Python entry names the function that runs an input stress."""

from __future__ import annotations

import json

import pytest
from cli_testlib import fails

import k3c
from k3c.cli import main
from k3c.errors import UsageError


def test_garbage_capacity_from_the_command_line(capsys, tmp_path):
    out = tmp_path / "g.json"
    assert main(["diff", "--model", "gpt2-tiny", "--backends", "reference", "--stress", "garbage-capacity",
                 "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["stress"] == "garbage-capacity" and set(report["backends"]) == {"eager", "reference"}
    assert all(b["ok"] for b in report["backends"].values())
    assert "final/layers.0.k" in {t["name"] for t in report["backends"]["reference"]["tensors"]}


def test_garbage_capacity_needs_caches(capsys):
    fails(["diff", "--model", "deltanet-tiny", "--backends", "reference", "--stress", "garbage-capacity"], capsys,
          "needs a model with attention caches; deltanet-tiny holds fixed-size states only")


def test_an_input_stress_is_not_a_weight_edit():
    from k3c.stress import stressed

    with pytest.raises(UsageError, match="edits the inputs, not the weights"):
        stressed(k3c.models.build("gpt2-tiny"), "garbage-capacity")
