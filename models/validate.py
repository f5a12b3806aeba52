"""The contract of an eager model's `prefill` and `decode`, checked before any layer runs.

Without these checks a decode state that lacks a layer's entry started that layer from zeros
(plausible, wrong logits), an id past the vocabulary was torch's `index out of range in self`,
and another model's state a bare `KeyError`. Each misfit is now an `InputError` naming the
key, the id or the bound:

- input_ids: an integer tensor [B, T] (decode: [B, 1]), every id in [0, vocab_size);
- decode state: exactly the entries the model's prefill returns, each with the batch size of
  input_ids, the model's dims, the cache length shared by every cache, and its dtype;
- positions: a model with a position table (GPT-2) takes at most `n_positions` tokens;
- prefill's lengths (int [B], each in [1, T]), logits ("all" or "last") and max_context (T at
  most); a fixed-capacity state's `positions` (int64 [B], each below the caches' capacity).

What a state looks like is learned once per model from two one-sequence prefills of 1 and 2
tokens (the axes that differ are the caches' length); nothing is declared a second time.
While torch.export or torch.compile trace a model nothing is checked: their example inputs
are fake tensors, and the check itself must not be traced into the graph.
"""

from __future__ import annotations

import torch

from ..errors import CheckpointError, InputError

_SPEC = "_k3c_state_spec"


def _tracing() -> bool:
    return torch.compiler.is_compiling()


def _check_ids(model, input_ids, what: str) -> None:
    check_input_ids(input_ids, what, model.config.vocab_size)


def check_input_ids(input_ids, what: str, vocab: int | None = None) -> None:
    """input_ids: an integer tensor [B, T], every id in [0, vocab) when `vocab` is given (the
    eager models and every compiled runner check their ids here)."""
    if not isinstance(input_ids, torch.Tensor):
        raise InputError(f"{what}: input_ids must be a tensor of token ids [B, T], got {type(input_ids).__name__}")
    if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
        raise InputError(f"{what}: input_ids must hold integer token ids, got {input_ids.dtype}")
    if input_ids.dim() != 2:
        raise InputError(f"{what}: input_ids must be [B, T], got shape {list(input_ids.shape)}")
    if vocab is None or input_ids.is_meta or not input_ids.numel():
        return
    bad = (input_ids < 0) | (input_ids >= vocab)
    if bool(bad.any()):
        b, t = (int(i) for i in bad.nonzero()[0])
        raise InputError(f"{what}: token id {int(input_ids[b, t])} at [{b}, {t}] is outside the vocabulary "
                         f"[0, {vocab})")


def _check_positions(model, past: int, T: int, what: str) -> None:
    limit = getattr(model.config, "n_positions", None)
    if limit is not None and past + T > limit:
        held = f"{past} cached + {T} new tokens" if past else f"{T} tokens"
        raise InputError(f"{what}: {held} exceed the model's position table (n_positions = {limit})")


def check_prefill(model, input_ids, lengths=None, logits: str = "all", max_context=None) -> torch.Tensor | None:
    """Check a prefill's arguments; returns `lengths` as an int64 tensor (or None)."""
    if _tracing():
        return lengths
    _check_ids(model, input_ids, "prefill")
    B, T = input_ids.shape
    if T == 0:
        raise InputError("prefill: input_ids holds no token (T = 0)")
    if logits not in ("all", "last"):
        raise InputError(f"prefill: logits must be 'all' or 'last', got {logits!r}")
    if max_context is not None:
        if isinstance(max_context, bool) or not isinstance(max_context, int) or max_context < 1:
            raise InputError(f"prefill: max_context must be a positive int (the cache capacity), got {max_context!r}")
        if T > max_context:
            raise InputError(f"prefill: {T} tokens exceed max_context = {max_context}")
        _check_positions(model, 0, max_context, "prefill (max_context)")
    _check_positions(model, 0, T, "prefill")
    if lengths is None:
        return None
    lengths = check_lengths(lengths, B, T, "prefill")
    if max_context is None and bool((lengths < T).any()) and any(grow for _, grow, _ in state_spec(model).values()):
        raise InputError("prefill: prompts of different lengths need fixed-capacity caches (max_context=N): "
                         "a growing cache holds one length for the whole batch")
    return lengths


def check_lengths(lengths, B: int, T: int, what: str) -> torch.Tensor:
    """`lengths` as int64 [B] with every value in [1, T], or an InputError naming the misfit."""
    if not isinstance(lengths, torch.Tensor):
        try:
            lengths = torch.as_tensor(lengths)
        except (TypeError, ValueError, RuntimeError):
            raise InputError(f"{what}: lengths must be {B} token counts, got {type(lengths).__name__}") from None
    if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
        raise InputError(f"{what}: lengths must hold integers, got {lengths.dtype}")
    if lengths.dim() != 1 or lengths.shape[0] != B:
        raise InputError(f"{what}: lengths must be [B] = [{B}], got shape {list(lengths.shape)}")
    bad = (lengths < 1) | (lengths > T)
    if bool(bad.any()):
        b = int(bad.nonzero()[0])
        raise InputError(f"{what}: lengths[{b}] = {int(lengths[b])} is outside [1, {T}] (T = {T} tokens a row)")
    return lengths.long()


def state_spec(model) -> dict[str, tuple[tuple[int, ...], set[int], torch.dtype]]:
    """name -> (shape at B = 1 after one token, the axes that grow with the length, dtype)."""
    first = next(iter(model.parameters()))
    key = (first.dtype, first.device)  # a model cast or moved after the first look is looked at again
    cached = model.__dict__.get(_SPEC)
    spec = cached[1] if cached is not None and cached[0] == key else None
    if spec is None:
        dev = first.device
        with torch.no_grad():
            one = model.step(torch.zeros(1, 1, dtype=torch.long, device=dev), None)[1]
            two = model.step(torch.zeros(1, 2, dtype=torch.long, device=dev), None)[1]
        spec = {k: (tuple(v.shape), {i for i, (a, b) in enumerate(zip(v.shape, two[k].shape)) if a != b}, v.dtype)
                for k, v in one.items()}
        model.__dict__[_SPEC] = (key, spec)
    return spec


def _names(keys, limit: int = 3) -> str:
    keys = sorted(keys)
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    return ", ".join(repr(k) for k in keys[:limit]) + more


def check_state(model, state, B: int, what: str = "decode") -> int:
    """Check a decode state against the model's; returns the cached length (0 without caches)."""
    if not isinstance(state, dict):
        raise InputError(f"{what}: state must be the dict prefill returned, got {type(state).__name__}")
    spec = state_spec(model)
    missing, extra = set(spec) - set(state), set(state) - set(spec)
    if missing:
        raise InputError(f"{what}: the state lacks {_names(missing)}; pass the whole state prefill or decode returned")
    if extra:
        raise InputError(f"{what}: the state has {_names(extra)}, which {getattr(model, 'name', 'this model')} "
                         f"does not have (a state of another model?)")
    past: tuple[int, str] | None = None
    for name, (shape, grow, dtype) in spec.items():
        x = state[name]
        if not isinstance(x, torch.Tensor) or x.dim() != len(shape):
            got = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise InputError(f"{what}: state {name!r} must have {len(shape)} dims, got {got}")
        if x.dtype != dtype:
            raise InputError(f"{what}: state {name!r} is {x.dtype}, the model keeps it in {dtype}")
        want = [B if i == 0 else None if i in grow else d for i, d in enumerate(shape)]
        for axis, (n, w) in enumerate(zip(x.shape, want)):
            if w is not None and n != w:
                raise InputError(f"{what}: state {name!r} has shape {list(x.shape)}; dim {axis} must be {w}"
                                 + (" (the batch size of input_ids)" if axis == 0 else ""))
            if w is None:
                if past is None:
                    past = (int(n), name)
                elif n != past[0]:
                    raise InputError(f"{what}: state {name!r} caches {n} tokens, {past[1]!r} caches {past[0]}")
    return 0 if past is None else past[0]


def check_positions(state, B: int, capacity: int, what: str = "decode") -> torch.Tensor:
    """A fixed-capacity state's `positions`: int64 [B], each sequence with room for one more row."""
    p = state["positions"]
    if not isinstance(p, torch.Tensor) or p.dtype != torch.long or list(p.shape) != [B]:
        got = f"{p.dtype} {list(p.shape)}" if isinstance(p, torch.Tensor) else type(p).__name__
        raise InputError(f"{what}: state 'positions' must be int64 [{B}] (tokens each sequence holds), got {got}")
    if p.numel() and not p.is_meta:
        if bool((p < 0).any()):
            b = int((p < 0).nonzero()[0])
            raise InputError(f"{what}: positions[{b}] = {int(p[b])} is negative")
        if capacity and bool((p >= capacity).any()):
            b = int((p >= capacity).nonzero()[0])
            raise InputError(f"{what}: sequence {b} holds {int(p[b])} tokens, all {capacity} rows of its caches: "
                             f"no room for another (prefill or compile with a larger max_context)")
    return p


def check_decode(model, input_ids, state) -> None:
    if _tracing():
        return
    _check_ids(model, input_ids, "decode")
    if input_ids.shape[1] != 1:
        raise InputError(f"decode takes input_ids of shape [B, 1], got {list(input_ids.shape)}")
    B = input_ids.shape[0]
    if isinstance(state, dict) and "positions" in state:  # fixed-capacity caches: `past` is their capacity
        capacity = check_state(model, {k: v for k, v in state.items() if k != "positions"}, B)
        p = check_positions(state, B, capacity)
        _check_positions(model, int(p.max()) if p.numel() else 0, 1, "decode")
        return
    past = check_state(model, state, B)
    _check_positions(model, past, 1, "decode")


def check_weight_dtypes(cfg: object, dtypes: dict[str, torch.dtype]) -> None:
    """The floating weights a checkpoint gives a model (name -> dtype) must share one dtype,
    apart from those its family's release keeps in F32: one F16 tensor among F32 ones would
    load and then stop the first forward at a matmul of mixed dtypes."""
    from collections import Counter

    from .precision import f32_tensors

    keep = f32_tensors(cfg)
    free = {k: d for k, d in dtypes.items() if d.is_floating_point and not (keep is not None and keep.search(k))}
    if len(set(free.values())) <= 1:
        return
    common, n = Counter(free.values()).most_common(1)[0]
    odd = sorted(k for k, d in free.items() if d != common)
    raise CheckpointError(f"{odd[0]} is stored as {free[odd[0]]}, {n} other weights as {common}"
                          + (f" ({len(odd) - 1} more like it)" if len(odd) > 1 else "")
                          + ": the model computes in one dtype; pass dtype= to cast them")
