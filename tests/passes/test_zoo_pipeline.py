"""The default pipeline on every tiny model of the zoo: the interpreter gives the same outputs
before and after (prefill at T = 1, 63, 130; decode against caches of those lengths), and on
k3-tiny the three fusions did all they should, as the report says."""

from __future__ import annotations

import pytest
import torch
from factories import TINY, example_ids
from passes_testlib import inputs_for

from k3c import ir, passes
from k3c.ir import family
from k3c.models.common import GatedMLP
from k3c.models.moe_layer import MoE
from k3c.numerics import assert_close


@pytest.fixture(scope="module")
def optimized(zoo):
    """(name, entry) -> (captured graph, graph after `default`, pass report), computed once."""
    cache: dict = {}

    def get(name: str, entry: str):
        if (name, entry) not in cache:
            _, prefill, decode = zoo(name)
            graph = prefill if entry == "prefill" else decode
            report: list = []
            cache[name, entry] = graph, passes.run(graph, "default", report=report), report
        return cache[name, entry]

    return get


@pytest.mark.parametrize("T", [1, 63, 130], ids=lambda T: f"T{T}")
@pytest.mark.parametrize("entry", ["prefill", "decode"])
@pytest.mark.parametrize("name", TINY)
def test_default_pipeline_keeps_every_output(zoo, optimized, name, entry, T):
    model = zoo(name)[0]
    before, after, _ = optimized(name, entry)
    ids = example_ids(model, 2, 1 if entry == "decode" else T, seed=T)
    inputs = inputs_for(before, {"B": 2, "T": T, "P": T}, seed=T, input_ids=ids)
    for (out, _), a, b in zip(before.outputs, ir.interpret(before, *inputs), ir.interpret(after, *inputs)):
        assert_close(b, a, torch.float32, what=f"{name} {entry} T={T} {out}")  # fp32 row of the table


def _sites(report, pass_name: str) -> dict[str, int]:
    return next(e.sites for e in report if e.name == pass_name)


def test_k3_tiny_prefill_is_fused_chunked_and_folded(zoo, optimized):
    model = zoo("k3-tiny")[0]
    before, after, report = optimized("k3-tiny", "prefill")
    n_mlp = sum(isinstance(m, GatedMLP) for m in model.modules())  # the dense MLP and the shared experts
    n_moe = sum(isinstance(m, MoE) for m in model.modules())  # routed experts
    counts = after.op_counts()

    # fuse-situ: no SiTU elementwise chain left, one fused op per MLP and expert site
    assert before.op_counts()["tanh"] == 2 * (n_mlp + n_moe)
    assert "tanh" not in counts and "situ" not in counts
    assert (counts["gated_mlp"], counts["moe_experts"]) == (n_mlp, n_moe)
    assert _sites(report, "fuse-situ") == {"situ-from-elementwise": n_mlp + n_moe, "situ-into-gated-mlp": n_mlp,
                                           "situ-into-moe-experts": n_moe}

    # chunk-delta-rule: every recurrent delta-rule op chunked
    n_kda = before.op_counts()["kda"]
    assert not set(counts) & family("delta_family")
    assert counts["chunk_prepare"] == counts["chunk_state_scan"] == counts["chunk_output"] == n_kda
    assert _sites(report, "chunk-delta-rule") == {"chunk-kda": n_kda}

    # fold-latent-moe: the latent norm weight multiply is gone, into routed_expert_up_proj
    producers = after.producers()
    latent_norms = [n for n in after.nodes if n.op == "rms_norm" and producers[n.inputs[0]].op == "moe_experts"]
    assert len(latent_norms) == n_moe and all(len(n.inputs) == 1 for n in latent_norms)
    assert not any("routed_expert_norm" in w for w in after.weights)
    folds = _sites(report, "fold-latent-moe")
    assert folds["latent-norm-into-up-proj"] == n_moe and folds["merge-sibling-linears"] > 0
    assert "latent-norm-into-up-proj 8" in passes.format_report(report)


def test_k3_tiny_decode_keeps_the_recurrence_and_absorbs_mla(optimized):
    before, after, report = optimized("k3-tiny", "decode")
    counts = after.op_counts()
    assert counts["kda"] == before.op_counts()["kda"] and "chunk_prepare" not in counts
    assert counts["mla_attention_absorbed"] == before.op_counts()["mla_attention"] and "mla_attention" not in counts
    entry = next(e for e in report if e.name == "fold-latent-moe")
    assert entry.sites["mla-absorbed"] == 3 and entry.flops_after < entry.flops_before / 2


def test_kimi_linear_tiny_folds_silu_glu_and_the_routing_scale(optimized):
    _, after, report = optimized("kimi-linear-tiny", "prefill")
    counts = after.op_counts()
    assert "silu" not in counts or counts["silu"] < 6  # the MLP activations are inside the fused ops
    assert {"gated_mlp", "moe_experts"} <= set(counts)
    assert 'act="silu"' in str(after)
    assert _sites(report, "fold-latent-moe")["routing-scale-into-experts"] == counts["moe_experts"]
