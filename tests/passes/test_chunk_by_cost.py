"""chunk-delta-rule{by="flops"}: the cost model picks each recurrent op's prefill form. The
choice must be the one a whole-graph comparison of the two forms makes (graph_cost of the
graph left whole against the graph chunked always), both ways occur, and the TVM backend
asks for it on a CPU target only."""

from __future__ import annotations

import pytest
from passes_testlib import graph_of

from k3c import passes
from k3c.backends import get
from k3c.passes.cost import graph_cost

GATE = {"kda": "  input %g: f32[B, T, 2, {K}]\n", "gated_delta_rule": "  input %g: f32[B, T, 2]\n", "delta_rule": ""}
ARGS = {"kda": "%q, %k, %v, %g, %beta, %s0", "gated_delta_rule": "%q, %k, %v, %g, %beta, %s0",
        "delta_rule": "%q, %k, %v, %beta, %s0"}


def delta_graph(op: str, K: int, V: int):
    return graph_of(
        f'graph t {{\n  dim B in [1, inf]\n  dim T in [1, inf]\n  meta {{"entry": "prefill"}}\n'
        f"  input %q: f32[B, T, 2, {K}]\n  input %k: f32[B, T, 2, {K}]\n  input %v: f32[B, T, 2, {V}]\n"
        + GATE[op].format(K=K) +
        f"  input %beta: f32[B, T, 2]\n  input %s0: f32[B, 2, {K}, {V}]\n"
        f"  %o: f32[B, T, 2, {V}], %s: f32[B, 2, {K}, {V}] = {op}({ARGS[op]}) {{scale=0.35}}\n"
        f"  output o = %o\n  output s = %s\n}}")


CASES = [(64, 64, 64), (64, 64, 8), (8, 6, 4), (128, 128, 16), (256, 256, 16), (256, 256, 4)]


@pytest.mark.parametrize("op", list(ARGS))
@pytest.mark.parametrize("K, V, C", CASES, ids=[f"K{k}-V{v}-C{c}" for k, v, c in CASES])
def test_the_form_with_fewer_flops_is_kept(op, K, V, C):
    g = delta_graph(op, K, V)
    chunked = passes.run(g, [f"chunk-delta-rule{{chunk_size={C}}}"])
    chosen = passes.run(g, [f'chunk-delta-rule{{chunk_size={C}, by="flops"}}'])
    want_chunked = graph_cost(chunked).flops < graph_cost(g).flops
    assert (op not in chosen.op_counts()) == want_chunked
    assert str(chosen) == str(chunked if want_chunked else g)


def test_both_forms_occur():
    """At K = V = 64 (KDA's heads in K3) the recurrence has fewer FLOPs whatever the chunk;
    at K = V = 256 with small chunks the chunked form has."""
    kept = passes.run(delta_graph("kda", 64, 64), ['chunk-delta-rule{by="flops"}']).op_counts()
    chunked = passes.run(delta_graph("kda", 256, 256), ['chunk-delta-rule{chunk_size=16, by="flops"}']).op_counts()
    assert kept == {"kda": 1} and "kda" not in chunked and chunked["chunk_state_scan"] == 1


def test_tvm_asks_for_the_cost_models_choice_on_a_cpu_only():
    steps = passes.steps_of("default")
    on_cpu = passes.for_backend(steps, chunk_by=get("tvm").chunk_by)
    assert 'chunk-delta-rule{by="flops"}' in on_cpu
    assert passes.for_backend(steps, chunk_by=get("tvm", target="cuda").chunk_by) == steps
    # a pipeline that says how to chunk is left as it is
    said = ['chunk-delta-rule{by="always"}']
    assert passes.for_backend(said, chunk_by="flops") == said


def test_onnx_asks_for_its_chunk_length_unless_the_pipeline_says_one():
    onnx = passes.backend_choices(get("onnx"))
    assert onnx["chunk_size"] == 32
    on_onnx = passes.for_backend(passes.steps_of("default"), **onnx)
    assert "chunk-delta-rule{chunk_size=32}" in on_onnx
    said = ["chunk-delta-rule{chunk_size=16}"]
    assert passes.for_backend(said, **onnx) == said
    # the ort flavour asks for the same length and keeps what onnxruntime's kernel runs whole
    ort = passes.for_backend(passes.steps_of("default"), **passes.backend_choices(get("onnx", flavour="ort")))
    step = next(s for s in ort if s.startswith("chunk-delta-rule"))
    assert "chunk_size=32" in step and "keep=" in step
    assert passes.backend_choices(get("tvm"))["chunk_size"] is None


def test_a_bad_choice_is_a_clear_error():
    with pytest.raises(ValueError, match="by must be one of"):
        passes.run(delta_graph("kda", 8, 6), ['chunk-delta-rule{by="speed"}'])
