"""Source locations of exported nodes: the user's line, not torch's internals."""

from __future__ import annotations

import re
from pathlib import Path

_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_PKG_ROOT = Path(__file__).resolve().parent.parent  # the folder holding models/, kernels/, ...
_TORCH_ROOT = Path(__import__("torch").__file__).resolve().parent.as_posix() + "/"
_INTERNAL = (_TORCH_ROOT, Path(__file__).resolve().parent.as_posix() + "/")


def user_frame(stack_trace: str | None) -> tuple[str, int, str] | None:
    """The innermost frame of `stack_trace` that belongs to model code: (path, line, code)."""
    if not stack_trace:
        return None
    lines = stack_trace.strip().splitlines()
    best = None
    for i, line in enumerate(lines):
        m = _FRAME.search(line)
        if not m:
            continue
        path = m.group(1)
        if Path(path).resolve().as_posix().startswith(_INTERNAL):
            continue
        code = lines[i + 1].strip() if i + 1 < len(lines) else ""
        best = (path, int(m.group(2)), code)
    return best


def short_path(path: str) -> str:
    p = Path(path)
    for root in (_PKG_ROOT, Path.cwd()):
        try:
            return p.resolve().relative_to(root).as_posix()
        except ValueError:
            continue
    return p.as_posix()


def location(stack_trace: str | None) -> str | None:
    """`models/kda_layer.py:73` for the innermost model frame of a node's stack trace."""
    frame = user_frame(stack_trace)
    return f"{short_path(frame[0])}:{frame[1]}" if frame else None


def describe(stack_trace: str | None) -> str:
    """A location with its line of code, for error messages."""
    frame = user_frame(stack_trace)
    if not frame:
        return "(no source line recorded)"
    return f"{short_path(frame[0])}:{frame[1]}: {frame[2]}"
