"""The Triton backend's contracts: every op lowers or decomposes, unsupported nodes and misfit
inputs are named, the generated source is deterministic, dims print as integer Python."""

from __future__ import annotations

import pytest
import sympy
import torch
from test_triton_codegen import ELEMENTWISE, SHARED, graph_of

from k3c import ir
from k3c.backends import UnsupportedNodeError, check_supported
from k3c.backends import tables as L
from k3c.backends.triton import TritonBackend, generate_module
from k3c.backends.triton.codegen import dim_code
from k3c.errors import ArtifactError
from k3c.ir import OPS, InputError


def test_every_op_has_a_lowering_or_a_decomposition():
    table = L.load("triton")
    missing = [op for op in OPS if op not in table and OPS[op].decompose is None]
    assert not missing, f"ops with neither a Triton lowering nor a decomposition: {missing}"


def test_an_unsupported_node_is_named_with_its_reason():
    g = graph_of("""
    graph bad {
      dim B in [1, inf]
      input %q: f32[B, 1, 2, 512]
      input %v: f32[B, 1, 2, 8]
      input %beta: f32[B, 1, 2]
      input %S: f32[B, 2, 512, 8]
      %o: f32[B, 1, 2, 8], %S2: f32[B, 2, 512, 8] = delta_rule(%q, %q, %v, %beta, %S) {scale=0.1}  # model.py:7
      output o = %o
    }
    """)
    with pytest.raises(UnsupportedNodeError, match=r"delta_rule \(%o\) at model.py:7: head dims K=512"):
        check_supported(TritonBackend(), g)


def test_a_misfit_input_is_named(tmp_path):
    g = graph_of(SHARED)
    backend = TritonBackend()
    backend.lower({"forward": g}, tmp_path)
    with pytest.raises(InputError, match=r"input 'x': expected f32\[N, 8\], got \[3, 7\]"):
        backend.load(tmp_path).run("forward", torch.randn(3, 7))


def test_loading_a_folder_without_an_artifact_says_so(tmp_path):
    with pytest.raises(ArtifactError, match="no manifest.json"):
        TritonBackend().load(tmp_path)


def test_the_generated_source_is_deterministic():
    g = graph_of(ELEMENTWISE)
    source = generate_module({"forward": g}, "t")
    assert source == generate_module({"forward": g.copy()}, "t")
    assert "def forward_entry(W, x, s):" in source, "an entry named forward keeps the dispatcher's name free"
    assert "ENTRIES = {'forward': forward_entry}" in source


@pytest.mark.parametrize("expr, code", [
    ("B*T", "B*T"), ("P + 1", "P + 1"), ("T - 1", "T - 1"), ("2*B*T + 3", "2*B*T + 3"),
    ("ceiling(T/64)", "-(-(T) // 64)"), ("floor((T + 3)/4)", "(T + 3) // 4"), ("Max(T, P)", "max(P, T)"),
])
def test_dims_print_as_integer_python(expr, code):
    syms = {n: ir.dims.sym(n) for n in "BTP"}
    d = ir.dims.parse(expr, syms)
    assert dim_code(d) == code
    env = {"B": 3, "T": 130, "P": 7}
    assert eval(code, {}, env) == ir.dims.evaluate(d, env)
    assert isinstance(sympy.sympify(d), sympy.Basic)
