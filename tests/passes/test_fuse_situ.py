"""fuse-situ: Before/Expected IR text, the forms the export may leave, and what must not match."""

from __future__ import annotations

import pytest
import torch
from passes_testlib import assert_same_outputs, expected, graph_of, inputs_for, run_pass

HEAD = """graph t {
  dim N in [1, inf]
  input %g: f32[N, 8]
  input %u: f32[N, 8]
  %c4: f32[] = const() {value=4.0, dtype="f32"}
  %c25: f32[] = const() {value=25.0, dtype="f32"}
"""

# The SiTU product in the forms an export may leave it: y = situ(g, u) {beta=4, linear_beta=25}
FORMS = {
    "as-exported": """
  %gs: f32[N, 8] = div(%g, %c4)
  %t: f32[N, 8] = tanh(%gs)
  %tb: f32[N, 8] = mul(%t, %c4)
  %s: f32[N, 8] = sigmoid(%g)
  %a: f32[N, 8] = mul(%tb, %s)
  %us: f32[N, 8] = div(%u, %c25)
  %ut: f32[N, 8] = tanh(%us)
  %uc: f32[N, 8] = mul(%ut, %c25)
  %y: f32[N, 8] = mul(%a, %uc)
""",
    "constants-first": """
  %gs: f32[N, 8] = div(%g, %c4)
  %t: f32[N, 8] = tanh(%gs)
  %tb: f32[N, 8] = mul(%c4, %t)
  %s: f32[N, 8] = sigmoid(%g)
  %a: f32[N, 8] = mul(%s, %tb)
  %us: f32[N, 8] = div(%u, %c25)
  %ut: f32[N, 8] = tanh(%us)
  %uc: f32[N, 8] = mul(%c25, %ut)
  %y: f32[N, 8] = mul(%uc, %a)
""",
    "one-long-chain": """
  %gs: f32[N, 8] = div(%g, %c4)
  %t: f32[N, 8] = tanh(%gs)
  %s: f32[N, 8] = sigmoid(%g)
  %us: f32[N, 8] = div(%u, %c25)
  %ut: f32[N, 8] = tanh(%us)
  %p1: f32[N, 8] = mul(%t, %s)
  %p2: f32[N, 8] = mul(%p1, %ut)
  %p3: f32[N, 8] = mul(%p2, %c4)
  %y: f32[N, 8] = mul(%p3, %c25)
""",
    "divide-as-multiply": """
  %q: f32[] = const() {value=0.25, dtype="f32"}
  %q25: f32[] = const() {value=0.04, dtype="f32"}
  %gs: f32[N, 8] = mul(%g, %q)
  %t: f32[N, 8] = tanh(%gs)
  %tb: f32[N, 8] = mul(%t, %c4)
  %s: f32[N, 8] = sigmoid(%g)
  %a: f32[N, 8] = mul(%tb, %s)
  %us: f32[N, 8] = mul(%q25, %u)
  %ut: f32[N, 8] = tanh(%us)
  %uc: f32[N, 8] = mul(%ut, %c25)
  %y: f32[N, 8] = mul(%a, %uc)
""",
}

SITU_ONLY = """graph t {
  dim N in [1, inf]
  input %g: f32[N, 8]
  input %u: f32[N, 8]
  %situ: f32[N, 8] = situ(%g, %u) {beta=4.0, linear_beta=25.0}
  output y = %situ
}
"""


@pytest.mark.parametrize("form", list(FORMS))
def test_situ_chain_becomes_one_op(form):
    g = graph_of(HEAD + FORMS[form] + "  output y = %y\n}\n")
    out, sites = run_pass(g, "fuse-situ")
    assert str(out) == expected(SITU_ONLY)
    assert sites == {"situ-from-elementwise": 1}
    assert_same_outputs(g, out, inputs_for(g, {"N": 5}), form)


def test_situ_without_linear_beta():
    g = graph_of(HEAD + """
  %gs: f32[N, 8] = div(%g, %c4)
  %t: f32[N, 8] = tanh(%gs)
  %tb: f32[N, 8] = mul(%t, %c4)
  %s: f32[N, 8] = sigmoid(%g)
  %a: f32[N, 8] = mul(%tb, %s)
  %y: f32[N, 8] = mul(%a, %u)
  output y = %y
}
""")
    out, _ = run_pass(g, "fuse-situ")
    assert "situ(%g, %u) {beta=4.0, linear_beta=none}" in str(out)
    # the rewrite removes what it replaced; the constant 25 no node ever read is dce's business
    assert [n.op for n in out.nodes] == ["const", "situ"] and out.nodes[0].outputs == ["c25"]
    assert_same_outputs(g, out, inputs_for(g, {"N": 3}))


def test_bf16_casts_around_situ_are_absorbed():
    g = graph_of("""graph t {
  dim N in [1, inf]
  input %g: bf16[N, 8]
  input %u: bf16[N, 8]
  %gf: f32[N, 8] = cast(%g) {dtype="f32"}
  %uf: f32[N, 8] = cast(%u) {dtype="f32"}
  %c2: f32[] = const() {value=2.0, dtype="f32"}
  %c9: f32[] = const() {value=9.0, dtype="f32"}
  %gs: f32[N, 8] = div(%gf, %c2)
  %t: f32[N, 8] = tanh(%gs)
  %tb: f32[N, 8] = mul(%t, %c2)
  %s: f32[N, 8] = sigmoid(%gf)
  %a: f32[N, 8] = mul(%tb, %s)
  %us: f32[N, 8] = div(%uf, %c9)
  %ut: f32[N, 8] = tanh(%us)
  %uc: f32[N, 8] = mul(%ut, %c9)
  %y: f32[N, 8] = mul(%a, %uc)
  %yb: bf16[N, 8] = cast(%y) {dtype="bf16"}
  output y = %yb
}
""")
    out, sites = run_pass(g, "fuse-situ")
    assert str(out) == expected("""graph t {
  dim N in [1, inf]
  input %g: bf16[N, 8]
  input %u: bf16[N, 8]
  %situ: bf16[N, 8] = situ(%g, %u) {beta=2.0, linear_beta=9.0}
  output y = %situ
}""")
    assert sites == {"situ-from-elementwise": 1, "situ-casts": 1}
    assert_same_outputs(g, out, inputs_for(g, {"N": 4}))


MLP = """graph mlp {
  dim N in [1, inf]
  input %x: f32[N, 16]
  weight %mlp.gate_proj.weight: f32[8, 16]
  weight %mlp.up_proj.weight: f32[8, 16]
  weight %mlp.down_proj.weight: f32[16, 8]
  %g: f32[N, 8] = linear(%x, %mlp.gate_proj.weight)
  %u: f32[N, 8] = linear(%x, %mlp.up_proj.weight)
  %c4: f32[] = const() {value=4.0, dtype="f32"}
  %c25: f32[] = const() {value=25.0, dtype="f32"}
""" + FORMS["as-exported"] + """  %o: f32[N, 16] = linear(%y, %mlp.down_proj.weight)
  output o = %o
}
"""


def test_situ_folds_into_gated_mlp():
    g = graph_of(MLP)
    out, sites = run_pass(g, "fuse-situ")
    assert str(out) == expected("""graph mlp {
  dim N in [1, inf]
  input %x: f32[N, 16]
  weight %mlp.down_proj.weight: f32[16, 8]
  weight %mlp.gate_up_proj.weight: f32[16, 16]
  %gated_mlp: f32[N, 8] = gated_mlp(%x, %mlp.gate_up_proj.weight) {act="situ", beta=4.0, linear_beta=25.0}
  %o: f32[N, 16] = linear(%gated_mlp, %mlp.down_proj.weight)
  output o = %o
}""")
    assert sites == {"situ-from-elementwise": 1, "situ-into-gated-mlp": 1}
    assert_same_outputs(g, out, inputs_for(g, {"N": 7}))


def test_silu_glu_folds_into_gated_mlp():
    g = graph_of("""graph mlp {
  dim N in [1, inf]
  input %x: f32[N, 16]
  weight %gate.weight: f32[8, 16]
  weight %up.weight: f32[8, 16]
  %g: f32[N, 8] = linear(%x, %gate.weight)
  %u: f32[N, 8] = linear(%x, %up.weight)
  %s: f32[N, 8] = silu(%g)
  %y: f32[N, 8] = mul(%u, %s)
  output y = %y
}""")
    out, sites = run_pass(g, "fuse-situ")
    assert str(out) == expected("""graph mlp {
  dim N in [1, inf]
  input %x: f32[N, 16]
  weight %gate_up_proj.weight: f32[16, 16]
  %gated_mlp: f32[N, 8] = gated_mlp(%x, %gate_up_proj.weight) {act="silu"}
  output y = %gated_mlp
}""")
    assert sites == {"silu-glu-into-gated-mlp": 1}
    assert_same_outputs(g, out, inputs_for(g, {"N": 3}))


EXPERTS = """graph moe {
  dim N in [1, inf]
  input %h: f32[N, 16]
  input %idx: i64[N, 2]
  input %w: f32[N, 2]
  weight %experts.w13: f32[4, 12, 16]
  weight %experts.w2: f32[4, 16, 6]
  %gu: f32[N, 2, 12] = moe_gate_up(%h, %experts.w13, %idx)
  %lo: f32[N, 2, 6] = slice(%gu) {dim=2, start=0, end=6, step=1}
  %hi: f32[N, 2, 6] = slice(%gu) {dim=2, start=LO, end=HI, step=1}
  ACT
  %y: f32[N, 16] = moe_down(%a, %experts.w2, %idx, %w)
  output y = %y
}"""

SITU_ACT = """%c4: f32[] = const() {value=4.0, dtype="f32"}
  %gs: f32[N, 2, 6] = div(%lo, %c4)
  %t: f32[N, 2, 6] = tanh(%gs)
  %tb: f32[N, 2, 6] = mul(%t, %c4)
  %s: f32[N, 2, 6] = sigmoid(%lo)
  %a0: f32[N, 2, 6] = mul(%tb, %s)
  %a: f32[N, 2, 6] = mul(%a0, %hi)"""
SILU_ACT = """%s: f32[N, 2, 6] = silu(%lo)
  %a: f32[N, 2, 6] = mul(%s, %hi)"""


def _experts(act: str, lo: int = 6, hi: int = 12) -> str:
    return EXPERTS.replace("ACT", act).replace("LO", str(lo)).replace("HI", str(hi))


@pytest.mark.parametrize("act, attrs, rule", [
    (SITU_ACT, '{act="situ", beta=4.0, linear_beta=none}', "situ-into-moe-experts"),
    (SILU_ACT, '{act="silu"}', "silu-glu-into-moe-experts"),
], ids=["situ", "silu-glu"])
def test_routed_experts_fold_into_moe_experts(act, attrs, rule):
    g = graph_of(_experts(act))
    out, sites = run_pass(g, "fuse-situ")
    assert str(out) == expected(f"""graph moe {{
  dim N in [1, inf]
  input %h: f32[N, 16]
  input %idx: i64[N, 2]
  input %w: f32[N, 2]
  weight %experts.w13: f32[4, 12, 16]
  weight %experts.w2: f32[4, 16, 6]
  %moe_experts: f32[N, 16] = moe_experts(%h, %experts.w13, %experts.w2, %idx, %w) {attrs}
  output y = %moe_experts
}}""")
    assert sites[rule] == 1
    idx = torch.randint(0, 4, (9, 2), generator=torch.Generator().manual_seed(1))
    assert_same_outputs(g, out, inputs_for(g, {"N": 9}, idx=idx))


# ---------------------------------------------------------------------- must not match

NOT_SITU = {
    # a tanh that is not SiTU's: tanh of one value, sigmoid of another
    "tanh-and-sigmoid-of-different-values": """
  %gs: f32[N, 8] = div(%g, %c4)
  %t: f32[N, 8] = tanh(%gs)
  %tb: f32[N, 8] = mul(%t, %c4)
  %s: f32[N, 8] = sigmoid(%u)
  %y: f32[N, 8] = mul(%tb, %s)
""",
    # the two betas of the gate differ: 4 tanh(g / 25) sigmoid(g) u
    "betas-differ": """
  %gs: f32[N, 8] = div(%g, %c25)
  %t: f32[N, 8] = tanh(%gs)
  %tb: f32[N, 8] = mul(%t, %c4)
  %s: f32[N, 8] = sigmoid(%g)
  %a: f32[N, 8] = mul(%tb, %s)
  %y: f32[N, 8] = mul(%a, %u)
""",
    # a plain tanh-scaled value times something, no sigmoid
    "no-sigmoid": """
  %gs: f32[N, 8] = div(%g, %c4)
  %t: f32[N, 8] = tanh(%gs)
  %tb: f32[N, 8] = mul(%t, %c4)
  %y: f32[N, 8] = mul(%tb, %u)
""",
    # tanh(g) * sigmoid(g) * u without the 1/beta inside the tanh
    "tanh-not-scaled": """
  %t: f32[N, 8] = tanh(%g)
  %tb: f32[N, 8] = mul(%t, %c4)
  %s: f32[N, 8] = sigmoid(%g)
  %a: f32[N, 8] = mul(%tb, %s)
  %y: f32[N, 8] = mul(%a, %u)
""",
}


@pytest.mark.parametrize("case", list(NOT_SITU))
def test_not_situ_is_left_alone(case):
    g = graph_of(HEAD + NOT_SITU[case] + "  output y = %y\n}\n")
    out, sites = run_pass(g, "fuse-situ")
    assert sites == {} and str(out) == str(g)


def test_situ_whose_inner_value_is_also_an_output_is_left_alone():
    g = graph_of(HEAD + FORMS["as-exported"] + "  output y = %y\n  output gate = %a\n}\n")
    out, sites = run_pass(g, "fuse-situ")
    assert sites == {}, "fusing would compute the gate half twice"
    assert str(out) == str(g)


def test_gate_and_up_reading_different_inputs_are_not_folded():
    text = MLP.replace("linear(%x, %mlp.up_proj.weight)", "linear(%x2, %mlp.up_proj.weight)")
    text = text.replace("input %x: f32[N, 16]", "input %x: f32[N, 16]\n  input %x2: f32[N, 16]")
    _, sites = run_pass(graph_of(text), "fuse-situ")
    assert sites == {"situ-from-elementwise": 1}


def test_linear_with_bias_is_not_folded():
    text = MLP.replace("weight %mlp.down_proj.weight",
                       "weight %mlp.gate_proj.bias: f32[8]\n  weight %mlp.down_proj.weight")
    text = text.replace("linear(%x, %mlp.gate_proj.weight)", "linear(%x, %mlp.gate_proj.weight, %mlp.gate_proj.bias)")
    out, sites = run_pass(graph_of(text), "fuse-situ")
    assert sites == {"situ-from-elementwise": 1}
    assert out.op_counts() == {"linear": 3, "situ": 1}


@pytest.mark.parametrize("lo, hi", [(6, 12), (0, 6)], ids=["halves", "same-half-twice"])
def test_expert_slices_must_be_the_two_halves(lo, hi):
    g = graph_of(_experts(SILU_ACT, lo, hi))
    _, sites = run_pass(g, "fuse-situ")
    assert sites.get("silu-glu-into-moe-experts", 0) == (1 if lo == 6 else 0)
