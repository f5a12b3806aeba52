"""The tiny zoo compiled for TVM `llvm` against the eager models: prefill at awkward lengths,
16 decode steps carrying the state, and the exported library reloaded without the IR."""

from __future__ import annotations

import copy

import pytest
import torch
from factories import BATCH, DECODE_STEPS, PREFILL_T, TINY, example_ids
from factories import TVM_DECODE_PROMPT as DECODE_PROMPT

from k3c.backends.tvm import TvmRunner
from k3c.compiler import CompiledModel
from k3c.numerics import assert_close, compare, model_tolerance


def compiled(tvm_zoo, name: str) -> tuple:
    model, graphs, out, runner = tvm_zoo(name)
    return model, CompiledModel(runner, graphs, out, "tvm")


def assert_state_close(got: dict, want: dict, what: str) -> None:
    assert set(got) == set(want), f"{what}: state names differ: {sorted(set(got) ^ set(want))}"
    for key in want:
        assert_close(got[key], want[key], what=f"{what} state {key}")


@pytest.mark.parametrize("T", PREFILL_T, ids=lambda T: f"T{T}")
@pytest.mark.parametrize("name", TINY)
@torch.no_grad()
def test_prefill_matches_eager(tvm_zoo, name, T):
    model, cm = compiled(tvm_zoo, name)
    ids = example_ids(model, BATCH, T, seed=T)
    logits, state = cm.prefill(ids)
    want_logits, want_state = model.prefill(ids)
    assert_close(logits, want_logits, what=f"{name} prefill logits")
    assert_state_close(state, want_state, f"{name} prefill")


@pytest.mark.parametrize("name", TINY)
@torch.no_grad()
def test_decode_matches_eager(tvm_zoo, name):
    """Each step's logits at the model's own tolerance (k3c.numerics.model_tolerance: eager
    fp32 against the float64 model, at least the fp32 row): after a 9-layer model's prefill
    and a dozen steps, eager itself is up to 6e-6 from float64, so two fp32 computations of
    it may differ by more than one op's row while both are as close to float64."""
    model, cm = compiled(tvm_zoo, name)
    exact_model = copy.deepcopy(model).double()
    ids = example_ids(model, BATCH, DECODE_PROMPT + DECODE_STEPS, seed=1)
    _, state = cm.prefill(ids[:, :DECODE_PROMPT])
    _, want_state = model.prefill(ids[:, :DECODE_PROMPT])
    _, exact_state = exact_model.prefill(ids[:, :DECODE_PROMPT])
    for step in range(DECODE_PROMPT, DECODE_PROMPT + DECODE_STEPS):
        logits, state = cm.decode(ids[:, step:step + 1], state)
        want_logits, want_state = model.decode(ids[:, step:step + 1], want_state)
        exact_logits, exact_state = exact_model.decode(ids[:, step:step + 1], exact_state)
        tol = model_tolerance(want_logits, exact_logits.float())
        c = compare(logits, want_logits, tolerance=tol)
        assert c.ok, f"{name} decode logits at step {step}: {c} (tolerance {tol})"
    assert_state_close(state, want_state, f"{name} after {DECODE_STEPS} decode steps")


@pytest.mark.parametrize("name", ["linear-attn-tiny", "k3-tiny"])
@torch.no_grad()
def test_exported_library_reloads(tvm_zoo, name):
    """A fresh runner from the directory alone (lib.so, weights, manifest) gives the same bits."""
    model, graphs, out, runner = tvm_zoo(name)
    ids = example_ids(model, BATCH, 33, seed=3)
    first = runner.run("prefill", ids)
    again = TvmRunner(out)
    assert again.entries["prefill"].output_names == [k for k, _ in graphs["prefill"].outputs]
    for a, b in zip(again.run("prefill", ids), first):
        assert torch.equal(a, b)
    state = first[1:]
    for a, b in zip(again.run("decode", ids[:, :1], *state), runner.run("decode", ids[:, :1], *state)):
        assert torch.equal(a, b)
