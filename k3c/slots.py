"""Continuous batching: a batch of a fixed number of slots, each free or holding one sequence.

    slots = Slots(run, size=4)              # run: a CompiledModel with fixed caches (max_context=N)
                                            # or k3c.generate.EagerRunner(model, N)
    s, logits = slots.add(prompt)           # prefill a sequence into a free slot: its last logits [1, 1, vocab]
    s, logits = slots.add(rest, state=snap) # ... or continue a one-sequence state (a shared prefix's snapshot)
    logits = slots.extend(s, more)          # more tokens onto one slot's sequence (a long prompt in pieces)
    logits = slots.step({s: token, ...})    # one decode step of these slots -> {slot: logits [vocab]}
    snap = slots.state_of(s)                # a copy of one slot's state (one sequence)
    slots.clear(s)                          # retire its sequence: the slot is free again
    slots.positions                         # int64 [size]: tokens each slot holds (0 when free)

Built over the artifact's entries as they are. The batch state holds every state tensor with
`size` rows (each cache at its capacity of N rows, `positions` per slot). A sequence is
prefilled or extended alone (a one-row prefill or extend of its own tokens) and its state is
then written into its slot's rows; the other slots' rows are not touched, so their sequences
go on decoding as if nothing happened. `step` runs the decode entry over every row when every
busy slot steps: a free row decodes token 0 from what its rows hold (scratch until a sequence
is added, which overwrites all of them), its result dropped and its position set back to 0.
That is safe because no row reads another (per-sequence recurrences and cache reads, per-token
routing), which the tests check. When a busy slot sits a step out (its prompt is still being
fed in pieces), the step is an extend of one token with `lengths` 1 or 0 instead: a row of
length 0 keeps its state.

What this does not do: a step computes the free rows too (the decode entry's batch is the
whole capacity); a slot's prefill is a call of its own, not mixed into the decode batch as
engines mix prefill and decode tokens; moving a sequence's state into its rows is a host-side
copy of its caches between calls.
"""

from __future__ import annotations

import torch

from .errors import InputError, UsageError


class Slots:
    """A fixed-capacity batch state over `run` (module docstring)."""

    def __init__(self, run, size: int):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise UsageError(f"slots: size must be a positive int (sequences at a time), got {size!r}")
        self.capacity = getattr(run, "max_context", None)
        if self.capacity is None:
            raise UsageError("slots need fixed-capacity caches: compile with max_context=N (or give "
                             "k3c.generate.EagerRunner(model, N))")
        self.run, self.size = run, size
        self.busy = [False] * size
        with torch.no_grad():  # every state tensor at `size` rows: a one-token prefill's, zeroed
            _, state = run.prefill(torch.zeros(size, 1, dtype=torch.long))
        self.state = {name: torch.zeros_like(t) for name, t in state.items()}

    @property
    def positions(self) -> torch.Tensor:
        """int64 [size]: the tokens each slot's sequence holds (0 for a free slot)."""
        return self.state["positions"].clone()

    def free(self) -> list[int]:
        """The slots that hold no sequence."""
        return [s for s in range(self.size) if not self.busy[s]]

    def _slot(self, slot, busy: bool = True) -> int:
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < self.size:
            raise UsageError(f"slots: no slot {slot!r} (there are {self.size}: 0 to {self.size - 1})")
        if busy and not self.busy[slot]:
            raise UsageError(f"slots: slot {slot} holds no sequence (add one first)")
        if not busy and self.busy[slot]:
            raise UsageError(f"slots: slot {slot} holds a sequence (clear it first)")
        return slot

    @staticmethod
    def _ids(input_ids, what: str) -> torch.Tensor:
        ids = torch.as_tensor(input_ids)
        ids = ids.view(1, -1) if ids.dim() == 1 else ids
        if ids.dim() != 2 or ids.shape[0] != 1:
            raise InputError(f"slots: {what} takes the tokens of one sequence, [T] or [1, T], got {list(ids.shape)}")
        if ids.shape[1] == 0:
            raise InputError(f"slots: {what} got no token")
        return ids

    def _fits(self, slot: int, held: int, more: int, what: str) -> None:
        if held + more > self.capacity:
            raise InputError(f"slots: {what} of {more} token(s) onto slot {slot}, which holds {held}, passes the "
                             f"capacity of its caches ({self.capacity} rows)")

    def add(self, input_ids, state: dict | None = None, slot: int | None = None) -> tuple[int, torch.Tensor]:
        """Put a sequence into a free slot (the lowest, or `slot`): a prefill of `input_ids`
        [T] or [1, T], or an extend of `state` (one sequence's, e.g. a snapshot; not changed)
        by them. Returns the slot and the logits of its last token, [1, 1, vocab]."""
        if slot is None:
            free = self.free()
            if not free:
                raise UsageError(f"slots: all {self.size} slots hold a sequence (clear one first)")
            slot = free[0]
        slot = self._slot(slot, busy=False)
        ids = self._ids(input_ids, "add")
        with torch.no_grad():
            if state is None:
                self._fits(slot, 0, ids.shape[1], "a prompt")
                logits, one = self.run.prefill(ids, logits="last")
            else:
                one = self._one(state)
                self._fits(slot, int(one["positions"][0]), ids.shape[1], "an extend")
                logits, one = self.run.extend(ids, {n: t.clone() for n, t in one.items()}, logits="last")
        self._put(slot, one)
        self.busy[slot] = True
        return slot, logits

    def _one(self, state) -> dict:
        """`state` checked to be one sequence's state of this artifact."""
        if not isinstance(state, dict) or set(state) != set(self.state):
            theirs = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise InputError(f"slots: state must be one sequence's state of this model, with the entries "
                             f"{sorted(self.state)[:3]}...; got {str(theirs)[:80]}")
        bad = [n for n, t in state.items() if t.shape[0] != 1 or t.shape[1:] != self.state[n].shape[1:]]
        if bad:
            raise InputError(f"slots: state {bad[0]!r} is {list(state[bad[0]].shape)}, not one sequence's "
                             f"[1, {', '.join(map(str, self.state[bad[0]].shape[1:]))}]")
        return state

    def extend(self, slot: int, input_ids, logits: str = "last") -> torch.Tensor:
        """More tokens [T] or [1, T] onto the sequence of `slot` (the other slots untouched);
        its logits, the last [1, 1, vocab] or all [1, T, vocab]."""
        slot = self._slot(slot)
        ids = self._ids(input_ids, "extend")
        self._fits(slot, int(self.state["positions"][slot]), ids.shape[1], "an extend")
        with torch.no_grad():
            out, one = self.run.extend(ids, self.state_of(slot), logits=logits)
        self._put(slot, one)
        return out

    def step(self, tokens: dict[int, int]) -> dict[int, torch.Tensor]:
        """One decode step of the busy slots in `tokens` ({slot: next token id}); a busy slot
        left out sits the step out, unchanged (one in the middle of a prompt fed in pieces).
        Returns {slot: logits [vocab]} for the slots that stepped."""
        if not isinstance(tokens, dict) or not tokens:
            raise UsageError(f"slots: step takes {{slot: token}} for one or more busy slots, got {tokens!r}")
        for s in tokens:
            self._slot(s)
            self._fits(s, int(self.state["positions"][s]), 1, "a decode step")
        ids = torch.zeros(self.size, 1, dtype=torch.long)
        for s, tok in tokens.items():
            ids[s, 0] = int(tok)
        idle = torch.tensor([s not in tokens for s in range(self.size)])
        with torch.no_grad():
            if any(self.busy[s] for s in range(self.size) if s not in tokens):
                # the decode entry advances every row: a sequence sitting out needs extend's lengths
                logits, state = self.run.extend(ids, self.state, lengths=(~idle).long())
            else:  # the decode entry: a free row decodes token 0, its result dropped
                logits, state = self.run.decode(ids, self.state)
                state["positions"] = torch.where(idle, torch.zeros_like(state["positions"]), state["positions"])
        self.state = state
        return {s: logits[s, -1] for s in tokens}

    def state_of(self, slot: int) -> dict[str, torch.Tensor]:
        """A copy of the state of `slot`'s sequence, one row of each tensor (a snapshot)."""
        slot = self._slot(slot)
        return {n: t[slot:slot + 1].clone() for n, t in self.state.items()}

    def clear(self, slot: int) -> None:
        """Retire the sequence of `slot`: its rows are zeroed and the slot is free."""
        slot = self._slot(slot)
        for t in self.state.values():
            t[slot].zero_()
        self.busy[slot] = False

    def _put(self, slot: int, one: dict[str, torch.Tensor]) -> None:
        """Write one sequence's state into the rows of `slot`, in place."""
        for n, t in self.state.items():
            t[slot] = one[n][0].to(t.dtype)
