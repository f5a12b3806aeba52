"""Every runner checks positions, lengths and token ids against the caches' capacity and the
vocabulary before native code sees them, whichever entry is called, through `runner.run`
itself. TVM's in-place cache write checks nothing: a position of 100000 wrote past the cache
and returned, a position of -1 aborted the process ("double free or corruption")."""

from __future__ import annotations

import pytest
import torch
from security_testlib import CAPACITY, T, decode_inputs, extend_inputs

import k3c
from k3c.errors import InputError

BACKENDS = ["reference", "onnx", "tvm", "triton"]
VOCAB = k3c.models.build("gpt2-tiny").config.vocab_size


@pytest.fixture(params=BACKENDS)
def runner(request, built):
    out, graphs = built(request.param)
    return k3c.backends.get(request.param).load(out), graphs


@pytest.mark.parametrize("position, words", [(100000, "do not fit the caches' 32 rows"), (CAPACITY, "do not fit"),
                                             (-1, "position -1 is negative")])
def test_a_decode_position_outside_the_caches_is_refused(runner, position, words):
    run, graphs = runner
    with pytest.raises(InputError, match=words):
        run.run("decode", *decode_inputs(graphs, position))


def test_the_last_row_of_the_caches_is_written(runner):
    """The bound is the capacity itself: a sequence holding CAPACITY - 1 tokens takes one more."""
    run, graphs = runner
    logits = run.run("decode", *decode_inputs(graphs, CAPACITY - 1))[0]
    assert logits.shape == (1, 1, VOCAB) and bool(torch.isfinite(logits).all())


@pytest.mark.parametrize("token", [VOCAB, -1])
def test_a_token_outside_the_vocabulary_is_refused_in_decode(runner, token):
    run, graphs = runner
    with pytest.raises(InputError, match=f"id {token} is outside"):
        run.run("decode", *decode_inputs(graphs, 3, token=token))


@pytest.mark.parametrize("entry", ["prefill", "prefill_last"])
@pytest.mark.parametrize("lengths, ids, words", [
    ([0], [1] * T, "length 0 is outside"), ([T + 1], [1] * T, f"length {T + 1} is outside"),
    ([T], [1, 2, VOCAB + 5, 3], f"id {VOCAB + 5} is outside"), ([T], [1, -2, 2, 3], "id -2 is outside")])
def test_prefill_lengths_and_ids_are_checked(runner, entry, lengths, ids, words):
    run, _ = runner
    with pytest.raises(InputError, match=words):
        run.run(entry, torch.tensor([ids]), torch.tensor(lengths))


def test_extend_leaves_room_for_every_new_row(runner):
    """extend writes all T rows of a call: positions + T must fit; a row may add no token."""
    run, graphs = runner
    with pytest.raises(InputError, match=f"{T} more do not fit"):
        run.run("extend", *extend_inputs(graphs, CAPACITY - T + 1, T))
    with pytest.raises(InputError, match=f"length {T + 1} is outside \\[0, {T}\\]"):
        run.run("extend", *extend_inputs(graphs, 0, T + 1))
    assert run.run("extend", *extend_inputs(graphs, CAPACITY - T, 0))[0].shape[:2] == (1, T)
