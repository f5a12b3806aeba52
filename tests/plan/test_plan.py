"""`k3c plan` as a deployment planner: the state pool against counts written from K3-SPEC's
configs, fit and concurrency on named devices as ANCHORS.md reports them, the roofline's
arithmetic on a hand-checked case, the arithmetic beside what the runtime's partition counts,
the JSON form and the one-line errors."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from k3c.cli import main
from k3c.plan import _release, plan
from k3c.plan_devices import Device, device
from k3c.plan_mesh import DeployMesh
from k3c.plan_model import Cost, Layer, Profile, profile
from k3c.plan_roofline import comm_per_token, estimate, memory


@pytest.fixture(scope="module")
def k3():
    return profile(_release("k3", None), "k3")


def test_state_per_sequence_from_the_spec(k3):
    """K3-SPEC section 7: k3 has 93 layers, 24 of them MLA, so 69 KDA layers of 96 heads x 128;
    kimi-linear 27 layers, 7 MLA, 20 KDA of 32 x 128. Per KDA layer: S [H, K, V] in fp32 and the
    last 3 inputs of the q, k, v convs (H K channels each) in the release dtype (bf16); per MLA
    layer and token: the latent c_kv (512) and k_rope (64), bf16."""
    L = 8192
    k3_expected = 69 * 96 * 128 * 128 * 4 + 69 * 3 * 96 * 128 * 3 * 2 + 24 * (512 + 64) * 2 * L
    assert k3.state_per_seq(L) == k3_expected
    # the recurrent state alone: the ~434 MB of the published ~467 MB (which adds the conv tails)
    assert sum(lay.recurrent for lay in k3.layers) == 69 * 96 * 128 * 128 * 4
    assert k3.experts_mxfp4
    kl = profile(_release("kimi-linear", None), "kimi-linear")
    assert not kl.experts_mxfp4  # Kimi Linear ships BF16 experts
    assert kl.state_per_seq(L) == 20 * 32 * 128 * 128 * 4 + 20 * 3 * 32 * 128 * 3 * 2 + 7 * (512 + 64) * 2 * L
    # --state-dtype bf16 halves the recurrent state only
    p = plan("kimi-linear", "tp=1", context=L, state_dtype="bf16", model=_release("kimi-linear", None))
    assert p["state_bytes_per_seq"] == 20 * 32 * 128 * 128 * 2 + 20 * 3 * 32 * 128 * 3 * 2 + 7 * 576 * 2 * L


def test_k3_fits_eight_b300_not_eight_h200(k3):
    """ANCHORS.md: K3 does not fit 8 x H200; it fits 8 x B300. The best 8-GPU split (tp=8: heads,
    widths and every expert's columns over 8) and the expert-only one (ep=8) alike."""
    for mesh in ("tp=8", "ep=8", "tp=2,ep=4"):
        m = DeployMesh.parse(mesh)
        assert not memory(k3, m, device("h200"), 1, 8192)["fits"]
        assert memory(k3, m, device("h200"), 1, 8192)["max_concurrency"] == 0
    tp8 = memory(k3, DeployMesh(tp=8), device("b300"), 1, 8192)
    assert tp8["fits"] and tp8["max_concurrency"] > 1
    # 1.42 TiB of weights over 8 GPUs: more than an H200 holds before any state
    assert tp8["stages"][0]["weight_bytes"] > 1.42 * 2**40 / 8 > device("h200").memory_bytes


def test_max_concurrency_falls_with_context_and_bf16_state_raises_it(k3):
    m, dev = DeployMesh(dp=16, ep=16), device("gb300")
    caps = [memory(k3, m, dev, 1, L)["max_concurrency"] for L in (1024, 8192, 65536, 524288)]
    assert caps[0] > 0 and all(a >= b for a, b in zip(caps, caps[1:])) and caps[0] > caps[-1]
    f32 = memory(k3, m, dev, 1, 1024)["max_concurrency"]
    bf16 = memory(k3, m, dev, 1, 1024, state_item=2)["max_concurrency"]
    assert 1.5 * f32 < bf16 < 2 * f32 + 16
    # fits exactly up to the largest concurrency
    assert memory(k3, m, dev, caps[1], 8192)["fits"] and not memory(k3, m, dev, caps[1] + 16, 8192)["fits"]


def _tiny_profile() -> Profile:
    cfg = SimpleNamespace(num_experts=4, top_k=2, hidden_size=8, routed_expert_hidden_size=None,
                          num_shared_experts=0, vocab_size=1000, attn_res_block_size=None,
                          kda_heads=1, kda_head_dim=2)
    layer = Layer(0, "kda", split=Cost(1e9, 5e8), replicated=Cost(1e8, 0.0), routed=Cost(4e9, 1e8), recurrent=1e6)
    return Profile("hand", cfg, [layer], embed=Cost(1e6, 0.0), head=Cost(2e8, 1e8), final=Cost(), item=2,
                   experts_mxfp4=True)


def test_roofline_on_a_hand_checked_case():
    """One KDA layer, one GPU (no communication), 2 sequences: worked by hand."""
    dev = Device("hand", 100e9, 1e12, 2e11, 1e15, 1e15, 2e15, "round numbers")
    e = estimate(_tiny_profile(), DeployMesh(), dev, 2, 64)
    # 2 tokens pick 2 of 4 experts each: 1 - (1 - 2/4)^2 = 0.75 of the expert bytes are read
    assert e["decode_step"]["experts_touched"] == pytest.approx(0.75)
    # weights 1e9 + 1e8 + 0.75 * 4e9, head 2e8, S read and written for 2 sequences, 2 embedding rows
    nbytes = 1e9 + 1e8 + 3e9 + 2e8 + 2 * 2 * 1e6 + 2 * (1e6 / 1000)
    assert e["decode_step"]["bytes"] == pytest.approx(nbytes)
    # flops: 2 tokens x 2 x (5e8 + head 1e8) + KDA 7 K V a token; experts 2 tokens x 2 picks x 2 x 1e8
    assert e["decode_step"]["flops"] == pytest.approx(2 * 2 * 6e8 + 2 * 7 * 2 * 2)
    assert e["decode_step"]["expert_flops"] == pytest.approx(8e8)
    # the dense FLOPs at the BF16 peak, the MXFP4 experts' at the FP4 peak
    assert e["decode_step"]["compute_s"] == pytest.approx((2.4e9 + 56) / 1e15 + 8e8 / 2e15)
    step = max(nbytes / 1e12, 2.4e9 / 1e15 + 8e8 / 2e15)
    assert e["decode_tokens_per_s_per_user"] == pytest.approx(1 / step)
    assert e["decode_tokens_per_s_per_gpu"] == pytest.approx(2 / step)
    # memory: 90 GB usable, weights 5.301e9, 1e6 bytes a sequence
    assert e["max_concurrency"] == math.floor((90e9 - (1e9 + 1e8 + 4e9 + 1e6 + 2e8)) / 1e6)


def test_pipeline_and_dp_arithmetic():
    """pp=2 over 2 layers: a stage holds one layer; dp=2 with ep=2: 2 ranks, experts halved,
    the attention whole on each, each copy serves half of the sequences; dp=4 with ep=2: the
    same halves copied twice, each copy a quarter of the sequences, the same sends a token."""
    p = _tiny_profile()
    p.layers.append(Layer(1, "kda", split=Cost(1e9, 5e8), replicated=Cost(0, 0), routed=Cost(4e9, 1e8), recurrent=1e6))
    dev = Device("hand", 100e9, 1e12, 2e11, 1e15, 1e15, 2e15, "round numbers")
    mem = memory(p, DeployMesh(pp=2), dev, 4, 64)
    assert [s["weight_bytes"] for s in mem["stages"]] == [1e9 + 1e8 + 4e9 + 1e6, 1e9 + 4e9 + 2e8]
    mem = memory(p, DeployMesh(dp=2, ep=2), dev, 4, 64)
    assert mem["stages"][0]["weight_bytes"] == pytest.approx(2e9 + 1e8 + 4e9 + 1e6 + 2e8)
    assert mem["stages"][0]["state_bytes"] == 2 * 2e6  # 2 of the 4 sequences, both layers' S
    # a dp copy's token sends its slots bound for the other rank (2 picks, half away: one slot of
    # width 8 x 2 B), its expert id (8 B) and takes the output back: 40 B a MoE layer, 2 layers
    sent = comm_per_token(p, DeployMesh(dp=2, ep=2), 0)
    assert set(sent) == {"all_to_all"} and sent["all_to_all"]["bytes"] == pytest.approx(2 * 40, rel=1e-3)
    mem = memory(p, DeployMesh(dp=4, ep=2), dev, 4, 64)
    assert mem["stages"][0]["weight_bytes"] == pytest.approx(2e9 + 1e8 + 4e9 + 1e6 + 2e8)
    assert mem["stages"][0]["state_bytes"] == 1 * 2e6 and mem["max_concurrency"] % 4 == 0
    assert comm_per_token(p, DeployMesh(dp=4, ep=2), 0) == sent
    assert DeployMesh(dp=2, ep=2).world == 2 and DeployMesh(tp=2, ep=4).world == 8
    assert DeployMesh(dp=8, ep=2, pp=2).world == 16 and DeployMesh(dp=2, pp=2).plan_only
    assert not DeployMesh(dp=8, ep=2).plan_only and not DeployMesh(dp=2, ep=8).plan_only
    assert DeployMesh(dp=8, ep=2, pp=2).plan_only


def test_arithmetic_matches_what_the_partition_counts():
    """On a mesh the runtime runs, the plan's arithmetic (weights, state, bytes sent per token)
    against the partitioned model's own tensors and its counted collectives."""
    model = _release("k3-tiny", None)
    prof = profile(model, "k3-tiny")
    for mesh in ("tp=2,ep=2", "tp=2,vocab"):
        counted = plan("k3-tiny", mesh, 32, model=model, combine="all_reduce")
        m = DeployMesh.parse(mesh)
        sent = comm_per_token(prof, m, 0, "all_reduce")
        dec = counted["per_token"]["decode"]
        assert set(sent) == set(dec)
        for op in dec:
            assert sent[op]["count"] == dec[op]["count"]
            assert sent[op]["bytes"] == pytest.approx(dec[op]["bytes"], rel=1e-9)
        held = counted["ranks"][0]["weight_bytes"]
        assert memory(prof, m, device("h200"), 1, 32)["stages"][0]["weight_bytes"] == pytest.approx(held, rel=1e-4)


def test_json_fields(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", "--model", "k3-tiny", "--mesh", "dp=2,ep=2", "--device", "gb300", "--concurrency", "8",
                 "--context", "128", "--json", str(out)]) == 0
    assert "plan-only" not in capsys.readouterr().out  # the runtime runs dp=2,ep=2: its bytes are counted
    p = json.loads(out.read_text())
    assert {"mesh", "ranks", "per_token", "estimate"} <= set(p)
    assert p["mesh"]["dp"] == 2 and p["mesh"]["world"] == 2 and not p["mesh"]["plan_only"]
    assert p["per_token"]["decode"]["all_to_all"]["count"] == 4 * 8  # dispatch and combine, 8 MoE layers
    assert [r["rank"] for r in p["ranks"]] == [0, 1]
    assert {"weight_bytes", "state_bytes"} <= set(p["ranks"][0])
    e = p["estimate"]
    assert {"fits", "max_concurrency", "decode_tokens_per_s_per_gpu", "decode_tokens_per_s_per_user",
            "prefill_tokens_per_s_per_gpu"} <= set(e)
    assert e["fits"] is True and e["decode_tokens_per_s_per_gpu"] > 0


@pytest.mark.parametrize("args, says", [
    (["--mesh", "tp=2", "--device", "tpu9"], "device 'tpu9' is not known"),
    (["--mesh", "dp=3,ep=2"], "one of dp=3 and ep=2 must divide the other"),
    (["--mesh", "tp=3"], "tp=3 does not divide the 4 KDA heads"),
    (["--mesh", "pp=10"], "pp=10 stages for 9 layers"),
    (["--mesh", "xp=2"], "expected axes like"),
])
def test_cli_errors_are_one_line(capsys, args, says):
    assert main(["plan", "--model", "k3-tiny", *args]) == 2
    err = capsys.readouterr().err
    assert says in err and err.strip().count("\n") == 0, err


@pytest.mark.parametrize("text", ["pp=2", "tp=2,pp=2", "dp=2,ep=2", "dp=4,ep=2", "tp=2,ep=2,vocab"])
def test_a_runtime_mesh_plans_as_its_text(text):
    """plan() given the runtime's Mesh (as the mesh benchmark passes it) plans the mesh its text
    names: every axis carried over, pp's per-stage sends included."""
    from k3c.distributed.mesh import Mesh

    model = _release("k3-tiny", None)
    by_text = plan("k3-tiny", text, 16, model=model)
    by_mesh = plan("k3-tiny", Mesh.parse(text), 16, model=model)
    assert by_mesh == by_text
    assert ("per_stage" in by_mesh) == ("pp=2" in text)
