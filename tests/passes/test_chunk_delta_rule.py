"""chunk-delta-rule: Before/Expected IR text, every recurrent op against its chunked rewrite
through the interpreter (T not a multiple of the chunk, T = 1, several chunks), decode untouched."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from passes_testlib import assert_same_outputs, expected, graph_of, run_pass

from k3c import ir, passes

B, H, K, V = 2, 2, 8, 6

OPS = {
    "kda": ("%g: f32[B, T, 2, 8]", "kda(%q, %k, %v, %g, %beta, %s0)", "channel"),
    "gated_delta_rule": ("%g: f32[B, T, 2]", "gated_delta_rule(%q, %k, %v, %g, %beta, %s0)", "head"),
    "delta_rule": (None, "delta_rule(%q, %k, %v, %beta, %s0)", "none"),
}


def _delta_graph(op: str, entry: str = "prefill", v_dtype: str = "f32") -> str:
    g_decl, call, _ = OPS[op]
    T = "1" if entry == "decode" else "T"
    lines = [f"graph {op} {{", "  dim B in [1, inf]"] + (["  dim T in [1, inf]"] if T == "T" else [])
    lines.append(f'  meta {{"entry": "{entry}"}}')
    lines += [f"  input %q: f32[B, {T}, 2, 8]", f"  input %k: f32[B, {T}, 2, 8]",
              f"  input %v: {v_dtype}[B, {T}, 2, 6]"]
    if g_decl:
        lines.append("  input " + g_decl.replace("T", T))
    lines += [f"  input %beta: f32[B, {T}, 2]", "  input %s0: f32[B, 2, 8, 6]",
              f"  %{op}.0: {v_dtype}[B, {T}, 2, 6], %{op}.1: f32[B, 2, 8, 6] = {call} {{scale=0.35}}",
              f"  output o = %{op}.0", f"  output s = %{op}.1", "}"]
    return "\n".join(lines)


def test_kda_before_expected():
    g = graph_of(_delta_graph("kda"))
    out, sites = run_pass(g, "chunk-delta-rule{chunk_size=16}")
    assert sites == {"chunk-kda": 1}
    assert str(out) == expected("""graph kda {
  dim B in [1, inf]
  dim T in [1, inf]
  meta {"entry": "prefill"}
  input %q: f32[B, T, 2, 8]
  input %k: f32[B, T, 2, 8]
  input %v: f32[B, T, 2, 6]
  input %g: f32[B, T, 2, 8]
  input %beta: f32[B, T, 2]
  input %s0: f32[B, 2, 8, 6]
  %kda.q_decayed: f32[B, 2, ceiling(T/16), 16, 8], %kda.k_decayed: f32[B, 2, ceiling(T/16), 16, 8], \
%kda.w: f32[B, 2, ceiling(T/16), 16, 8], %kda.u: f32[B, 2, ceiling(T/16), 16, 6], \
%kda.aqk: f32[B, 2, ceiling(T/16), 16, 16], %kda.decay_last: f32[B, 2, ceiling(T/16), 8] = \
chunk_prepare(%q, %k, %v, %beta, %g) {chunk_size=16, gate="channel"}
  %kda.v_new: f32[B, 2, ceiling(T/16), 16, 6], %kda.start_states: f32[B, 2, ceiling(T/16), 8, 6], \
%kda.state_out: f32[B, 2, 8, 6] = chunk_state_scan(%kda.w, %kda.u, %kda.k_decayed, %kda.decay_last, %s0)
  %kda.o: f32[B, T, 2, 6] = chunk_output(%kda.q_decayed, %kda.aqk, %kda.v_new, %kda.start_states) {scale=0.35, T=T}
  output o = %kda.o
  output s = %kda.state_out
}""")


def _inputs(graph, T: int, seed: int = 0) -> list[torch.Tensor]:
    """Inputs shaped like the layers feed the ops: l2-normalised q, k; log-decays <= 0; beta in (0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for name in graph.inputs:
        t = graph.types[name]
        shape = [ir.dims.evaluate(d, {"B": B, "T": T}) for d in t.shape]
        x = torch.randn(shape, generator=gen)
        if name in ("q", "k"):
            x = F.normalize(x if graph.name != "linear_attention" else F.elu(x) + 1, dim=-1)
        elif name == "g":
            x = -torch.rand(shape, generator=gen)
        elif name in ("beta", "z0"):
            x = torch.rand(shape, generator=gen) + (1.0 if name == "z0" else 0.0)
        elif name == "s0" and graph.name == "linear_attention":
            x = x.abs()
        out.append(x.to(t.torch_dtype))
    return out


@pytest.mark.parametrize("T", [1, 15, 16, 17, 40], ids=lambda T: f"T{T}")
@pytest.mark.parametrize("op", list(OPS))
def test_chunked_equals_recurrent(op, T):
    g = graph_of(_delta_graph(op))
    out, sites = run_pass(g, "chunk-delta-rule{chunk_size=16}")
    assert sum(sites.values()) == 1 and op not in out.op_counts()
    assert_same_outputs(g, out, _inputs(g, T), f"{op} T={T}")


LINEAR = """graph linear_attention {
  dim B in [1, inf]
  dim T in [1, inf]
  input %q: f32[B, T, 2, 8]
  input %k: f32[B, T, 2, 8]
  input %v: VDT[B, T, 2, 6]
  input %s0: f32[B, 2, 8, 6]
  input %z0: f32[B, 2, 8]
  %la.0: VDT[B, T, 2, 6], %la.1: f32[B, 2, 8, 6], %la.2: f32[B, 2, 8] = linear_attention(%q, %k, %v, %s0, %z0) \
{scale=0.35}
  output o = %la.0
  output s = %la.1
  output z = %la.2
}"""


@pytest.mark.parametrize("T", [1, 15, 40], ids=lambda T: f"T{T}")
def test_linear_attention_carries_the_normaliser_as_a_value_column(T):
    g = graph_of(LINEAR.replace("VDT", "f32"))
    out, sites = run_pass(g, "chunk-delta-rule{chunk_size=16}")
    assert sites == {"chunk-linear-attention": 1}
    counts = out.op_counts()
    assert counts["chunk_prepare"] == 1 and counts["concat"] == 2 and "linear_attention" not in counts
    assert 'gate="linear"' in str(out)
    assert_same_outputs(g, out, _inputs(g, T), f"linear attention T={T}")


def test_output_is_cast_back_to_v_dtype():
    g = graph_of(_delta_graph("delta_rule", v_dtype="bf16"))
    out, _ = run_pass(g, "chunk-delta-rule")
    o = out.outputs[0][1]
    assert out.types[o].dtype == "bf16" and out.producers()[o].op == "cast"
    la, _ = run_pass(graph_of(LINEAR.replace("VDT", "bf16")), "chunk-delta-rule")
    assert la.types[la.outputs[0][1]].dtype == "bf16"


@pytest.mark.parametrize("op", list(OPS))
def test_decode_graphs_keep_the_recurrent_form(op):
    g = graph_of(_delta_graph(op, entry="decode"))
    out, sites = run_pass(g, "chunk-delta-rule")
    assert sites == {} and str(out) == str(g)


def test_a_single_token_graph_is_not_chunked_whatever_its_entry():
    text = _delta_graph("kda", entry="decode").replace('"decode"', '"forward"')
    _, sites = run_pass(graph_of(text), "chunk-delta-rule")
    assert sites == {}


def test_default_chunk_size_is_64():
    out, _ = run_pass(graph_of(_delta_graph("kda")), "chunk-delta-rule")
    assert "chunk_size=64" in str(out) and "ceiling(T/64)" in str(out)


@pytest.mark.parametrize("step, message", [
    ("chunk-delta-rule{chunk_size=0}", "chunk_size must be a positive int"),
    ("chunk-delta-rule{chunk=16}", "has no option(s) ['chunk']"),
    ("chunk-delta-rule{chunk_size}", "expected key=value"),
], ids=["zero", "unknown-option", "malformed"])
def test_bad_chunk_size_options_are_clear_errors(step, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        passes.run(graph_of(_delta_graph("kda")), [step])
