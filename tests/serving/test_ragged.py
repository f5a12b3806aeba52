"""Ragged batches: right-padded prompts of different lengths, and decode steps of sequences
at different positions, equal each sequence run alone (logits and state) in eager and in the
reference and ONNX artifacts. Padding must not reach a sequence's state: the delta rules'
states, the short convs' tails and the caches' rows."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serving_testlib import CAPACITY, build

import k3c
from k3c.errors import InputError
from k3c.numerics import compare, model_tolerance
from k3c.serving import with_last_entry


def ragged(model, lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids [B, max(lengths)] (padding is random ids: it must not matter) and lengths."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (len(lengths), max(lengths)), generator=gen)
    return ids, torch.tensor(lengths)


def alone(model, ids, lengths, nxt):
    """Each sequence prefilled alone (its real tokens only) and decoded one step: last logits,
    state, next logits, stacked over the batch."""
    rows = []
    with torch.no_grad():
        for b, n in enumerate(lengths.tolist()):
            logits, state = model.prefill(ids[b:b + 1, :n], logits="last", max_context=CAPACITY)
            step, _ = model.decode(nxt[b:b + 1], state)
            rows.append((logits, state, step))
    state = {k: torch.cat([r[1][k] for r in rows]) for k in rows[0][1]}
    return torch.cat([r[0] for r in rows]), state, torch.cat([r[2] for r in rows])


def check_batch(run, model, ids, lengths, tol, what):
    nxt = torch.randint(0, model.config.vocab_size, (ids.shape[0], 1), generator=torch.Generator().manual_seed(3))
    want_logits, want_state, want_step = alone(model, ids, lengths, nxt)
    with torch.no_grad():
        logits, state = run.prefill(ids, lengths=lengths, logits="last")
        step, after = run.decode(nxt, state)
    assert logits.shape == (ids.shape[0], 1, model.config.vocab_size)
    assert state["positions"].tolist() == lengths.tolist()
    assert after["positions"].tolist() == (lengths + 1).tolist()
    for k, (got, want) in {"logits": (logits, want_logits), "decode": (step, want_step),
                           **{f"state {k}": (state[k], want_state[k]) for k in want_state}}.items():
        c = compare(got.float(), want.float(), tolerance=tol)
        assert c.ok, f"{what}, lengths {lengths.tolist()}: {k} of the ragged batch vs each sequence alone: {c}"


class Eager:
    """The eager model with fixed caches of CAPACITY rows, called as an artifact is."""

    def __init__(self, model):
        self.model = model

    def prefill(self, ids, lengths, logits):
        return self.model.prefill(ids, lengths=lengths, logits=logits, max_context=CAPACITY)

    def decode(self, ids, state):
        return self.model.decode(ids, state)


def tolerance_of(model, ids, lengths):
    """The model's own noise on this batch: eager fp32 against fp64 (numerics.model_tolerance)."""
    with torch.no_grad():
        a = model.prefill(ids, lengths=lengths, max_context=CAPACITY)[0]
        b = copy.deepcopy(model).double().prefill(ids, lengths=lengths, max_context=CAPACITY)[0]
    return model_tolerance(a, b)


@pytest.mark.parametrize("name", ["kimi-linear-tiny", "gpt2-tiny", *[pytest.param(n, marks=pytest.mark.slow) for n in (
    "gated-deltanet-tiny", "deltanet-tiny", "linear-attn-tiny")]])
def test_eager_ragged_batch_equals_each_alone(name):
    model = k3c.models.build(name).eval()
    ids, lengths = ragged(model, [9, 4, 1, 6])
    check_batch(Eager(model), model, ids, lengths, tolerance_of(model, ids, lengths), f"{name} eager")


def test_ragged_prefill_needs_fixed_caches():
    model = k3c.models.build("gpt2-tiny").eval()
    ids, lengths = ragged(model, [5, 3])
    with pytest.raises(InputError, match="max_context"):
        model.prefill(ids, lengths=lengths)
    with pytest.raises(InputError, match=r"lengths\[1\] = 7"):
        model.prefill(ids, lengths=torch.tensor([5, 7]), max_context=8)


@pytest.fixture(scope="module")
def k3_artifacts(tmp_path_factory, fixed_graphs):
    """k3-tiny captured once with fixed caches, built for the reference and ONNX backends."""
    model = k3c.models.build("k3-tiny").eval()
    graphs = with_last_entry(fixed_graphs(model))
    out = tmp_path_factory.mktemp("ragged")
    ids, lengths = ragged(model, [130, 1, 77, 64])
    return model, tolerance_of(model, ids, lengths), {b: build(b, graphs, out / b) for b in ("reference", "onnx")}


@pytest.mark.parametrize("backend", ["reference", pytest.param("onnx", marks=pytest.mark.slow)])
@settings(max_examples=3, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.integers(1, 130), min_size=1, max_size=4))
def test_artifact_ragged_batch_equals_each_alone(k3_artifacts, backend, lengths):
    model, tol, runs = k3_artifacts
    ids, lengths = ragged(model, lengths, seed=len(lengths))
    check_batch(runs[backend], model, ids, lengths, tol, f"k3-tiny {backend}")
