"""Fixed-capacity caches over 300 decode steps: the artifact's decode with its caches at full
capacity (rows written in place at `positions`) equals the growing-cache artifact and eager.

The eager reference is independent of both decode paths: one eager prefill of the whole
token sequence (teacher forcing), whose logit at position p is what decode step p must give.
Its tolerance is the model's own (k3c.numerics.model_tolerance: eager fp32 against fp64).
"""

from __future__ import annotations

import copy

import pytest
import torch
from serving_testlib import CAPACITY, build

from k3c.numerics import compare, model_tolerance

MODELS = ["kimi-linear-tiny", "k3-tiny"]
PROMPT, BATCH = 5, 2
STEPS = CAPACITY - PROMPT  # 300: the steps fill the cache


@pytest.fixture(scope="module")
def case(zoo, fixed_graphs):
    """name -> (model, tokens, eager logits at positions PROMPT.., tolerance, fixed graphs, grow graphs);
    the growing graphs are the session's (tests/conftest.py), captured once for every test."""
    cache = {}

    def get(name):
        if name not in cache:
            model, grow_prefill, grow_decode = zoo(name)
            model.eval()
            gen = torch.Generator().manual_seed(1)
            tokens = torch.randint(0, model.config.vocab_size, (BATCH, CAPACITY), generator=gen)
            with torch.no_grad():
                eager = model.prefill(tokens)[0][:, PROMPT:]
                exact = copy.deepcopy(model).double().prefill(tokens)[0][:, PROMPT:]
            fixed = fixed_graphs(model)
            grow = {"prefill": grow_prefill, "decode": grow_decode}
            cache[name] = (model, tokens, eager, model_tolerance(eager, exact), fixed, grow)
        return cache[name]

    return get


def decode_all(compiled, tokens, state=None) -> tuple[torch.Tensor, dict]:
    """Logits of decode steps PROMPT .. CAPACITY - 1, teacher-forced, and the last state
    (from the artifact's own prefill unless a prefilled `state` is given)."""
    with torch.no_grad():
        if state is None:
            _, state = compiled.prefill(tokens[:, :PROMPT])
        out = []
        for p in range(PROMPT, CAPACITY):
            logits, state = compiled.decode(tokens[:, p:p + 1], state)
            out.append(logits)
    return torch.cat(out, dim=1), state


# onnx runs in CI; TVM's builds of both serving forms take minutes here: the slow tier
@pytest.mark.parametrize("backend", ["onnx", pytest.param("tvm", marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", MODELS)
def test_fixed_equals_grow_and_eager_300_steps(case, name, backend, tmp_path):
    model, tokens, eager, tol, fixed_graphs, grow_graphs = case(name)
    fixed = build(backend, fixed_graphs, tmp_path / "fixed")
    grow = build(backend, {"decode": grow_graphs["decode"]}, tmp_path / "grow")  # decode from eager's prefill
    got_fixed, state = decode_all(fixed, tokens)
    with torch.no_grad():
        got_grow, grown = decode_all(grow, tokens, model.prefill(tokens[:, :PROMPT])[1])
    for what, (got, want) in {"fixed vs eager": (got_fixed, eager), "grow vs eager": (got_grow, eager),
                              "fixed vs grow": (got_fixed, got_grow)}.items():
        c = compare(got, want, tolerance=tol)
        print(f"{name} {backend} {what}, {STEPS} steps: {c} (tolerance {tol})")
        assert c.ok, f"{name} {backend} {what}-cache decode over {STEPS} steps: {c}"
    # the caches kept their capacity and were written at each sequence's position
    assert state["positions"].tolist() == [CAPACITY] * BATCH
    caches = [k for k in grown if grown[k].shape[1] == CAPACITY]
    assert caches, "the growing state has caches"
    for k in grown:
        assert state[k].shape == grown[k].shape, k  # full capacity: the same rows
        c = compare(state[k], grown[k], tolerance=tol)
        assert c.ok, f"{name} {backend}: state {k!r} fixed vs grow: {c}"


@pytest.mark.slow
def test_triton_fixed_cache_few_steps(case, tmp_path):
    """The Triton module (under the interpreter without a GPU: slow, so three steps) runs the
    fixed-cache decode through the ops' decompositions."""
    model, tokens, eager, tol, fixed_graphs, _ = case("k3-tiny")
    fixed = build("triton", fixed_graphs, tmp_path / "triton")
    with torch.no_grad():
        _, state = fixed.prefill(tokens[:, :PROMPT])
        got = []
        for p in range(PROMPT, PROMPT + 3):
            logits, state = fixed.decode(tokens[:, p:p + 1], state)
            got.append(logits)
    c = compare(torch.cat(got, dim=1).cpu(), eager[:, :3], tolerance=tol)
    assert c.ok, f"k3-tiny triton fixed-cache decode vs eager, 3 steps: {c}"
    assert state["positions"].tolist() == [PROMPT + 3] * BATCH
