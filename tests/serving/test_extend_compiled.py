"""Every backend's `extend`: a prefill continued in pieces of 1, 7, 64 and 65 tokens, and a
chunked prefill, equal one eager prefill of the whole sequence (logits and state), with
growing and fixed caches; ragged pieces continue each sequence at its own position.

The reference is independent of the artifact's extend entry: the eager model's one prefill
of all tokens. Tolerances: the model's own (k3c.numerics.model_tolerance, eager fp32 against
fp64), as the fixed-cache tests use.
"""

from __future__ import annotations

import copy

import pytest
import torch
from serving_testlib import CAPACITY, build

import k3c
from k3c.numerics import assert_close, compare, model_tolerance


def assert_close_tol(got: torch.Tensor, want: torch.Tensor, tol, what: str) -> None:
    c = compare(got, want, tolerance=tol)
    assert c.ok, f"{what}: max_abs_err={c.max_abs_err:.3e} rel_rms_err={c.rel_rms_err:.3e} finite={c.finite}"

PIECES = {"reference": [1, 7, 64, 65], "onnx": [1, 7, 64, 65], "tvm": [1, 7, 64, 65], "triton": [1, 7]}
PROMPT, BATCH = 13, 2


@pytest.fixture(scope="module")
def eager():
    """name -> (model, tokens, eager logits, eager state (fixed caches), tolerance)."""
    cache = {}

    def get(name):
        if name not in cache:
            model = k3c.models.build(name).eval()
            tokens = torch.randint(0, model.config.vocab_size, (BATCH, PROMPT + sum(PIECES["onnx"])),
                                   generator=torch.Generator().manual_seed(3))
            with torch.no_grad():
                logits, state = model.prefill(tokens, max_context=CAPACITY)
                exact = copy.deepcopy(model).double().prefill(tokens)[0]
            cache[name] = (model, tokens, logits, state, model_tolerance(logits, exact))
        return cache[name]

    return get


def _extended(compiled, tokens, pieces):
    with torch.no_grad():
        out, state = compiled.prefill(tokens[:, :PROMPT])
        outs, at = [out], PROMPT
        for n in pieces:
            out, state = compiled.extend(tokens[:, at:at + n], state)
            outs.append(out)
            at += n
    return torch.cat(outs, dim=1), state, at


# Growing caches on TVM and Triton are the slow tier (a second build of each, minutes on two
# cores); their fixed-cache extend, the serving form, stays in the default run.
CASES = [("grow", "reference"), ("grow", "onnx"), pytest.param("grow", "tvm", marks=pytest.mark.slow),
         pytest.param("grow", "triton", marks=pytest.mark.slow), ("fixed", "reference"), ("fixed", "onnx"),
         ("fixed", "tvm"), ("fixed", "triton")]


@pytest.mark.parametrize("cache,backend", CASES)
def test_extend_in_pieces_equals_one_prefill(eager, fixed_graphs, backend, cache, tmp_path):
    model, tokens, want, want_state, tol = eager("k3-tiny")
    if cache == "fixed":
        graphs = fixed_graphs(model)
    else:
        graphs = k3c.capture_entries(model, (tokens[:, :16],))
    compiled = build(backend, graphs, tmp_path)
    got, state, at = _extended(compiled, tokens, PIECES[backend])
    assert_close_tol(got, want[:, :at], tol, f"{backend} {cache}: prefill + extend {PIECES[backend]}")
    if at == tokens.shape[1]:  # every token in: the state is the whole prefill's
        for k, v in want_state.items():  # the eager state has fixed caches: a growing one's differ in shape
            if cache == "grow" and (k == "positions" or k.rsplit(".", 1)[-1] in ("ckv", "krope")):
                continue
            if k == "positions":
                assert torch.equal(state[k], v)
            else:
                assert_close(state[k], v, what=f"{backend} {cache}: state {k}")
    if backend in ("reference", "onnx"):
        with torch.no_grad():
            chunked, _ = compiled.prefill(tokens[:, :PROMPT + 72], chunk=24)
        assert_close_tol(chunked, want[:, :PROMPT + 72], tol, f"{backend} {cache}: prefill(chunk=24)")


@pytest.mark.parametrize("name", ["kimi-linear-tiny", "gpt2-tiny"])
def test_extend_other_layer_kinds(eager, fixed_graphs, name, tmp_path):
    model, tokens, want, _, tol = eager(name)
    compiled = build("onnx", fixed_graphs(model), tmp_path)
    got, _, at = _extended(compiled, tokens, PIECES["onnx"])
    assert_close_tol(got, want[:, :at], tol, f"{name} onnx: prefill + extend")


@pytest.mark.parametrize("backend", ["reference", "onnx"])
def test_ragged_extend_each_sequence_at_its_own_position(eager, fixed_graphs, backend, tmp_path):
    """Sequences holding 9 and 4 tokens, extended by 8 and 5 real tokens of an 8-token call,
    equal each sequence's own prefill; last-token logits pick each row's own last token."""
    model, tokens, _, _, tol = eager("k3-tiny")
    compiled = build(backend, fixed_graphs(model), tmp_path)
    rest, lengths = torch.stack([tokens[0, 9:17], tokens[1, 4:12]]), torch.tensor([8, 5])
    with torch.no_grad():
        _, state = compiled.prefill(tokens[:, :9], lengths=torch.tensor([9, 4]))
        out, state = compiled.extend(rest, state, lengths=lengths)
        _, again = compiled.prefill(tokens[:, :9], lengths=torch.tensor([9, 4]))  # caches are written in place
        last, _ = compiled.extend(rest, again, lengths=lengths, logits="last")
        for b, (n, k) in enumerate([(17, 8), (9, 5)]):  # sequence b now holds tokens[b, :n]
            want, _ = model.prefill(tokens[b:b + 1, :n])
            assert_close_tol(out[b:b + 1, :k], want[:, n - k:n], tol, f"{backend}: sequence {b} extended")
            assert_close_tol(last[b:b + 1], want[:, n - 1:n], tol, f"{backend}: sequence {b} last logits")
    assert state["positions"].tolist() == [17, 9]
