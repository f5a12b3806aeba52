"""A NaN or an Inf in one sequence of a batch never reaches another sequence's outputs or state,
on every CPU backend, in prefill, extend and decode (fixed-capacity caches, ragged prompts).

Two ways in. Through the input: the model's embedding row of one token id is NaN, of another
+inf (ids the clean sequences never hold), and only the middle sequence of three holds one of
them, in its prompt or in its extend. Through the state: after a clean prefill, the middle
sequence's recurrent states are NaN, its conv tails +inf and its attention caches NaN (every
row, the ones it has not written included).

The reference is the same artifact on the clean batch (the middle sequence with ordinary ids
and its own state): the other sequences' logits and state entries must be finite and at the
float32 row of k3c/numerics.py from their clean values. What can leak is what mixes rows: a
batch-wide reduction, a routing step that groups every sequence's tokens, a masked GEMM or
select that weights a NaN by 0.
"""

from __future__ import annotations

import copy

import pytest
import torch

import k3c
from k3c.backends import artifact
from k3c.compiler import CompiledModel, prepare, rebind_weights
from k3c.diff import backend_for
from k3c.numerics import compare

LENGTHS, PROMPT, MORE = [12, 12, 9], 12, 5
POISONED, CLEAN = 1, (0, 2)
# onnxruntime's own kernels run in the default tier; the reference interpreter, the portable
# ONNX flavour, TVM and Triton (under the interpreter; both decode with the fused KDA step,
# kda_decode_step) take minutes on two cores: the slow tier (pytest -m slow)
BACKENDS = ["onnx:ort", *(pytest.param(b, marks=pytest.mark.slow) for b in ("reference", "onnx", "tvm", "triton"))]
MODELS = ["k3-tiny", "kimi-linear-tiny"]


def build(spec: str, graphs: dict, out) -> CompiledModel:
    be = backend_for(spec)
    graphs = prepare(graphs, be)
    artifact.write(be, graphs, out, force=True)
    return CompiledModel(be.load(out), graphs, out, spec)


@pytest.fixture(scope="module")
def poisoned_models(fixed_graphs):
    """name -> (model whose embedding of ids V-1 / V-2 is NaN / +inf, its fixed-cache graphs)."""
    cache = {}

    def get(name):
        if name not in cache:
            clean = k3c.models.build(name).eval()
            graphs = fixed_graphs(clean)  # captured once a session (other tests share its weights)
            model = copy.deepcopy(clean)  # so the poison goes into weights of its own
            emb = model.model.embed_tokens.weight
            with torch.no_grad():
                emb[-1] = float("nan")
                emb[-2] = float("inf")
            cache[name] = (model, rebind_weights(graphs, model))
        return cache[name]

    return get


@pytest.fixture(scope="module")
def artifacts(poisoned_models, tmp_path_factory):
    cache = {}

    def get(name, spec):
        if (name, spec) not in cache:
            model, graphs = poisoned_models(name)
            out = tmp_path_factory.mktemp(f"{name}-{spec.replace(':', '-')}")
            cache[name, spec] = (model.config.vocab_size, build(spec, graphs, out))
        return cache[name, spec]

    return get


def _tokens(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab - 2, (3, PROMPT + MORE + 2), generator=torch.Generator().manual_seed(11))


def _clone(state: dict) -> dict:
    return {k: v.clone() for k, v in state.items()}  # fixed caches are written in place


def _chain(compiled, tokens, state=None):
    """Prefill (unless `state` is given), an extend of MORE tokens, two decode steps: each
    call's (logits, state)."""
    calls = []
    if state is None:
        calls.append(compiled.prefill(tokens[:, :PROMPT], lengths=torch.tensor(LENGTHS)))
        state = calls[-1][1]
    calls.append(compiled.extend(tokens[:, PROMPT:PROMPT + MORE], _clone(state)))
    for i in range(2):
        at = PROMPT + MORE + i
        calls.append(compiled.decode(tokens[:, at:at + 1], _clone(calls[-1][1])))
    return calls


def _leaks(got, want) -> list[str]:
    """What differs in the clean sequences between two chains of calls."""
    bad = []
    for i, ((lg, st), (wl, ws)) in enumerate(zip(got, want)):
        for what, a, b in [("logits", lg, wl), *((k, st[k], v) for k, v in ws.items())]:
            a, b = a[list(CLEAN)], b[list(CLEAN)]
            if not a.is_floating_point():
                ok = torch.equal(a, b)
            else:
                ok = compare(a, b, dtype=torch.float32).ok  # finite, and at the float32 row
            if not ok:
                bad.append(f"call {i} {what}")
    return bad


def _poison_state(state: dict) -> dict:
    out = _clone(state)
    for k, v in out.items():
        if not v.is_floating_point():
            continue
        last = k.rsplit(".", 1)[-1]
        v[POISONED] = float("inf") if last.startswith("conv_") else float("nan")
    return out


@pytest.mark.parametrize("spec", BACKENDS)
@pytest.mark.parametrize("name", MODELS)
def test_a_poisoned_sequence_leaves_the_others_alone(artifacts, name, spec):
    V, compiled = artifacts(name, spec)
    tokens = _tokens(V)
    with torch.no_grad():
        clean = _chain(compiled, tokens)
        assert all(torch.isfinite(lg).all() for lg, _ in clean)
        leaks = {}
        nan_prompt = tokens.clone()
        nan_prompt[POISONED, 3] = V - 1  # NaN from the prefill on
        got = _chain(compiled, nan_prompt)
        assert not torch.isfinite(got[0][0][POISONED]).all()  # the poison did get in
        leaks["NaN embedding in the prompt"] = _leaks(got, clean)
        inf_extend = tokens.clone()
        inf_extend[POISONED, PROMPT + 2] = V - 2  # +inf from the extend on
        got = _chain(compiled, inf_extend, clean[0][1])
        assert not torch.isfinite(got[0][0][POISONED]).all()
        leaks["inf embedding in the extend"] = _leaks(got, clean[1:])
        got = _chain(compiled, tokens, _poison_state(clean[0][1]))
        assert not torch.isfinite(got[-1][0][POISONED]).all()  # the poison did get in
        leaks["NaN / inf state"] = _leaks(got, clean[1:])
    leaks = {k: v for k, v in leaks.items() if v}
    assert not leaks, f"{name} {spec}: {leaks}"


def test_the_check_sees_a_leak():
    """A batch-wide reduction is caught: one sequence's NaN in a mean over the batch."""
    clean = [(torch.randn(3, 2, 4), {"layers.0.S": torch.randn(3, 4)})]
    leaky = copy.deepcopy(clean)
    leaky[0][0][POISONED] = float("nan")
    leaky[0][0][:] = leaky[0][0] - leaky[0][0].mean(dim=0, keepdim=True) + clean[0][0].mean(dim=0, keepdim=True)
    assert _leaks(leaky, clean) == ["call 0 logits"]
