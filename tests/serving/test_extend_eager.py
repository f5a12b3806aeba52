"""Eager `extend` and `prefill(chunk=N)`: continuing a state equals one uninterrupted prefill,
logits and state, with growing and fixed caches, ragged, for every layer kind (KDA, MLA,
GPT-2 attention, the delta rules); bad arguments are one InputError each."""

from __future__ import annotations

import pytest
import torch

import k3c
from k3c.errors import InputError
from k3c.numerics import assert_close

MODELS = ["k3-tiny", "kimi-linear-tiny", "gpt2-tiny", "gated-deltanet-tiny"]
T, B = 24, 3


@pytest.fixture(scope="module")
def models():
    return {name: k3c.models.build(name) for name in MODELS}


def _ids(model, b=B, t=T, seed=0):
    return torch.randint(0, model.config.vocab_size, (b, t), generator=torch.Generator().manual_seed(seed))


def _same_state(got: dict, want: dict, what: str):
    assert set(got) == set(want), what
    for k in want:
        if want[k].dtype == torch.long:
            assert torch.equal(got[k], want[k]), f"{what}: {k}"
        else:
            assert_close(got[k], want[k], what=f"{what}: state {k}")


@pytest.mark.parametrize("max_context", [None, 40], ids=["grow", "fixed"])
@pytest.mark.parametrize("name", MODELS)
def test_extend_in_pieces_equals_one_prefill(models, name, max_context):
    m = models[name]
    ids = _ids(m)
    with torch.no_grad():
        want, want_state = m.prefill(ids, max_context=max_context)
        got, state = m.prefill(ids[:, :5], max_context=max_context)
        pieces = [got]
        for a, b in [(5, 6), (6, 13), (13, T)]:  # pieces of 1, 7 and 11 tokens
            out, state = m.extend(ids[:, a:b], state)
            pieces.append(out)
    assert_close(torch.cat(pieces, 1), want, what=f"{name}: extended logits")
    _same_state(state, want_state, f"{name} extend")


@pytest.mark.parametrize("chunk", [1, 7, 16, 25])
@pytest.mark.parametrize("name", ["k3-tiny", "gpt2-tiny"])
def test_chunked_prefill_equals_one_prefill(models, name, chunk):
    m = models[name]
    ids = _ids(m)
    with torch.no_grad():
        want, want_state = m.prefill(ids, max_context=32)
        got, state = m.prefill(ids, max_context=32, chunk=chunk)
    assert_close(got, want, what=f"{name}: chunk={chunk} logits")
    _same_state(state, want_state, f"{name} chunk={chunk}")


@pytest.mark.parametrize("name", ["k3-tiny", "kimi-linear-tiny"])
def test_ragged_chunked_prefill_last_logits(models, name):
    """Prompts of 24, 11 and 3 tokens in pieces of 7: the short ones sit later pieces out."""
    m = models[name]
    ids, lengths = _ids(m), torch.tensor([24, 11, 3])
    with torch.no_grad():
        want, want_state = m.prefill(ids, lengths=lengths, logits="last", max_context=32)
        got, state = m.prefill(ids, lengths=lengths, logits="last", max_context=32, chunk=7)
    assert_close(got, want, what=f"{name}: ragged chunked last logits")
    assert torch.equal(state["positions"], lengths)
    recurrent = {k: v for k, v in want_state.items() if k.rsplit(".", 1)[-1] in ("S", "conv_q", "conv_k", "conv_v")}
    _same_state({k: state[k] for k in recurrent}, recurrent, f"{name} ragged")


def test_extend_sequences_at_different_positions(models):
    """A fixed-cache batch whose sequences hold 9 and 4 tokens, each extended by its own
    tokens, equals each sequence's own uninterrupted prefill."""
    m = models["k3-tiny"]
    ids = _ids(m, b=2)
    with torch.no_grad():
        _, state = m.prefill(ids[:, :9], lengths=torch.tensor([9, 4]), max_context=40)
        rest = torch.stack([ids[0, 9:17], ids[1, 4:12]])
        out, state = m.extend(rest, state, lengths=torch.tensor([8, 5]))
        for b, (n, k) in enumerate([(17, 8), (9, 5)]):
            seq = torch.cat([ids[b, :9], ids[b, 9:17]]) if b == 0 else torch.cat([ids[1, :4], ids[1, 4:9]])
            want, _ = m.prefill(seq[None], max_context=40)
            assert_close(out[b, :k], want[0, n - k:n], what=f"sequence {b} extended at its own position")
    assert state["positions"].tolist() == [17, 9]


@pytest.mark.parametrize("case", ["no tokens", "lengths on growing caches", "past capacity", "bad lengths",
                                  "bad chunk"])
def test_extend_refuses_bad_arguments(models, case):
    m = models["k3-tiny"]
    ids = _ids(m, b=2, t=6)
    with torch.no_grad():
        _, grow = m.prefill(ids)
        _, fixed = m.prefill(ids, max_context=8)
    with pytest.raises(InputError):
        if case == "no tokens":
            m.extend(ids[:, :0], grow)
        elif case == "lengths on growing caches":
            m.extend(ids, grow, lengths=torch.tensor([6, 2]))
        elif case == "past capacity":
            m.extend(ids, fixed)
        elif case == "bad lengths":
            m.extend(ids[:, :2], fixed, lengths=torch.tensor([3, 1]))
        else:
            m.prefill(ids, chunk=0)
