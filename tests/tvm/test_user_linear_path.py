"""A user module's `linear` takes the zoo's path through the TVM backend (not timed): the same
panel-packed GEMM kernel, its weight packed once at load (transform_params), and compiled code
that keeps the GEMM's accumulators in registers. The last held only for the zoo before: a
module whose GEMM rows are a product of dynamic dims got a shape function without `noalias`,
and then no kernel of the module had it (build.noalias_everywhere)."""

from __future__ import annotations

import importlib
import re

import pytest
import torch

import k3c
from k3c.backends.tvm.inspect import kernel_calls, missing_noalias
from k3c.backends.tvm.lower import lower_module
from k3c.backends.tvm.relax_ops import panel_width
from k3c.backends.tvm.target import make_target
from k3c.compiler import capture_entries, prepare
from k3c.models.common import GatedMLP, init_weights

build = importlib.import_module("k3c.backends.tvm.build")


class UserBlock(torch.nn.Module):
    """A user's module: a linear and a gated MLP, as in the issue, at a small size."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(64, 96)
        self.mlp = GatedMLP(96, 80)

    def forward(self, x):
        return self.mlp(self.proj(x))


@pytest.fixture(scope="module")
def graphs():
    be = k3c.backends.get("tvm")
    user = prepare(capture_entries(init_weights(UserBlock(), seed=0).eval(), (torch.randn(1, 12, 64),)), be)
    zoo = k3c.models.build("gpt2-tiny")
    zoo_graphs = prepare({"prefill": k3c.capture(zoo, (torch.randint(0, 100, (2, 16)),))}, be)
    return {"forward": user, "prefill": zoo_graphs}


def _gemm_records(graphs, entry):
    """(number of f32 GEMM nodes, packed_linear calls) of one entry's scheduled module."""
    g = graphs[entry][entry]
    gemms = sum(1 for n in g.nodes if n.op in ("linear", "gated_mlp") and g.types[n.inputs[1]].dtype == "f32"
                and n.inputs[1] in g.weights)
    calls = [r for r in kernel_calls(build.scheduled_module(graphs[entry]), entry) if r["kernel"] == "packed_linear"]
    return gemms, calls


@pytest.mark.parametrize("entry", ["forward", "prefill"], ids=["user-module", "zoo-prefill"])
def test_every_gemm_calls_the_packed_kernel_with_its_weight_packed_at_load(graphs, entry):
    gemms, calls = _gemm_records(graphs, entry)
    assert gemms > 0 and len(calls) == gemms  # one panel GEMM per linear / gated_mlp, none left to Relax's matmul
    for call in calls:
        x, w = call["args"]
        assert x not in call["params"] and w in call["params"], call  # the packed weight comes from transform_params
        P, K, c = call["params"][w]
        assert c == panel_width() and isinstance(P, int) and isinstance(K, int), call  # panels: no stored weight's


def test_the_user_module_calls_the_kernels_the_zoo_calls_for_its_gemms(graphs):
    user = {r["kernel"] for r in _gemm_records(graphs, "forward")[1]}
    zoo = {r["kernel"] for r in _gemm_records(graphs, "prefill")[1]}
    assert user == zoo == {"packed_linear"}


@pytest.mark.parametrize("entry", ["forward", "prefill"], ids=["user-module", "zoo-prefill"])
def test_every_function_is_noalias_after_the_pipeline(graphs, entry):
    mod = build.pipeline(make_target("llvm"))(lower_module(graphs[entry], "llvm"))
    assert "shape_func" in {gv.name_hint for gv in mod.get_global_vars()} or entry == "prefill"
    assert missing_noalias(mod) == []


def test_the_user_gemm_keeps_its_accumulators_in_registers(graphs):
    """The k loop of each compiled packed GEMM: fused multiply-adds only, no store to memory
    and no integer division (before the fix: 6 stores and 12 divisions an iteration)."""
    ex, _ = build.build(graphs["forward"], "llvm")
    src = "\n".join(m.inspect_source("ll") for m in [ex.mod, *ex.mod.imports] if m.kind == "llvm")
    loops = re.findall(r"^for_body_k\S*:.*?\n(.*?)(?=^\S.*:)", src, re.M | re.S)
    assert len(loops) >= 2  # the linear's and the gated MLP's gate/up GEMM (+ its down projection)
    for body in loops:
        assert body.count("fmuladd") > 0
        assert not re.search(r"\bstore <", body) and not re.search(r"\b[su](div|rem)\b", body), body[:400]
    assert "noalias" in src


def test_a_static_gated_mlp_builds_and_equals_eager(tmp_path):
    """dynamic=False: the SiTU kernel kept out of fusion (FuseTIR refused it beside the static
    reshapes); the result against eager."""
    from k3c.numerics import assert_close

    mlp = init_weights(GatedMLP(64, 48), seed=2).eval()
    x = torch.randn(1, 16, 64, generator=torch.Generator().manual_seed(2))
    run = k3c.compile(mlp, "tvm", (x,), out_dir=tmp_path / "mlp", dynamic=False)
    assert run.graphs["forward"].meta["dynamic"] == {}
    with torch.no_grad():
        assert_close(run(x), mlp(x), torch.float32)


def test_a_bf16_models_gemms_take_the_packed_kernel_too():
    """A BF16 model computes in float32 on TVM: compute-dtype casts each BF16 weight, and the
    cast of a weight is weight-only work like the packing, so both run at load and every GEMM
    still calls the panel kernel (they fell back to Relax's matmul: k3-small's BF16 prefill
    took 4.5 s against 1.3 s in fp32)."""
    be = k3c.backends.get("tvm")
    model = init_weights(UserBlock(), seed=0).eval().to(torch.bfloat16)
    g = prepare(capture_entries(model, (torch.randn(1, 12, 64, dtype=torch.bfloat16),)), be)["forward"]
    widened = {n.outputs[0] for n in g.nodes if n.op == "cast" and n.inputs[0] in g.weights
               and g.types[n.inputs[0]].dtype == "bf16"}
    gemms = [n for n in g.nodes if n.op in ("linear", "gated_mlp")]
    assert gemms and all(n.inputs[1] in widened for n in gemms)  # each GEMM reads a widened BF16 weight
    records = kernel_calls(build.scheduled_module({"forward": g}), "forward")
    calls = [r for r in records if r["kernel"] == "packed_linear"]
    assert len(calls) == len(gemms)
    for call in calls:
        assert call["args"][1] in call["params"], call  # cast and packing both in transform_params
