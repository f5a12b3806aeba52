"""The differential tester: passes on a right backend, catches an injected wrong lowering and
names the node it broke."""

from __future__ import annotations

import json

import pytest
import torch

import k3c
from k3c import backends
from k3c.backends.reference import ReferenceBackend
from k3c.diff import diff, write_json
from k3c.ir import Node


class PerturbedBackend(ReferenceBackend):
    """The reference backend with one wrong kernel: the n-th `target` op's output is scaled."""

    name = "perturbed"
    target, nth, factor = "rms_norm", 2, 1.001

    def lower(self, graphs, out_dir, **options):
        broken = {}
        for entry, g in graphs.items():
            g = g.copy()
            hits = [n for n in g.nodes if n.op == self.target]
            if len(hits) > self.nth:
                node = hits[self.nth]
                out = node.outputs[0]
                raw = g.fresh(out + "_raw")
                g.types[raw] = g.types[out]
                node.outputs[0] = raw
                c = g.fresh("perturb")
                g.types[c] = k3c.ir.TensorType(g.types[out].dtype, ())
                at = g.nodes.index(node) + 1
                g.nodes[at:at] = [Node("const", [], [c], {"value": self.factor, "dtype": g.types[out].dtype}),
                                  Node("mul", [raw, c], [out])]
            broken[entry] = g
        return super().lower(broken, out_dir, **options)


@pytest.fixture(scope="module")
def model():
    return k3c.models.build("deltanet-tiny")


def test_reference_backend_passes(model, tmp_path):
    report = diff(model, ["reference"], seq_len=40, decode_steps=3, passes="none", out_root=tmp_path)
    assert report.ok, report.table(per_tensor=True)
    names = [t.name for t in report.backends["reference"].tensors]
    assert "prefill/logits" in names and "decode2/logits" in names and "final/layers.1.S" in names


def test_a_perturbed_kernel_is_caught_and_named(model, tmp_path):
    backends.register("perturbed", PerturbedBackend)
    report = diff(model, ["reference", "perturbed"], seq_len=40, decode_steps=2, passes="none", out_root=tmp_path)
    assert report.backends["reference"].ok
    bad = report.backends["perturbed"]
    assert not bad.ok
    graph = k3c.capture(model, (torch.zeros(2, 16, dtype=torch.long),))
    target = [n for n in graph.nodes if n.op == "rms_norm"][PerturbedBackend.nth]
    assert bad.first_bad_node["op"] == "rms_norm"
    assert bad.first_bad_node["value"] == target.outputs[0]
    assert bad.first_bad_node["loc"] == target.loc
    write_json(report, tmp_path / "d.json")
    data = json.loads((tmp_path / "d.json").read_text())
    assert data["backends"]["perturbed"]["ok"] is False and data["backends"]["reference"]["ok"] is True
    assert "rms_norm" in report.table()
