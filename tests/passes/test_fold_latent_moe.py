"""fold-latent-moe: Before/Expected IR text for every fold, numerics, and the folds that must not happen."""

from __future__ import annotations

import pytest
from passes_testlib import assert_same_outputs, expected, graph_of, inputs_for, run_pass

LATENT_MOE = """graph moe {
  dim N in [1, inf]
  input %x: f32[N, 16]
  weight %moe.gate.weight: f32[4, 16]
  weight %moe.routed_expert_down_proj.weight: f32[12, 16]
  weight %moe.routed_expert_up_proj.weight: f32[16, 12]
  weight %moe.routed_expert_norm.weight: f32[12]
  weight %moe.experts.w13: f32[4, 10, 12]
  weight %moe.experts.w2: f32[4, 12, 5]
  %logits: f32[N, 4] = linear(%x, %moe.gate.weight)
  %s: f32[N, 4] = sigmoid(%logits)
  %top.0: f32[N, 2], %top.1: i64[N, 2] = topk(%s) {k=2, dim=1}
  %w: f32[N, 2] = gather(%s, %top.1) {dim=1}
  %scale: f32[] = const() {value=SCALE, dtype="f32"}
  %ws: f32[N, 2] = mul(%w, %scale)
  %h: f32[N, 12] = linear(%x, %moe.routed_expert_down_proj.weight)
  %y: f32[N, 12] = moe_experts(%h, %moe.experts.w13, %moe.experts.w2, %top.1, %ws) {act="silu"}
  %yn: f32[N, 12] = rms_norm(%y, %moe.routed_expert_norm.weight) {eps=1e-05}
  %o: f32[N, 16] = linear(%yn, %moe.routed_expert_up_proj.weight)
  output o = %o
}"""


def test_latent_moe_before_expected():
    g = graph_of(LATENT_MOE.replace("SCALE", "2.5"))
    out, sites = run_pass(g, "fold-latent-moe")
    assert sites == {"merge-sibling-linears": 1, "latent-norm-into-up-proj": 1, "routing-scale-into-experts": 1}
    assert str(out) == expected("""graph moe {
  dim N in [1, inf]
  input %x: f32[N, 16]
  weight %moe.experts.w13: f32[4, 10, 12]
  weight %moe.gate-routed_expert_down_proj.weight: f32[16, 16]
  weight %moe.routed_expert_up_proj.weight.normed: f32[16, 12]
  weight %moe.experts.w2.scaled: f32[4, 12, 5]
  %logits_merged: f32[N, 16] = linear(%x, %moe.gate-routed_expert_down_proj.weight)
  %logits_merged.0: f32[N, 4], %logits_merged.1: f32[N, 12] = split(%logits_merged) {dim=1, sizes=[4, 12]}
  %s: f32[N, 4] = sigmoid(%logits_merged.0)
  %top.0: f32[N, 2], %top.1: i64[N, 2] = topk(%s) {k=2, dim=1}
  %w: f32[N, 2] = gather(%s, %top.1) {dim=1}
  %y: f32[N, 12] = moe_experts(%logits_merged.1, %moe.experts.w13, %moe.experts.w2.scaled, %top.1, %w) {act="silu"}
  %yn: f32[N, 12] = rms_norm(%y) {eps=1e-05}
  %o: f32[N, 16] = linear(%yn, %moe.routed_expert_up_proj.weight.normed)
  output o = %o
}""")
    assert_same_outputs(g, out, inputs_for(g, {"N": 11}))


def test_unit_routing_scale_is_dropped():
    g = graph_of(LATENT_MOE.replace("SCALE", "1.0"))
    out, sites = run_pass(g, "fold-latent-moe")
    assert sites["routing-scale-into-experts"] == 1
    assert "mul" not in out.op_counts() and "w2.scaled" not in str(out)
    assert_same_outputs(g, out, inputs_for(g, {"N": 5}))


def test_routing_scale_by_a_tensor_is_not_folded():
    g = graph_of(LATENT_MOE.replace('%scale: f32[] = const() {value=SCALE, dtype="f32"}',
                                    "%scale: f32[N, 2] = sigmoid(%top.0)"))
    _, sites = run_pass(g, "fold-latent-moe")
    assert "routing-scale-into-experts" not in sites


def test_norm_whose_output_is_also_used_elsewhere_is_not_folded():
    g = graph_of(LATENT_MOE.replace("SCALE", "1.0").replace("  output o = %o", "  output o = %o\n  output yn = %yn"))
    out, sites = run_pass(g, "fold-latent-moe")
    assert "latent-norm-into-up-proj" not in sites
    assert "rms_norm(%y, %moe.routed_expert_norm.weight)" in str(out)


SIBLINGS = """graph attn {
  dim N in [1, inf]
  input %x: f32[N, 16]
  weight %attn.q_a_proj.weight: f32[6, 16]
  weight %attn.kv_a_proj_with_mqa.weight: f32[10, 16]
  weight %attn.g_proj.weight: f32[8, 16]
  %qa: f32[N, 6] = linear(%x, %attn.q_a_proj.weight)
  %kva: f32[N, 10] = linear(%x, %attn.kv_a_proj_with_mqa.weight)
  %ckv, %kr: SPLIT
  %g: f32[N, 8] = linear(%x, %attn.g_proj.weight)
  output qa = %qa
  output ckv = %ckv
  output kr = %kr
  output g = %g
}""".replace("%ckv, %kr: SPLIT", "%ckv: f32[N, 7], %kr: f32[N, 3] = split(%kva) {dim=1, sizes=[7, 3]}")


def test_linears_reading_one_input_become_one_gemm():
    g = graph_of(SIBLINGS)
    out, sites = run_pass(g, "fold-latent-moe")
    assert sites == {"merge-sibling-linears": 1}
    assert str(out) == expected("""graph attn {
  dim N in [1, inf]
  input %x: f32[N, 16]
  weight %attn.q_a_proj-kv_a_proj_with_mqa-g_proj.weight: f32[24, 16]
  %qa_merged: f32[N, 24] = linear(%x, %attn.q_a_proj-kv_a_proj_with_mqa-g_proj.weight)
  %qa_merged.0: f32[N, 6], %qa_merged.1: f32[N, 10], %qa_merged.2: f32[N, 8] = split(%qa_merged) \
{dim=1, sizes=[6, 10, 8]}
  %ckv: f32[N, 7], %kr: f32[N, 3] = split(%qa_merged.1) {dim=1, sizes=[7, 3]}
  output qa = %qa_merged.0
  output ckv = %ckv
  output kr = %kr
  output g = %qa_merged.2
}""")
    assert_same_outputs(g, out, inputs_for(g, {"N": 3}))


@pytest.mark.parametrize("old, new, why", [
    ("output g = %g", "%qa2: f32[N, 6] = linear(%z, %attn.q_a_proj.weight)\n  output g = %g\n  output qa2 = %qa2",
     "the q_a weight is read by another linear too: a merge would store it twice"),
    ("%qa: f32[N, 6] = linear(%x, %attn.q_a_proj.weight)", "%qa: f32[N, 6] = linear(%x, %attn.q_a_proj.weight, %b)",
     "a linear with a bias"),
], ids=["shared-weight", "bias"])
def test_merge_leaves_out_what_it_cannot_take(old, new, why):
    text = SIBLINGS.replace(old, new).replace("input %x: f32[N, 16]",
                                              "input %x: f32[N, 16]\n  input %z: f32[N, 16]\n  input %b: f32[6]")
    out, sites = run_pass(graph_of(text), "fold-latent-moe")
    assert sites == {"merge-sibling-linears": 1}, why
    assert "q_a_proj-" not in str(out) and "kv_a_proj_with_mqa-g_proj.weight: f32[18, 16]" in str(out), why


def test_norm_weight_folds_into_its_only_linear():
    g = graph_of("""graph qa {
  dim N in [1, inf]
  input %x: f32[N, 16]
  weight %q_a_layernorm.weight: f32[16]
  weight %q_b_proj.weight: f32[8, 16]
  %n: f32[N, 16] = rms_norm(%x, %q_a_layernorm.weight) {eps=1e-06}
  %q: f32[N, 8] = linear(%n, %q_b_proj.weight)
  output q = %q
}""")
    out, sites = run_pass(g, "fold-latent-moe")
    assert sites == {"norm-weight-into-linear": 1}
    assert str(out) == expected("""graph qa {
  dim N in [1, inf]
  input %x: f32[N, 16]
  weight %q_b_proj.weight.normed: f32[8, 16]
  %n: f32[N, 16] = rms_norm(%x) {eps=1e-06}
  %q: f32[N, 8] = linear(%n, %q_b_proj.weight.normed)
  output q = %q
}""")
    assert_same_outputs(g, out, inputs_for(g, {"N": 4}))


MLA = """graph mla {
  dim B in [1, inf]
  dim P in [1, inf]
  meta {"entry": "ENTRY"}
  input %q: f32[B, 1, 2, 12]
  input %ckv: f32[B, P, 6]
  input %krope: f32[B, P, 4]
  weight %attn.kv_b_proj.weight: f32[28, 6]
  %o: f32[B, 1, 2, 6] = mla_attention(%q, %ckv, %krope, %attn.kv_b_proj.weight) {v_head_dim=6, scale=0.3}
  output o = %o
}"""


def test_mla_decode_is_absorbed():
    g = graph_of(MLA.replace("ENTRY", "decode"))
    out, sites = run_pass(g, "fold-latent-moe")
    assert sites == {"mla-absorbed": 1}
    assert str(out) == expected("""graph mla {
  dim B in [1, inf]
  dim P in [1, inf]
  meta {"entry": "decode"}
  input %q: f32[B, 1, 2, 12]
  input %ckv: f32[B, P, 6]
  input %krope: f32[B, P, 4]
  weight %attn.kv_b_proj.w_uk: f32[2, 8, 6]
  weight %attn.kv_b_proj.w_uv: f32[2, 6, 6]
  %o: f32[B, 1, 2, 6] = mla_attention_absorbed(%q, %ckv, %krope, %attn.kv_b_proj.w_uk, %attn.kv_b_proj.w_uv) \
{scale=0.3}
  output o = %o
}""")
    for P in (1, 40):
        assert_same_outputs(g, out, inputs_for(g, {"B": 2, "P": P}), f"P={P}")


def test_mla_is_not_absorbed_for_a_block_of_queries():
    """Absorption is for a decode step (T the constant 1 against a cache), whatever the graph
    calls itself; a prefill's block of T queries keeps the up-projected form."""
    text = MLA.replace("ENTRY", "prefill").replace("dim P in [1, inf]", "dim P in [1, inf]\n  dim T in [1, inf]")
    _, sites = run_pass(graph_of(text.replace("[B, 1, 2", "[B, T, 2")), "fold-latent-moe")
    assert sites == {}


def test_mla_absorption_is_guarded_by_cost():
    # a long static query block against a wide latent: the absorbed form would cost more
    text = MLA.replace("ENTRY", "decode").replace("[B, P,", "[B, 4096,").replace("[B, 1, 2", "[B, 4096, 2")
    text = text.replace("6]\n  input %krope", "64]\n  input %krope").replace("f32[28, 6]", "f32[28, 64]")
    _, sites = run_pass(graph_of(text), "fold-latent-moe")
    assert sites == {}


def test_a_bf16_weight_takes_no_folded_product():
    """W diag(n) rounded to BF16 moves each weight by up to 2^-9 relative: no fp32-level change
    (on a MoE model it flips routing), so the fold declines where W is BF16, through the casts
    of a BF16 model as well."""
    g = graph_of("""graph moe {
  dim N in [1, inf]
  input %y: bf16[N, 12]
  weight %norm.weight: f32[12]
  weight %up.weight: bf16[16, 12]
  %yf: f32[N, 12] = cast(%y) {dtype="f32"}
  %yn: f32[N, 12] = rms_norm(%yf, %norm.weight) {eps=1e-05}
  %yb: bf16[N, 12] = cast(%yn) {dtype="bf16"}
  %o: bf16[N, 16] = linear(%yb, %up.weight)
  output o = %o
}""")
    out, sites = run_pass(g, "fold-latent-moe")
    assert sites == {}
    assert out.op_counts() == g.op_counts()
