"""`k3c diff --stress`: each stress on each backend, at weights the seeded defaults never reach,
and the proof that the stresses bite: with onnxruntime's own Sigmoid (the router case: logits
off by up to 0.62) or a softplus written log(1 + exp(x)) (TVM's and Triton's old form) the
stressed diff fails, and names the sigmoid or the softplus, not the division or the chunk
kernel downstream of it.

Two-layer variants of k3-tiny (sigmoid gate, SiTU, latent MoE) and kimi-linear-tiny (softplus
gate) keep every feature at a fraction of the cost; the TVM builds are shared through the
session's build cache (every stress has the same graph structure).
"""

from __future__ import annotations

import pytest

import k3c
from k3c.backends.onnx import standard
from k3c.diff import diff

BACKENDS = ["reference", "onnx", "onnx:ort", "tvm", "triton"]
SMALL = dict(num_layers=2, mla_layers=(2,), first_k_dense=0)
MODEL_OF = {"router-low": "k3-tiny", "situ-saturated": "k3-tiny", "router-ties": "k3-tiny",
            "strong-decay": "kimi-linear-tiny", "large-a-log": "kimi-linear-tiny"}
# Exact ties among router scores: ONNX's TopK and TVM's put the lower index first (ONNX defines
# it so); torch.topk, which eager, the interpreter and the Triton module call, defines no order
# (on a CPU it takes indices 1 and 3 of three equal scores at 1, 2, 3). k3c's IR topk states no
# tie order yet: until it does (and eager follows it), the backends disagree on such tokens.
TIES_UNDEFINED = {("router-ties", "onnx"), ("router-ties", "onnx:ort"), ("router-ties", "tvm")}


@pytest.fixture(scope="module")
def models():
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = k3c.models.build(name, **SMALL)
        return cache[name]

    return get


@pytest.fixture(scope="module")
def stressed_reports(models):
    cache = {}

    def get(stress):
        if stress not in cache:
            cache[stress] = diff(models(MODEL_OF[stress]), BACKENDS, seq_len=24, decode_steps=1, stress=stress)
        return cache[stress]

    return get


CASES = [pytest.param(s, b, marks=pytest.mark.xfail(strict=True, reason="tie order of topk undefined"))
         if (s, b) in TIES_UNDEFINED else (s, b) for s in MODEL_OF for b in BACKENDS]


@pytest.mark.parametrize("stress, backend", CASES)
def test_each_stress_on_each_backend(stressed_reports, stress, backend):
    b = stressed_reports(stress).backends[backend]
    assert b.error is None and b.ok, stressed_reports(stress).table(per_tensor=True)


def test_exact_ties_are_named_at_the_routers_topk(stressed_reports):
    bad = stressed_reports("router-ties").backends["onnx"].first_bad_node
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
def test_the_stress_catches_the_old_form_and_names_it(models, monkeypatch, stress, op, lowering):
    monkeypatch.setitem(standard.STANDARD, op, lowering)
    report = diff(models(MODEL_OF[stress]), ["onnx"], seq_len=24, decode_steps=1, stress=stress)
    b = report.backends["onnx"]
    assert not b.ok and b.rel_rms_err > 1e-4, report.table(per_tensor=True)
    assert b.first_bad_node["op"] == op, b.first_bad_node
    assert "off on the reference's inputs" in b.first_bad_node["how"]
