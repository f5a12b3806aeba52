"""Snapshots of the state taken during a chunked prefill (k3c/snapshots.py): a run resumed from
any snapshot equals the uninterrupted run from that position on, logits and state, on every
backend; a snapshot equals one prefill of its prefix; continuing a snapshot leaves it intact.

The uninterrupted run is prefilled in pieces of 1, 7, 64 and 65 tokens (snapshots at 1, 8 and
72); each resumed run continues its snapshot with everything after it in one extend, so the
two run other chunkings. Rows are ragged (137 and 100 real tokens). Both sides are the same
artifact's fp32 arithmetic: the fp32 row of k3c/numerics.py.
"""

from __future__ import annotations

import re

import pytest
import torch

import k3c
from k3c.errors import InputError
from k3c.generate import EagerRunner
from k3c.numerics import assert_close
from k3c.snapshots import copy_state, prefill_snapshots, resume

PIECES = [1, 7, 64, 65]
AT = [1, 8, 72]  # the ends of the first three pieces
T, LENGTHS = sum(PIECES), torch.tensor([137, 100])


def _ids(model, seed=5, t=T):
    return torch.randint(0, model.config.vocab_size, (2, t), generator=torch.Generator().manual_seed(seed))


def _valid_close(got, want, lengths, start, what):
    """Logits [B, *, V] of rows from position `start` on, only where a row has real tokens."""
    for b, n in enumerate(lengths.tolist()):
        if n > start:
            assert_close(got[b, :n - start], want[b, :n - start], what=f"{what}, row {b}")


def _same_state(got, want, what):
    assert set(got) == set(want), what
    for k in want:
        if want[k].dtype == torch.long:
            assert torch.equal(got[k], want[k]), f"{what}: {k} {got[k].tolist()} != {want[k].tolist()}"
        else:
            assert_close(got[k], want[k], what=f"{what}: state {k}")


def check_resumes(run, model, at=AT, lengths=LENGTHS, **prefill_options):
    ids = _ids(model, t=int(lengths.max()))
    logits, state, snaps = prefill_snapshots(run, ids, at=at, lengths=lengths, **prefill_options)
    assert sorted(snaps) == at
    for p in at:
        kept = copy_state(snaps[p])
        rest = (lengths - p).clamp(min=0)
        got, got_state = resume(run, snaps[p], ids[:, p:], lengths=rest)
        _valid_close(got, logits[:, p:], lengths, p, f"resumed at {p}: logits")
        _same_state(got_state, state, f"resumed at {p}")
        for k, v in kept.items():  # the caches are written in place: resume must continue a copy
            assert torch.equal(snaps[p][k], v), f"resume changed snapshot {p}'s {k}"
        with torch.no_grad():  # the snapshot is the state of one prefill of each row's first p tokens
            _, at_p = run.prefill(ids[:, :p], lengths.clamp(max=p), **prefill_options)
        _same_state(snaps[p], at_p, f"snapshot at {p}")


@pytest.mark.parametrize("backend", ["onnx", "onnx:ort", pytest.param("tvm", marks=pytest.mark.slow)])
def test_resumed_run_equals_uninterrupted_k3_tiny(compiled, backend):
    model, run = compiled(backend, "k3-tiny")
    check_resumes(run, model)


# The interpreter (reference) takes seconds a call whatever T is: fewer, shorter pieces there
# (1, 7 and 4 tokens; ragged). Triton's kernels run in triton's interpreter on a CPU: the same
# case took 9 minutes on 2 shared cores, so it is in the slow tier.
def test_resumed_run_equals_uninterrupted_reference(compiled):
    model, run = compiled("reference", "k3-tiny")
    check_resumes(run, model, at=[1, 8], lengths=torch.tensor([12, 9]))


@pytest.mark.slow
def test_resumed_run_equals_uninterrupted_triton(compiled):
    model, run = compiled("triton", "k3-tiny")
    check_resumes(run, model, at=[1, 8], lengths=torch.tensor([12, 9]))


# onnx in the default tier; the other backends of these two models (a capture and a build each,
# minutes on 2 cores) in the slow one
@pytest.mark.parametrize("backend", ["onnx", *[pytest.param(b, marks=pytest.mark.slow)
                                               for b in ("reference", "onnx:ort", "tvm")]])
@pytest.mark.parametrize("name", ["kimi-linear-tiny", "gpt2-tiny"])
def test_resumed_run_equals_uninterrupted_other_families(compiled, backend, name):
    model, run = compiled(backend, name)
    if backend == "reference":
        check_resumes(run, model, at=[1, 8], lengths=torch.tensor([12, 9]))
    else:
        check_resumes(run, model)


@pytest.mark.parametrize("name", ["k3-tiny", "kimi-linear-tiny", "gpt2-tiny"])
def test_eager_snapshots(name):
    """The eager model takes the same helpers (its prefill's max_context passed through), and a
    runner (k3c.generate.EagerRunner) too."""
    model = k3c.models.build(name).eval()
    check_resumes(model, model, max_context=T + 3)
    check_resumes(EagerRunner(model, T + 3), model)


def test_snapshots_of_growing_caches_and_last_logits():
    """Without fixed caches (no lengths: one length for the batch) and with logits="last"."""
    model = k3c.models.build("k3-tiny").eval()
    ids = _ids(model)[:, :40]
    with torch.no_grad():
        want, want_state = model.prefill(ids, logits="last")
    last, state, snaps = prefill_snapshots(model, ids, at=[13, 40], chunk=16, logits="last")
    assert_close(last, want, what="last logits")
    _same_state(state, want_state, "final state")
    _same_state(snaps[40], want_state, "snapshot at the end")
    got, got_state = resume(model, snaps[13], ids[:, 13:], chunk=9, logits="last")
    assert_close(got, want, what="resumed last logits")
    _same_state(got_state, want_state, "resumed state")


@pytest.mark.parametrize("at, why", [([0], "outside [1, 40]"), ([41], "outside [1, 40]"),
                                     (["8"], "must be token positions"), ([True], "must be token positions")])
def test_bad_positions_are_one_line(at, why):
    model = k3c.models.build("k3-tiny").eval()
    with pytest.raises(InputError, match=re.escape(why)) as err:
        prefill_snapshots(model, _ids(model)[:, :40], at=at)
    assert "\n" not in str(err.value)
