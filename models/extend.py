"""Continuing a state with more tokens: `extend`, and the chunked prefill made of it.

    model.extend(ids, state, lengths=None, logits="all") -> (logits, state)
        ids [B, T] (T >= 1) continue `state` (what prefill, decode or extend returned). With
        fixed-capacity caches (the state holds `positions`) each sequence continues at its own
        position and `lengths` [B] (each in [0, T]) says how many of its row's tokens are real
        (right padding; 0: the sequence sits this call out, its state unchanged); positions
        advance by them. Growing caches hold one length for the whole batch: no `lengths`.
    model.prefill(ids, chunk=N, ...)
        the same result as one prefill, computed as a prefill of the first N tokens and extends
        of N tokens each: peak activations bounded by N, not T.

Prefill is extend from the empty state; decode is extend with T = 1. Everything a layer needs
(a chunked delta rule from an initial state, the short convs' tails, attention over the cache
plus the new rows) is already what `step(ids, state, seq)` does.
"""

from __future__ import annotations

import torch

from ..errors import InputError
from .serving import Seq
from .validate import _check_ids, _check_positions, _tracing, check_positions, check_state


def check_extend(model, input_ids, state, lengths, logits: str) -> torch.Tensor | None:
    """Check an extend's arguments; returns `lengths` as int64 [B] (or None)."""
    if _tracing():
        return lengths
    _check_ids(model, input_ids, "extend")
    B, T = input_ids.shape
    if T == 0:
        raise InputError("extend: input_ids holds no token (T = 0)")
    if logits not in ("all", "last"):
        raise InputError(f"extend: logits must be 'all' or 'last', got {logits!r}")
    fixed = isinstance(state, dict) and "positions" in state
    if lengths is not None:
        if not fixed:
            raise InputError("extend: lengths= needs fixed-capacity caches (a state from prefill(..., "
                             "max_context=N)): a growing cache holds one length for the whole batch")
        lengths = _check_counts(lengths, B, T)
    if not fixed:
        _check_positions(model, check_state(model, state, B, "extend"), T, "extend")
        return lengths
    capacity = check_state(model, {k: v for k, v in state.items() if k != "positions"}, B, "extend")
    end = check_positions(state, B, 0, "extend") + T  # every row of the call is written, padding too
    if capacity and bool((end > capacity).any()):
        b = int((end > capacity).nonzero()[0])
        raise InputError(f"extend: sequence {b} holds {int(end[b]) - T} tokens; {T} more rows do not fit "
                         f"the {capacity} rows of its caches (prefill or compile with a larger max_context)")
    _check_positions(model, int(end.max()) if end.numel() else 0, 0, "extend")
    return lengths


def _check_counts(lengths, B: int, T: int) -> torch.Tensor:
    """`lengths` as int64 [B] with every value in [0, T]."""
    t = torch.as_tensor(lengths)
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise InputError(f"extend: lengths must hold integers, got {t.dtype}")
    if t.dim() != 1 or t.shape[0] != B:
        raise InputError(f"extend: lengths must be [B] = [{B}], got shape {list(t.shape)}")
    bad = (t < 0) | (t > T)
    if bool(bad.any()):
        b = int(bad.nonzero()[0])
        raise InputError(f"extend: lengths[{b}] = {int(t[b])} is outside [0, {T}] (T = {T} tokens a row)")
    return t.long()


def extend(model, input_ids: torch.Tensor, state: dict, lengths=None,
           logits: str = "all") -> tuple[torch.Tensor, dict]:
    """Continue `state` with `input_ids` [B, T] (module docstring)."""
    lengths = check_extend(model, input_ids, state, lengths, logits)
    positions = state.get("positions")
    if positions is None:
        out, new = model.step(input_ids, state)
        return (out[:, -1:] if logits == "last" else out), new
    seq = Seq(lengths=lengths, positions=positions)
    out, new = model.step(input_ids, {k: v for k, v in state.items() if k != "positions"}, seq)
    new["positions"] = seq.held(*input_ids.shape, input_ids.device)
    if logits == "last":
        T = input_ids.shape[1]
        last = (T if lengths is None else lengths.clamp(min=1)) - 1  # a sequence sitting out: any row
        out = out.gather(1, torch.as_tensor(last).expand(out.shape[0]).view(-1, 1, 1).expand(-1, 1, out.shape[2]))
    return out, new


def check_chunk(chunk) -> int:
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise InputError(f"prefill: chunk must be a positive int (tokens a piece), got {chunk!r}")
    return chunk


def prefill_chunked(start, more, input_ids: torch.Tensor, chunk: int, lengths=None,
                    logits: str = "all") -> tuple[torch.Tensor, dict]:
    """A prefill of `input_ids` (right-padded rows of `lengths` real tokens) as `start(ids,
    lengths)` of the first `chunk` tokens and `more(ids, state, lengths)` of `chunk` tokens
    each (an eager model's or a compiled one's prefill and extend, logits "all"): the same
    logits, all or each row's last, and the same state."""
    check_chunk(chunk)
    B, T = input_ids.shape
    if lengths is not None:
        lengths = torch.as_tensor(lengths).long()
    part = None if lengths is None else lengths.clamp(max=chunk)
    out, state = start(input_ids[:, :chunk], part)
    pieces, last = [out], _last_of(out, part) if logits == "last" else None
    for at in range(chunk, T, chunk):
        ids = input_ids[:, at:at + chunk]
        part = None if lengths is None else (lengths - at).clamp(min=0, max=ids.shape[1])
        out, state = more(ids, state, part)
        if logits == "last":
            ends_here = torch.ones(B, dtype=torch.bool) if part is None else part > 0
            last = torch.where(ends_here.view(B, 1, 1), _last_of(out, part), last)
        else:
            pieces.append(out)
    return (last if logits == "last" else torch.cat(pieces, dim=1)), state


def _last_of(out: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
    """[B, T, V] -> [B, 1, V]: each row's last real token (any row where it has none)."""
    B, T, V = out.shape
    idx = torch.full((B,), T - 1) if lengths is None else lengths.clamp(min=1) - 1
    return out.gather(1, idx.view(B, 1, 1).expand(B, 1, V))
