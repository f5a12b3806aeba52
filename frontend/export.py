"""torch.export with k3c's dynamic dims, and what to do when a dim's range is too wide.

A model that slices along the sequence axis (`h[:, :-1]`, `h[:, 1:]`, a token shift) makes
torch.export guard that the sliced length is not 1 (it specialises sizes 0 and 1), e.g.
`(-1) + T != 1`, and refuse T's range [2, inf) as a whole ("Constraints violated (T)"). Such
a guard only excludes short lengths, so the capture is retried with T starting above them
(T >= 3 for a shift by one); the graph records that range in its dims and every runner
refuses a shorter prompt with a one-line error. torch's own suggested fixes are applied the
same way. Anything else, or a retry that fails too, is a CaptureError carrying torch's whole
reason, not its first line.
"""

from __future__ import annotations

import re

import torch
from torch.export import Dim
from torch.utils import _pytree as pytree

from ..errors import CaptureError

# ((-k) + L['input_ids'].size()[axis]) != v : the guard of a length k shorter than a dynamic dim
_SHORT_GUARD = re.compile(r"\(\(-(\d+)\) \+ L\[[^\]]+\]\.size\(\)\[\d+\]\) != (\d+)")
_BOILERPLATE = ("The error above occurred when calling torch.export.export", "For more information, run with")


def reason(e: Exception) -> str:
    """torch.export's message without its boilerplate, every line kept."""
    lines = []
    for line in str(e).splitlines():
        line = line.strip()
        for junk in _BOILERPLATE:
            if junk in line:
                line = line[: line.index(junk)].strip()
        if line:
            lines.append(line)
    return "\n  ".join(lines)


_DIM = type(Dim("T"))


def _is_dim(x) -> bool:
    return isinstance(x, _DIM)


def _raise_min(spec, lows: dict[str, int]):
    """`spec` with the Dims named in `lows` starting at (at least) those values."""
    def fix(x):
        if _is_dim(x) and x.__name__ in lows:
            hi = x.max if isinstance(x.max, int) and x.max < 2**62 else None
            lo = max(lows[x.__name__], x.min if isinstance(x.min, int) else 0)
            return Dim(x.__name__, min=lo, **({"max": hi} if hi is not None else {}))
        return x
    return pytree.tree_map(fix, spec, is_leaf=_is_dim)


def _retry_spec(message: str, spec, specialise: bool = True):
    """A narrower spec that avoids the violated guards, or None when there is none to try;
    torch's suggested fixes (which may make a dim a constant) only with `specialise`."""
    if spec is None or "Constraints violated" not in message:
        return None
    named = re.findall(r"Constraints violated \(([^)]+)\)", message)
    guards = _SHORT_GUARD.findall(message)
    if guards and named:
        low = max(int(k) + int(v) + 1 for k, v in guards)  # T != k + v for every guard: start above
        return _raise_min(spec, {n.strip(): low for n in named[0].split(",")})
    if not specialise:
        return None
    from torch.export.dynamic_shapes import refine_dynamic_shapes_from_suggested_fixes

    try:  # it parses the message itself, which must end with the suggested fixes
        refined = refine_dynamic_shapes_from_suggested_fixes(message.split("\n\nThe error above")[0], spec)
    except Exception:  # torch found no fix to suggest
        return None
    leaves = pytree.tree_leaves(refined, is_leaf=_is_dim)
    if any(_is_dim(d) and type(d) is not _DIM for d in leaves):
        return None  # a derived dim (T = 2 * _T): the IR's dims are plain ranges, so refuse with the reason
    return refined


def export(module: torch.nn.Module, args: tuple, spec, specialise: bool = True) -> torch.export.ExportedProgram:
    """torch.export.export (non-strict) of `module` on `args` with dynamic dims `spec`; a
    violated guard is retried narrower (torch's own fixes only with `specialise`)."""
    try:
        return torch.export.export(module, args, dynamic_shapes=spec, strict=False)
    except Exception as e:
        first = e
    narrower = _retry_spec(str(first), spec, specialise)
    if narrower is not None:
        try:
            return torch.export.export(module, args, dynamic_shapes=narrower, strict=False)
        except Exception as e:
            raise CaptureError(f"torch.export failed: {type(first).__name__}: {reason(first)}\n  and with the "
                               f"range narrowed to avoid it: {type(e).__name__}: {reason(e)}") from e
    raise CaptureError(f"torch.export failed: {type(first).__name__}: {reason(first)}") from first
