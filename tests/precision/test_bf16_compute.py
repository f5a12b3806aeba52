"""The BF16 compute policy (k3c.compile(..., compute="bf16")) against its eager definition
(models.precision.bf16_policy, written apart from the compute-dtype pass), and the measures
`k3c diff --compute bf16` reports against fp32 compute, each against a count made here.

Whole models are compared at the BF16_COMPUTE row of k3c/numerics.py on the backend's routing
(the row says why, and why it cannot tell BF16 from float32 compute on these models); the
GEMM-level test below is the one that can: one rounding stage, no routing, float32's row.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn

import k3c
from k3c import models
from k3c.backends.artifact import MANIFEST
from k3c.diff import diff
from k3c.models.precision import bf16_gemm_inputs, bf16_policy, fp32_copy
from k3c.numerics import BF16_COMPUTE, TOLERANCES, compare
from k3c.precision_check import NEAR_TIE_ULPS, Routing, agreement, bf16_ulp, routing_check, slots_agreeing

MODELS = {  # k3-tiny cut to one KDA, two MoE layers with MXFP4 experts, one MLA layer, AttnRes
    "k3-tiny": dict(experts="mxfp4", num_layers=4, mla_layers=(4,)),
    "kimi-linear-tiny": dict(num_layers=4, mla_layers=(4,)),  # KDA, then MoE; MLA the fourth
}


@pytest.fixture(scope="module", params=list(MODELS))
def report(request):
    model = models.build(request.param, seed=3, dtype=torch.bfloat16, **MODELS[request.param])
    return diff(model, ["reference"], seq_len=12, batch=2, decode_steps=2, timing=False, bisect=False,
                compute="bf16", greedy_tokens=6)


def test_reference_backend_computes_the_eager_policy(report):
    b = report.backends["reference"]
    assert report.compute == "bf16"
    assert b.error is None and b.ok, report.table(per_tensor=True)
    assert {t.name.split("/")[0] for t in b.tensors} >= {"prefill", "decode0", "decode1", "final"}
    assert all((t.tol_rel_rms, t.tol_max_abs) == (BF16_COMPUTE.rel_rms, BF16_COMPUTE.max_abs) for t in b.tensors)
    # every prefill token and decode step routed once per MoE layer, top-k slots each
    moe_layers = len(report.policy.routing_per_layer)
    k = b.routing["slots"] // (moe_layers * 2 * (12 + 2))
    assert moe_layers and b.routing["slots"] == moe_layers * 2 * (12 + 2) * k and k >= 1


def test_policy_report_fields(report):
    p = report.policy.to_json()
    assert p["prefill_len"] == 12 and p["greedy_tokens"] == 6
    assert len(p["blocks_rel_rms"]) > len(p["routing_per_layer"]) >= 1  # a dense first layer, then MoE
    assert 0 <= p["routing_agreeing"] <= p["routing_slots"] and p["routing_share"] == pytest.approx(
        p["routing_agreeing"] / p["routing_slots"])
    assert p["greedy_agreeing"] <= 6
    # the first block has no routing upstream: the policy is off from fp32 compute by rounding
    # alone, about BF16's u / sqrt(6) = 1.6e-3 per rounding, and not by nothing
    assert 1e-4 < p["blocks_rel_rms"][0] < BF16_COMPUTE.rel_rms
    json.dumps(report.to_json())


class TwoGemms(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(64, 96, bias=False), nn.Linear(96, 64, bias=False)

    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.up(x)))


def test_each_gemm_rounds_its_operands(tmp_path):
    """One rounding stage per GEMM and no routing: the compiled policy is the eager policy at
    float32's row, and both are off from float32 compute by BF16 rounding (more than that row)."""
    torch.manual_seed(0)
    m = TwoGemms().to(torch.bfloat16)
    x = torch.randn(2, 5, 64).to(torch.bfloat16)
    compiled = k3c.compile(m, "reference", (x,), out_dir=tmp_path / "a", compute="bf16", dynamic=False)
    got = compiled(x.float())  # the compiled graph takes float32 (BF16 widened exactly)
    with torch.no_grad():
        want, fp32 = bf16_policy(m)(x.float()), fp32_copy(m)(x.float())
    assert got.dtype == torch.float32
    assert compare(got, want, tolerance=TOLERANCES[torch.float32]).ok
    assert not compare(got, fp32, tolerance=TOLERANCES[torch.float32]).ok
    manifest = json.loads((tmp_path / "a" / MANIFEST).read_text())
    assert manifest["compute"] == {"policy": "bf16", "weights": ["bf16"]}


def test_the_router_is_not_rounded_and_the_experts_are():
    m = models.build("k3-tiny", dtype=torch.bfloat16, experts="mxfp4", num_layers=2, mla_layers=())
    names = bf16_gemm_inputs(m)
    assert "model.layers.1.block_sparse_moe.experts" in names
    assert "lm_head" in names and "model.layers.0.self_attn.q_proj" in names
    assert not any(n.endswith("block_sparse_moe.gate") for n in names)
    with pytest.raises(ValueError):
        bf16_policy(models.build("k3-tiny", num_layers=2, mla_layers=()))  # float32: nothing to round


def test_slots_agreeing_drops_by_one_per_changed_slot():
    g = torch.Generator().manual_seed(0)
    ids = torch.stack([torch.randperm(16, generator=g)[:4] for _ in range(10)])  # [10 tokens, k = 4]
    assert slots_agreeing(ids, ids) == 40
    assert slots_agreeing(ids, ids.flip(-1)) == 40  # compared as sets
    other = ids.clone()
    unused = next(e for e in range(16) if e not in ids[3].tolist())
    other[3, 2] = unused  # one decision of one token changed
    assert slots_agreeing(ids, other) == 39
    other[7, 0] = next(e for e in range(16) if e not in ids[7].tolist())
    assert slots_agreeing(ids, other) == 38


def test_a_routing_difference_passes_only_at_a_near_tie():
    # two tokens, four experts, top-2: token 0's 2nd and 3rd scores 0.5 ulp apart, token 1's far apart
    u = float(bf16_ulp(torch.tensor(0.6)))
    scores = torch.tensor([[0.9, 0.6, 0.6 - 0.5 * u, 0.1], [0.9, 0.6, 0.2, 0.1]])
    own = [Routing(torch.tensor([[0, 1], [0, 1]]), scores)]
    near = routing_check(own, [torch.tensor([[0, 2], [0, 1]])])
    assert near["ok"] and near["agreeing"] == 3 and near["slots"] == 4
    assert near["gaps_ulps"] == [pytest.approx(0.5, rel=1e-3)]
    far = routing_check(own, [torch.tensor([[0, 1], [0, 2]])])
    assert not far["ok"] and far["gaps_ulps"][0] > NEAR_TIE_ULPS


def test_greedy_agreement_counts_positions_and_the_first_difference():
    assert agreement([5, 6, 7, 8], [5, 6, 7, 8]) == (4, None)
    assert agreement([5, 6, 7, 8], [5, 9, 7, 8]) == (3, 1)
    assert agreement([1, 2, 3], [4, 2, 3]) == (2, 0)


@pytest.mark.parametrize("command", ["compile", "diff", "bench"])
def test_cli_takes_the_policy(command):
    from k3c.cli import build_parser

    base = {"compile": ["--backend", "reference"], "diff": ["--backends", "reference"],
            "bench": ["--backends", "reference"]}[command]
    args = build_parser().parse_args([command, "--model", "k3-tiny", *base, "--dtype", "bf16", "--compute", "bf16"])
    assert args.compute == "bf16"
    assert build_parser().parse_args([command, "--model", "k3-tiny", *base]).compute is None  # each backend's own


def test_diff_refuses_bf16_compute_of_a_float32_model(capsys):
    from k3c.cli import main

    assert main(["diff", "--model", "kimi-linear-tiny", "--backends", "reference", "--compute", "bf16"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--dtype bf16" in err


def test_the_experts_hidden_stays_float32_unfused_too():
    """Without fuse-situ the experts' down-projection is its own GEMM: its hidden operand is kept
    in float32 as the fused expert op keeps it, and the experts' input is rounded."""
    from k3c import capture, passes

    m = models.build("kimi-linear-tiny", dtype=torch.bfloat16, num_layers=2, mla_layers=())
    g = passes.run(capture(m, (torch.randint(0, 1024, (1, 6)),)), ['compute-dtype{dtype="f32", gemm="bf16"}'])
    made_by = {o: n for n in g.nodes for o in n.outputs}

    def rounded(v):  # cast(cast(v, bf16), f32)
        n = made_by.get(v)
        return n is not None and n.op == "cast" and made_by[n.inputs[0]].op == "cast" \
            and made_by[n.inputs[0]].attrs["dtype"] == "bf16"

    ops = {n.op: n for n in g.nodes}
    assert rounded(ops["moe_gate_up"].inputs[0]) and not rounded(ops["moe_down"].inputs[0])
