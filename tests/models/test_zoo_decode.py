"""Decode equals prefill: prefill a prefix, decode the rest token by token, and every logit
and the final state match one prefill of the whole sequence (T = 65 crosses a chunk edge)."""

from __future__ import annotations

import pytest
import torch

from k3c.models import NAMES, build
from k3c.numerics import assert_close

TINY = [n for n in NAMES if n.endswith("-tiny")]
T, PREFIX, B = 65, 37, 2


@pytest.mark.parametrize("name", TINY)
def test_decode_equals_prefill(name, ids_for):
    model = build(name, seed=0)
    ids = ids_for(model, B, T, seed=1)
    with torch.no_grad():
        full_logits, full_state = model.prefill(ids)
        logits, state = model.prefill(ids[:, :PREFIX])
        steps = [logits]
        for t in range(PREFIX, T):
            logits, new_state = model.decode(ids[:, t : t + 1], state)
            assert new_state.keys() == state.keys(), f"{name}: decode changed the state names at t={t}"
            steps.append(logits)
            state = new_state
    assert_close(torch.cat(steps, dim=1), full_logits, what=f"{name} logits")
    assert state.keys() == full_state.keys()
    for key in full_state:
        assert_close(state[key], full_state[key], what=f"{name} state {key}")


@pytest.mark.parametrize("name", ["k3-tiny", "kimi-linear-tiny"])
def test_decode_from_a_one_token_prefill(name, ids_for):
    """T = 1 prefill (the recurrent path) then decode: the first logits are the prefill's."""
    model = build(name, seed=0)
    ids = ids_for(model, B, 6, seed=2)
    with torch.no_grad():
        full, _ = model.prefill(ids)
        logits, state = model.prefill(ids[:, :1])
        out = [logits]
        for t in range(1, 6):
            logits, state = model.decode(ids[:, t : t + 1], state)
            out.append(logits)
    assert_close(torch.cat(out, dim=1), full, what=f"{name} logits")


def test_decode_rejects_more_than_one_token(ids_for):
    model = build("k3-tiny")
    _, state = model.prefill(ids_for(model, 1, 3))
    with pytest.raises(ValueError, match=r"\[B, 1\]"):
        model.decode(ids_for(model, 1, 2), state)
