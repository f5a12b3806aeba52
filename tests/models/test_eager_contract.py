"""The eager models' prefill and decode check what they are given before any layer runs:
a decode state that lacks a recurrent entry used to start that layer from zeros (logits off by
0.8 to 6.0, and a state that looked complete); now each misfit is an InputError naming the
key, the id or the bound."""

from __future__ import annotations

import pytest
import torch

import k3c
from k3c.errors import InputError

LINEAR_ATTENTION = ["linear-attn-tiny", "deltanet-tiny", "gated-deltanet-tiny", "kimi-linear-tiny", "k3-tiny"]


@pytest.fixture(scope="module")
def prefilled():
    cache = {}

    def get(name: str):
        if name not in cache:
            model = k3c.models.build(name)
            ids = torch.randint(0, model.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(0))
            cache[name] = (model, ids, model.prefill(ids)[1])
        return cache[name]

    return get


@pytest.mark.parametrize("name", LINEAR_ATTENTION)
def test_decode_names_every_missing_recurrent_entry(prefilled, name):
    model, ids, state = prefilled(name)
    kinds = {k.rsplit(".", 1)[-1] for k in state if k.rsplit(".", 1)[-1] in ("S", "z", "conv_q", "conv_k", "conv_v")}
    assert kinds  # every linear-attention model carries recurrent entries
    for kind in sorted(kinds):
        key = next(k for k in state if k.endswith("." + kind))
        partial = {k: v for k, v in state.items() if k != key}
        with pytest.raises(InputError, match=f"lacks '{key}'"):
            model.decode(ids[:, :1], partial)


def test_decode_refuses_another_models_state(prefilled):
    model, ids, _ = prefilled("k3-tiny")
    _, _, other = prefilled("gated-deltanet-tiny")
    with pytest.raises(InputError, match="another model"):
        model.decode(ids[:, :1], {**prefilled("k3-tiny")[2], **{"layers.3.z": other["layers.0.S"]}})
    with pytest.raises(InputError):  # a state made by another model lacks this one's entries
        model.decode(ids[:, :1], other)


def test_decode_names_a_state_of_another_batch_size(prefilled):
    model, ids, state = prefilled("deltanet-tiny")
    halved = {k: v[:1] for k, v in state.items()}
    with pytest.raises(InputError, match="batch size of input_ids"):
        model.decode(ids[:, :1], halved)


@pytest.mark.parametrize("bad", [-1, 1024, 10**6], ids=["negative", "vocab", "huge"])
def test_token_ids_outside_the_vocabulary_are_named(prefilled, bad):
    model, ids, state = prefilled("k3-tiny")
    ids = ids.clone()
    ids[1, 2] = bad
    with pytest.raises(InputError, match=rf"token id {bad} at \[1, 2\]"):
        model.prefill(ids)
    with pytest.raises(InputError, match=f"token id {bad}"):
        model.decode(ids[:, 2:3], state)


def test_float_ids_and_wrong_ranks_are_input_errors(prefilled):
    model, ids, _ = prefilled("linear-attn-tiny")
    with pytest.raises(InputError, match="integer token ids"):
        model.prefill(ids.float())
    with pytest.raises(InputError, match=r"\[B, T\]"):
        model.prefill(ids[0])


def test_gpt2_refuses_positions_past_its_table():
    model = k3c.models.build("gpt2-tiny")  # n_positions = 512
    with pytest.raises(InputError, match="n_positions = 512"):
        model.prefill(torch.zeros(1, 513, dtype=torch.long))
    D = model.config.n_embd // model.config.n_head
    full = {f"layers.{i}.{kv}": torch.zeros(1, 512, model.config.n_head, D)
            for i in range(model.config.n_layer) for kv in "kv"}
    with pytest.raises(InputError, match="512 cached"):
        model.decode(torch.zeros(1, 1, dtype=torch.long), full)
    one_short = {k: v[:, :511] for k, v in full.items()}
    logits, state = model.decode(torch.zeros(1, 1, dtype=torch.long), one_short)
    assert state["layers.0.k"].shape[1] == 512 and torch.isfinite(logits).all()


@pytest.mark.parametrize("name", ["kimi-linear-tiny", "k3-tiny"])
def test_prefill_and_decode_hand_back_states_of_one_layout(prefilled, name):
    """A prefill's state has the strides a decode step's has (contiguous): a state that was a view
    (MLA's krope, split from the projection's rows) made torch.compile recompile decode on the
    stride guard between its first and second step."""
    model, ids, state = prefilled(name)
    _, stepped = model.decode(ids[:, :1], state)
    for k, v in state.items():
        assert v.is_contiguous(), f"{name}: prefill state {k!r} is a view of strides {v.stride()}"
        assert stepped[k].is_contiguous(), f"{name}: decode state {k!r} has strides {stepped[k].stride()}"
