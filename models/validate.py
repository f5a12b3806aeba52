"""The contract of an eager model's `prefill` and `decode`, checked before any layer runs.

Without these checks a decode state that lacks a layer's entry started that layer from zeros
(plausible, wrong logits), an id past the vocabulary was torch's `index out of range in self`,
and another model's state a bare `KeyError`. Each misfit is now an `InputError` naming the
key, the id or the bound:

- input_ids: an integer tensor [B, T] (decode: [B, 1]), every id in [0, vocab_size);
- decode state: exactly the entries the model's prefill returns, each with the batch size of
  input_ids, the model's dims, the cache length shared by every cache, and its dtype;
- positions: a model with a position table (GPT-2) takes at most `n_positions` tokens.

What a state looks like is learned once per model from two one-sequence prefills of 1 and 2
tokens (the axes that differ are the caches' length); nothing is declared a second time.
While torch.export or torch.compile trace a model nothing is checked: their example inputs
are fake tensors, and the check itself must not be traced into the graph.
"""

from __future__ import annotations

import torch

from ..errors import InputError

_SPEC = "_k3c_state_spec"


def _tracing() -> bool:
    return torch.compiler.is_compiling()


def _check_ids(model, input_ids, what: str) -> None:
    if not isinstance(input_ids, torch.Tensor):
        raise InputError(f"{what}: input_ids must be a tensor of token ids [B, T], got {type(input_ids).__name__}")
    if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
        raise InputError(f"{what}: input_ids must hold integer token ids, got {input_ids.dtype}")
    if input_ids.dim() != 2:
        raise InputError(f"{what}: input_ids must be [B, T], got shape {list(input_ids.shape)}")
    if input_ids.is_meta or not input_ids.numel():
        return
    vocab = model.config.vocab_size
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


def check_prefill(model, input_ids) -> None:
    if _tracing():
        return
    _check_ids(model, input_ids, "prefill")
    if input_ids.shape[1] == 0:
        raise InputError("prefill: input_ids holds no token (T = 0)")
    _check_positions(model, 0, input_ids.shape[1], "prefill")


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


def check_decode(model, input_ids, state) -> None:
    if _tracing():
        return
    _check_ids(model, input_ids, "decode")
    if input_ids.shape[1] != 1:
        raise InputError(f"decode takes input_ids of shape [B, 1], got {list(input_ids.shape)}")
    past = check_state(model, state, input_ids.shape[0])
    _check_positions(model, past, 1, "decode")
