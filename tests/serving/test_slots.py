"""Continuous batching in slots (k3c/slots.py): a sequence added to a running batch, prefilled
in pieces or retired, equals the same sequence run alone, and clearing a slot leaves the others
unchanged, on every CPU backend; misuse is one line.

"Alone" is the same artifact's prefill of the whole prompt (batch 1) and its own decode steps,
fed the same tokens: the fp32 row of k3c/numerics.py. The greedy tokens must be equal.
"""

from __future__ import annotations

import pytest
import torch

import k3c
from k3c.errors import InputError, UsageError
from k3c.generate import EagerRunner
from k3c.numerics import assert_close
from k3c.slots import Slots

# (prompt, arrival step, decode steps, prefill pieces); at step 6 the first sequence is retired
# and the fourth takes its slot
SEQS = [(9, 0, 6, None), (5, 2, 7, None), (11, 3, 6, [4, 7]), (6, 6, 3, None)]
STEPS = 9


def _prompts(model):
    gen = torch.Generator().manual_seed(11)
    return [torch.randint(0, model.config.vocab_size, (n,), generator=gen) for n, *_ in SEQS]


def serve(run, prompts, clear_at: dict[int, int] | None = None):
    """Run SEQS through 3 slots: each sequence arrives at its step (a prompt in pieces is added
    with its first piece, extended by the others while the rest decode), decodes greedily for
    its steps and is retired. `clear_at` {sequence: step}: retire one early. Returns per
    sequence (slot, [last prompt logits, each step's logits], [tokens])."""
    slots = Slots(run, 3)
    seen: dict[int, tuple] = {}
    live: dict[int, int] = {}  # sequence -> its slot, while it holds one
    pending: dict[int, list] = {}
    for step in range(STEPS):
        for i, (_, _, steps, _) in enumerate(SEQS):  # retire first: an arrival may need the slot
            if i in live and (len(seen[i][2]) > steps or (clear_at or {}).get(i) == step):
                slots.clear(live.pop(i))
        for i, (_, arrive, _, pieces) in enumerate(SEQS):
            if arrive == step:
                s, logits = slots.add(prompts[i][:pieces[0]] if pieces else prompts[i])
                seen[i], live[i] = (s, [logits[0, -1]], [int(logits[0, -1].argmax())]), s
                pending[i] = [prompts[i][pieces[0]:]] if pieces else []
        tokens = {s: seen[i][2][-1] for i, s in live.items() if not pending[i]}
        out = slots.step(tokens) if tokens else {}
        for i, s in live.items():
            _, logits, toks = seen[i]
            if s in out:
                logits.append(out[s])
                toks.append(int(out[s].argmax()))
            elif pending[i]:  # the rest of a prompt, fed while the others decoded
                last = slots.extend(s, pending[i].pop())
                logits[-1], toks[-1] = last[0, -1], int(last[0, -1].argmax())
    for s in live.values():
        slots.clear(s)
    return seen, slots


def alone(run, prompt, tokens):
    """The sequence by itself: one prefill of its prompt, decode steps fed `tokens`."""
    with torch.no_grad():
        logits, state = run.prefill(prompt.view(1, -1), logits="last")
        out = [logits[0, -1]]
        for t in tokens[:-1]:
            logits, state = run.decode(torch.tensor([[t]]), state)
            out.append(logits[0, -1])
    return out


def check_alone(run, model, clear_at=None):
    prompts = _prompts(model)
    seen, slots = serve(run, prompts, clear_at)
    assert seen[3][0] == seen[0][0], "the fourth sequence should take the retired first one's slot"
    for i, (s, logits, toks) in seen.items():
        want = alone(run, prompts[i], toks)
        assert [int(w.argmax()) for w in want] == toks, f"sequence {i}: greedy tokens differ from its run alone"
        assert_close(torch.stack(logits), torch.stack(want), what=f"sequence {i} (slot {s}) logits")
    return seen, slots


@pytest.mark.parametrize("backend", ["reference", "onnx", "onnx:ort", pytest.param("tvm", marks=pytest.mark.slow)])
def test_sequence_added_mid_run_equals_it_alone(compiled, backend):
    model, run = compiled(backend, "k3-tiny")
    _, slots = check_alone(run, model)
    assert slots.free() == [0, 1, 2] and slots.positions.tolist() == [0, 0, 0]


@pytest.mark.parametrize("backend", ["onnx", pytest.param("tvm", marks=pytest.mark.slow)])
def test_other_family(compiled, backend):
    model, run = compiled(backend, "kimi-linear-tiny")
    check_alone(run, model)


@pytest.mark.parametrize("backend", ["reference", "onnx", pytest.param("tvm", marks=pytest.mark.slow)])
def test_cleared_slot_leaves_the_others_unchanged(compiled, backend):
    """Sequence 1 retired at step 4 instead of 8: the others' logits are as before."""
    model, run = compiled(backend, "k3-tiny")
    full, _ = serve(run, _prompts(model))
    cut, _ = serve(run, _prompts(model), clear_at={1: 4})
    assert len(cut[1][1]) < len(full[1][1])
    for i in (0, 2, 3):
        assert cut[i][2] == full[i][2], f"sequence {i}: tokens changed when another slot was cleared"
        assert_close(torch.stack(cut[i][1]), torch.stack(full[i][1]), what=f"sequence {i} logits")


def test_eager_slots_and_cleared_rows():
    model = k3c.models.build("k3-tiny").eval()
    seen, slots = check_alone(EagerRunner(model, 40), model)
    assert all(float(t.abs().sum()) == 0 for t in slots.state.values()), "a cleared slot keeps its rows"


def test_add_from_a_snapshot_state():
    """A shared prefix prefilled once: a sequence added from its state equals the whole prompt alone."""
    model = k3c.models.build("k3-tiny").eval()
    run = EagerRunner(model, 40)
    ids = torch.randint(0, model.config.vocab_size, (1, 20), generator=torch.Generator().manual_seed(2))
    _, prefix = run.prefill(ids[:, :12])
    slots = Slots(run, 2)
    s, logits = slots.add(ids[0, 12:], state=prefix)
    want, _ = run.prefill(ids, logits="last")
    assert_close(logits, want, what="added from a prefix state")
    assert int(slots.positions[s]) == 20 and int(prefix["positions"][0]) == 12


def _one_line(kind, match, fn):
    with pytest.raises(kind, match=match) as err:
        fn()
    assert "\n" not in str(err.value)


def test_misuse_is_one_line():
    model = k3c.models.build("k3-tiny").eval()
    slots = Slots(EagerRunner(model, 12), 2)
    ids = torch.arange(1, 6)
    slots.add(ids)
    slots.add(ids)
    _one_line(UsageError, "all 2 slots hold a sequence", lambda: slots.add(ids))
    _one_line(UsageError, "no slot 5", lambda: slots.clear(5))
    _one_line(UsageError, "no slot", lambda: slots.step({-1: 3, 0: 1, 1: 1}))
    _one_line(UsageError, "for one or more busy slots", lambda: slots.step({}))
    slots.clear(1)
    _one_line(UsageError, "slot 1 holds no sequence", lambda: slots.extend(1, ids))
    _one_line(UsageError, "slot 0 holds a sequence", lambda: slots.add(ids, slot=0))
    _one_line(InputError, "passes the capacity", lambda: slots.extend(0, torch.arange(1, 9)))
    _one_line(InputError, "passes the capacity", lambda: slots.add(torch.arange(1, 14)))
    slots.extend(0, torch.arange(1, 8))  # 12 tokens: the caches are full
    _one_line(InputError, "slot 0, which holds 12, passes the capacity", lambda: slots.step({0: 1}))
    _one_line(UsageError, "fixed-capacity caches", lambda: Slots(model, 2))
    _one_line(UsageError, "size must be a positive int", lambda: Slots(EagerRunner(model, 12), 0))
