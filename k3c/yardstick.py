"""The float64 yardstick: a model's copy that computes in float64 from end to end.

`k3c diff` measures how far eager is from the exact result with a float64 copy of the model
(k3c.numerics.model_tolerance). `model.double()` alone is not float64 throughout: the models
and kernels widen their inputs to float32 on purpose (`x.float()` before a norm, the router's
sigmoid, the KDA gate, attention scores, `new_zeros(..., dtype=torch.float32)` for a state),
which on a float64 input narrows it. Where those fp32 islands are amplified (the router at low
scores, KDA after a strong decay) the measured noise was too low and a correct backend failed.

    exact = float64_copy(model)
    with float64_mode():
        logits, state = exact.prefill(ids)

Within `float64_mode()` a cast of a float64 tensor to float32 keeps it float64, a float32
tensor made by a factory (`zeros`, `new_zeros`, `tensor`, ...) is made float64, and a k3c
torch op runs its eager definition in Python under the mode, so the casts inside it are
widened too. What it does not touch: bit reinterpretations (`view(dtype)`), and casts to
bf16/f16 (a policy's rounding is part of what it computes).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import torch
from torch.overrides import TorchFunctionMode

_NARROW = torch.float32


def float64_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of `model` whose floating parameters and buffers are float64."""
    return copy.deepcopy(model).double()


def _wide(dtype):
    return torch.float64 if dtype is _NARROW else dtype


class _Float64(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.float and args and args[0].dtype == torch.float64:
            return args[0]
        if func is torch.Tensor.to and args and isinstance(args[0], torch.Tensor) and args[0].dtype == torch.float64:
            args = (args[0], *(_wide(a) if isinstance(a, torch.dtype) else a for a in args[1:]))
            if "dtype" in kwargs:
                kwargs["dtype"] = _wide(kwargs["dtype"])
        elif func is not torch.Tensor.view and kwargs.get("dtype") is _NARROW:
            kwargs["dtype"] = torch.float64  # a factory: zeros, new_zeros, full, tensor, arange, ...
        k3c_op = _k3c_op_name(func)
        if k3c_op is not None:
            return _eager(k3c_op, args, kwargs)
        return func(*args, **kwargs)


def _k3c_op_name(func) -> str | None:
    """The name of a `torch.ops.k3c.*` op (overload or packet), else None."""
    name = getattr(func, "_qualified_op_name", None) or getattr(getattr(func, "_schema", None), "name", None)
    if isinstance(name, str) and name.startswith("k3c::"):
        return name.split("::", 1)[1].split(".")[0]
    return None


def _eager(name: str, args: tuple, kwargs: dict):
    """A k3c op's eager definition, called in Python so that the mode sees inside it (the torch
    op would run it in the dispatcher, where a function mode is not active)."""
    from .ir import OPS
    from .ir.ops.torch_ops import _torch_attrs

    spec = OPS[name]
    names = [n.rstrip("?") for n in spec.inputs]
    ins = list(args[:len(names)]) + [kwargs.pop(n, None) for n in names[len(args):]]
    attrs = dict(zip(_torch_attrs(spec), args[len(names):]))
    attrs.update(kwargs)
    while ins and ins[-1] is None and len(ins) > len(args):  # absent optional inputs, as the torch op passes them
        ins.pop()
    with _Float64():
        return spec.eager(*ins, **attrs)


@contextlib.contextmanager
def float64_mode() -> Iterator[None]:
    """Run a float64 copy of a model (float64_copy) in float64 throughout."""
    with _Float64():
        yield


__all__ = ["float64_copy", "float64_mode"]
