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
from k3c.compiler import capture_entries
from k3c.diff import diff
from k3c.registry import scope

BACKENDS = ["reference", "onnx", "onnx:ort", "tvm", "triton"]
STRESSES = ["router-low", "strong-decay", "large-a-log", "spiky-gates", "situ-saturated", "router-ties"]
# Exact ties among router scores: k3c's topk puts the lower index first (kernels/topk.py), as
# ONNX's TopK and TVM's do; eager, the interpreter and the Triton module follow the same
# definition, so every backend routes a tied token to the same experts.


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
        if stress not in cache:
            cache[stress] = _diff(model, captured, stress, BACKENDS)
        return cache[stress]

    return get


@pytest.mark.parametrize("stress, backend", [(s, b) for s in STRESSES for b in BACKENDS])
def test_each_stress_on_each_backend(stressed_reports, stress, backend):
    b = stressed_reports(stress).backends[backend]
    assert b.error is None and b.ok, stressed_reports(stress).table(per_tensor=True)


def test_exact_ties_route_to_the_lower_index_everywhere(model):
    """The stress makes tied scores; with torch.topk's open order eager and ONNX disagreed on
    them. The router's choice is now the same definition on every backend (checked above), and
    it is the lower index: the experts 0-2 and 3-5 the stress ties give their first ones."""
    from k3c.kernels.topk import topk

    scores = torch.tensor([[0.5, 0.9, 0.9, 0.9, 0.1]])
    values, idx = topk(scores, 2)
    assert idx.tolist() == [[1, 2]] and torch.equal(values, scores[:, 1:3])


def _raw_sigmoid(lx, node, x):
    lx.b.Sigmoid(lx.x(x), outputs=lx.outs(node))


def _naive_softplus(lx, node, x):  # log(1 + exp(x)): no threshold, the form TVM and Triton had
    b = lx.b
    b.Log(b.Add(b.const(1.0, "f32"), b.Exp(lx.x(x))), outputs=lx.outs(node))


@pytest.mark.parametrize("stress, op, lowering", [("router-low", "sigmoid", _raw_sigmoid),
                                                  ("large-a-log", "softplus", _naive_softplus)])
def test_the_stress_catches_the_old_form_and_names_it(model, captured, stress, op, lowering):
    with scope():  # the old form replaces k3c's own lowering for this test only
        k3c.backends.lowering("onnx", op, replace=True)(lowering)
        report = _diff(model, captured, stress, ["onnx"])
    b = report.backends["onnx"]
    assert not b.ok and b.rel_rms_err > 1e-4, report.table(per_tensor=True)
    assert b.first_bad_node["op"] == op, b.first_bad_node
    assert "off on the reference's inputs" in b.first_bad_node["how"]


GARBAGE = {"seq_len": 8, "decode_steps": 1}  # capacity 14: rows 12 and 13 are never written


@pytest.fixture(scope="module")
def garbage_run(model):
    """The garbage-capacity stress on one runner at a time, over one capture of the serving forms."""
    from k3c.stress_capacity import garbage_capacity, serving_graphs

    graphs = {}

    def run(runner):
        if runner == "eager":
            return garbage_capacity(model, [], **GARBAGE)
        if not graphs:
            graphs["serving"] = serving_graphs(model, 14, torch.zeros(2, 8, dtype=torch.long))
        return garbage_capacity(model, [runner], **GARBAGE, capacity=14, captured=graphs["serving"], eager=False)

    return run


SLOW = pytest.mark.slow  # TVM's and Triton's builds and runs of the serving forms: minutes


@pytest.mark.parametrize("runner", ["eager", "reference", "onnx", "onnx:ort", pytest.param("tvm", marks=SLOW),
                                    pytest.param("triton", marks=SLOW)])
def test_garbage_in_unused_capacity_changes_nothing(garbage_run, runner):
    report = garbage_run(runner)
    b = report.backends[runner]
    assert b.error is None and b.ok, report.table(per_tensor=True)


def test_garbage_capacity_catches_masked_weights_times_nan(model, monkeypatch):
    """The stress bites: cached attention that weights unused rows by 0 instead of selecting
    them away (0 * NaN is NaN) fails it, on the eager model that calls it."""
    from k3c.kernels.cache import naive
    from k3c.stress_capacity import garbage_capacity

    def weighted_by_zero(q, k, v, positions, scale=None):
        B, T, H, D = q.shape
        k, v = k.repeat_interleave(H // k.shape[2], dim=2), v.repeat_interleave(H // v.shape[2], dim=2)
        scores = torch.einsum("bthd,bshd->bhts", q.float(), k.float()) * (D**-0.5 if scale is None else scale)
        p = torch.softmax(scores.masked_fill(~naive.visible(positions, T, k.shape[1])[:, None], float("-inf")), -1)
        return torch.einsum("bhts,bshv->bthv", p, v.float()).to(v.dtype)

    monkeypatch.setattr(naive, "cached_attention", weighted_by_zero)
    report = garbage_capacity(model, [], **GARBAGE)
    assert not report.backends["eager"].ok, report.table(per_tensor=True)
