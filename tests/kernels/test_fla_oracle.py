"""An external oracle: fla's naive KDA and gated delta rule (fla-core, CPU-capable references).

fla's naive functions take the same [B, T, H, K] layout and [B, H, K, V] state, apply the
scale to q themselves and do not l2-normalise; the gated delta rule takes (beta, g) in that
order where KDA takes (g, beta).
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import pytest
from kernel_inputs import delta_inputs

from k3c.kernels import gated_delta_rule, kda
from k3c.numerics import assert_close


@functools.cache
def fla_naive(op: str, name: str):
    """fla.ops.<op>.naive.<name>, loaded from its file: importing the fla package pulls in
    Triton and transformers (many seconds); the naive references need only torch and einops."""
    spec = importlib.util.find_spec("fla")
    assert spec is not None and spec.origin, "fla-core is a test dependency"
    path = Path(spec.origin).parent / "ops" / op / "naive.py"
    mod_spec = importlib.util.spec_from_file_location(f"fla_naive_{op}", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return getattr(mod, name)


@pytest.mark.parametrize("C", [None, 16, 64], ids=["recurrent", "C16", "C64"])
@pytest.mark.parametrize("T", [1, 63, 130], ids=lambda t: f"T{t}")
def test_kda_matches_fla_naive_recurrent(T, C):
    fla_kda = fla_naive("kda", "naive_recurrent_kda")
    x = delta_inputs(T, gate="channel", with_state=True)
    scale = 0.3
    o_ref, S_ref = fla_kda(x.q, x.k, x.v, x.g, x.beta, scale, x.state, output_final_state=True)
    o, S = kda(x.q, x.k, x.v, x.g, x.beta, scale=scale, initial_state=x.state, chunk_size=C)
    assert_close(o, o_ref, what="o")
    assert_close(S, S_ref, what="final state")


@pytest.mark.parametrize("C", [None, 16, 64], ids=["recurrent", "C16", "C64"])
@pytest.mark.parametrize("T", [1, 63, 130], ids=lambda t: f"T{t}")
def test_gated_delta_rule_matches_fla_naive_recurrent(T, C):
    fla_gdr = fla_naive("gated_delta_rule", "naive_recurrent_gated_delta_rule")
    x = delta_inputs(T, gate="head", with_state=True)
    o_ref, S_ref = fla_gdr(x.q, x.k, x.v, x.beta, x.g, None, x.state, output_final_state=True)
    o, S = gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, initial_state=x.state, chunk_size=C)
    assert_close(o, o_ref, what="o")
    assert_close(S, S_ref, what="final state")


@pytest.mark.parametrize("T", [64, 192], ids=lambda t: f"T{t}")
def test_chunk_kda_matches_fla_naive_chunk(T):
    """fla's naive chunked KDA needs T % 64 == 0."""
    fla_chunk = fla_naive("kda", "naive_chunk_kda")
    x = delta_inputs(T, gate="channel", with_state=True)
    o_ref, S_ref = fla_chunk(x.q, x.k, x.v, x.g, x.beta, None, x.state, output_final_state=True)
    o, S = kda(x.q, x.k, x.v, x.g, x.beta, initial_state=x.state, chunk_size=64)
    assert_close(o, o_ref, what="o")
    assert_close(S, S_ref, what="final state")
