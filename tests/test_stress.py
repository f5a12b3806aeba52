"""`k3c diff --stress`: each stress on each backend, at weights the seeded defaults never reach,
and the proof that the stresses bite: with onnxruntime's own Sigmoid (the router case: logits
off by up to 0.62) or a softplus written log(1 + exp(x)) (TVM's and Triton's old form) the
stressed diff fails, and names the sigmoid or the softplus, not the division or the chunk
kernel downstream of it.

One model takes every stress: k3-tiny cut to two layers (KDA then MLA, each with the latent
SiTU MoE) with Kimi Linear's softplus gate, whose relative accuracy the large-a-log stress
probes (K3's sigmoid gate under strong decay is in the kernel tests). One capture and one TVM
build serve all stresses: a stress changes weights only.
"""

from __future__ import annotations

import pytest
import torch

import k3c
from k3c.backends.onnx import standard
from k3c.compiler import capture_entries
from k3c.diff import diff

BACKENDS = ["reference", "onnx", "onnx:ort", "tvm", "triton"]
STRESSES = ["router-low", "strong-decay", "large-a-log", "situ-saturated", "router-ties"]
# Exact ties among router scores: ONNX's TopK and TVM's put the lower index first (ONNX defines
# it so); torch.topk, which eager, the interpreter and the Triton module call, defines no order
# (on a CPU it takes indices 1 and 3 of three equal scores at 1, 2, 3). k3c's IR topk states no
# tie order yet: until it does (and eager follows it), the backends disagree on such tokens.
TIES_UNDEFINED = {("router-ties", "onnx"), ("router-ties", "onnx:ort"), ("router-ties", "tvm")}


@pytest.fixture(scope="module")
def model():
    return k3c.models.build("k3-tiny", num_layers=2, mla_layers=(2,), first_k_dense=0, kda_gate="softplus")


@pytest.fixture(scope="module")
def captured(model):
    """The one capture: a stress changes weights only, so its graphs are these, rebound."""
    return capture_entries(model, (torch.zeros(2, 16, dtype=torch.long),))


def _diff(model, captured, stress, backends, bisect=True):
    return diff(model, backends, seq_len=24, decode_steps=1, stress=stress, captured=captured, timing=False,
                bisect=bisect)


@pytest.fixture(scope="module")
def stressed_reports(model, captured):
    cache = {}

    def get(stress):
        if stress not in cache:  # the known tie divergence is named by its own (ONNX) test below
            cache[stress] = _diff(model, captured, stress, BACKENDS, bisect=stress != "router-ties")
        return cache[stress]

    return get


CASES = [pytest.param(s, b, marks=pytest.mark.xfail(strict=True, reason="tie order of topk undefined"))
         if (s, b) in TIES_UNDEFINED else (s, b) for s in STRESSES for b in BACKENDS]


@pytest.mark.parametrize("stress, backend", CASES)
def test_each_stress_on_each_backend(stressed_reports, stress, backend):
    b = stressed_reports(stress).backends[backend]
    assert b.error is None and b.ok, stressed_reports(stress).table(per_tensor=True)


def test_exact_ties_are_named_at_the_routers_topk(model, captured):
    bad = _diff(model, captured, "router-ties", ["onnx"]).backends["onnx"].first_bad_node
    assert bad["op"] == "topk" and "moe_layer.py" in bad["loc"] and "integer values differ" in bad["how"]


def _raw_sigmoid(lx, node):
    (x,), (y,) = [lx.x(i) for i in node.inputs], [lx.out(node, 0)]
    lx.b.Sigmoid(x, outputs=[y])


def _naive_softplus(lx, node):  # log(1 + exp(x)): no threshold, the form TVM and Triton had
    (x,), (y,) = [lx.x(i) for i in node.inputs], [lx.out(node, 0)]
    b = lx.b
    b.Log(b.Add(b.const(1.0, "f32"), b.Exp(x)), outputs=[y])


@pytest.mark.parametrize("stress, op, lowering", [("router-low", "sigmoid", _raw_sigmoid),
                                                  ("large-a-log", "softplus", _naive_softplus)])
def test_the_stress_catches_the_old_form_and_names_it(model, captured, monkeypatch, stress, op, lowering):
    monkeypatch.setitem(standard.STANDARD, op, lowering)
    report = _diff(model, captured, stress, ["onnx"])
    b = report.backends["onnx"]
    assert not b.ok and b.rel_rms_err > 1e-4, report.table(per_tensor=True)
    assert b.first_bad_node["op"] == op, b.first_bad_node
    assert "off on the reference's inputs" in b.first_bad_node["how"]
