"""State snapshots taken while a prompt is prefilled in pieces, and runs continued from them.

    logits, state, snaps = prefill_snapshots(run, ids, at=[64, 128], chunk=64, lengths=None)
    logits, state = resume(run, snaps[64], ids[:, 64:], lengths=None)   # = the same run from 64 on

`run` is anything with the serving entries `prefill(ids, lengths, logits)` and `extend(ids,
state, lengths, logits)`: a CompiledModel of any backend, the eager model (its prefill
options, e.g. `max_context=N`, go in `**prefill_options`), k3c.generate.EagerRunner.

A snapshot at position p is the complete state after the first p tokens of each row (after
min(p, lengths[b]) tokens of a right-padded row): every recurrent state, conv tail, cache
and `positions`, copied. Positions need not be multiples of `chunk`: the pieces are cut at
every multiple of `chunk` and at every snapshot position. Prefix caching keeps one snapshot
per shared prefix; chunked prefill at intervals gives the intervals' snapshots (what engines
keep for hybrid models, whose recurrent state cannot be rebuilt from a KV cache).

Why a copy of the whole state: an artifact with fixed-capacity caches writes its caches in
place (ONNX, TVM), so the state a later piece continues is no longer the one it was given;
the caches dominate a snapshot's bytes (max_context rows a sequence). `resume` continues a
copy, so one snapshot serves any number of continuations.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .errors import InputError


def copy_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A copy of every tensor of `state`: continuing the copy leaves `state` as it was."""
    return {name: t.clone() for name, t in state.items()}


def _positions(at: Iterable[int], T: int) -> list[int]:
    at = list(at) if isinstance(at, Iterable) else at
    if not isinstance(at, list) or not all(isinstance(p, int) and not isinstance(p, bool) for p in at):
        raise InputError(f"snapshots: at must be token positions (ints), got {at!r}")
    points = sorted(set(at))
    bad = [p for p in points if not 1 <= p <= T]
    if bad:
        raise InputError(f"snapshots: position {bad[0]} is outside [1, {T}] (the prompt holds {T} tokens a row)")
    return points


def _cuts(T: int, chunk: int | None, points: list[int]) -> list[int]:
    """The end of every piece: each multiple of `chunk` below T, each snapshot position, T."""
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
        raise InputError(f"snapshots: chunk must be a positive int (tokens a piece), got {chunk!r}")
    ends = set(points) | {T}
    if chunk is not None:
        ends |= set(range(chunk, T, chunk))
    return sorted(ends)


def _last_of(out: torch.Tensor, part: torch.Tensor | None) -> torch.Tensor:
    """[B, T, V] -> [B, 1, V]: each row's last real token of this piece (any row without one)."""
    B, T, V = out.shape
    idx = torch.full((B,), T - 1) if part is None else part.clamp(min=1) - 1
    return out.gather(1, idx.view(B, 1, 1).expand(B, 1, V))


def _pieces(first, more, input_ids: torch.Tensor, lengths, ends: list[int], logits: str, snapshot_at: list[int]):
    """Feed `input_ids` [B, T] piece by piece (`first` the first piece, `more` the others, both
    logits "all"), copying the state at each of `snapshot_at`. Returns (logits, state, snaps)."""
    if logits not in ("all", "last"):
        raise InputError(f"snapshots: logits must be 'all' or 'last', got {logits!r}")
    B = input_ids.shape[0]
    lengths = None if lengths is None else torch.as_tensor(lengths).long()
    pieces, last, state, snaps, start = [], None, None, {}, 0
    for end in ends:
        ids = input_ids[:, start:end]
        part = None if lengths is None else (lengths - start).clamp(min=0, max=end - start)
        out, state = first(ids, part) if state is None else more(ids, state, part)
        if logits == "all":
            pieces.append(out)
        else:
            here = _last_of(out, part)
            ends_here = torch.ones(B, dtype=torch.bool) if part is None else part > 0
            last = here if last is None else torch.where(ends_here.view(B, 1, 1), here, last)
        if end in snapshot_at:
            snaps[end] = copy_state(state)
        start = end
    return (last if logits == "last" else torch.cat(pieces, dim=1)), state, snaps


def prefill_snapshots(run, input_ids: torch.Tensor, at: Iterable[int], chunk: int | None = None, lengths=None,
                      logits: str = "all", **prefill_options) -> tuple[torch.Tensor, dict, dict[int, dict]]:
    """Prefill `input_ids` [B, T] (right-padded rows of `lengths` real tokens) in pieces cut at
    each multiple of `chunk` and at each position of `at`; returns the logits (all, or each
    row's last), the final state and {position: a copy of the state after that many tokens}.
    The result is a prefill's: the same logits and state as one call, up to rounding."""
    T = input_ids.shape[-1]
    points = _positions(at, T)
    ends = _cuts(T, chunk, points)
    with torch.no_grad():
        return _pieces(lambda ids, n: run.prefill(ids, n, **prefill_options),
                       lambda ids, state, n: run.extend(ids, state, lengths=n),
                       input_ids, lengths, ends, logits, points)


def resume(run, snapshot: dict[str, torch.Tensor], input_ids: torch.Tensor, chunk: int | None = None,
           lengths=None, logits: str = "all") -> tuple[torch.Tensor, dict]:
    """Continue a copy of `snapshot` with `input_ids` [B, T] (in pieces of `chunk` tokens when
    given; `lengths[b]` in [0, T] real tokens a row, fixed caches only): the logits and state
    of the uninterrupted run from the snapshot's position on. `snapshot` is left as it was."""
    if not isinstance(snapshot, dict):
        raise InputError(f"resume: snapshot must be a state dict, got {type(snapshot).__name__}")
    T = input_ids.shape[-1]
    ends = _cuts(T, chunk, [])
    with torch.no_grad():
        state = copy_state(snapshot)
        out, state, _ = _pieces(lambda ids, n: run.extend(ids, state, lengths=n),
                                lambda ids, st, n: run.extend(ids, st, lengths=n),
                                input_ids, lengths, ends, logits, [])
    return out, state
