"""Registries of k3c: the op table, the passes, the pipelines and each backend's lowerings.

Every registry is a `Registry` (a dict that refuses a second registration of a name unless
asked to replace it), and `scope()` undoes whatever was registered inside it:

    with k3c.registry.scope():
        defop("my_op", ...)                       # gone again after the block
        register_pass("my-pass")(fn)

A script that is run twice in one process (a notebook cell, a test) passes `replace=True`
to its registrations instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_ALL: list[Registry] = []


class Registry(dict):
    """A name -> value table; `add` refuses a name already there unless `replace=True`.

    An entry added with `builtin=True` (k3c's own, registered when a module loads) outlives
    a `scope()` it happens to be loaded in; a user's registration does not."""

    def __init__(self, what: str):
        super().__init__()
        self.what = what
        self.builtins: dict[str, Any] = {}
        _ALL.append(self)

    def add(self, name: str, value: Any, *, replace: bool = False, builtin: bool = False) -> Any:
        if name in self and not replace:
            raise ValueError(f"{self.what} {name!r} is registered already; pass replace=True to replace it")
        self[name] = value
        if builtin:
            self.builtins[name] = value
        return value

    def restore(self, snapshot: dict) -> None:
        """Back to `snapshot`, keeping the built-in entries loaded since it was taken."""
        late = {k: v for k, v in self.builtins.items() if k not in snapshot}
        self.clear()
        self.update(snapshot)
        self.update(late)


@contextmanager
def scope() -> Iterator[None]:
    """Registrations made inside the block (ops, passes, pipelines, lowerings) are undone at
    its end, and anything they replaced comes back."""
    saved = [(r, dict(r)) for r in _ALL]
    try:
        yield
    finally:
        for r, snapshot in saved:
            r.restore(snapshot)


__all__ = ["Registry", "scope"]
