"""A manifest read as data: the bounded checks of every field an artifact's loader uses.

An artifact may come from someone else, so its manifest is untrusted input. Nothing in it is
evaluated: a dim is parsed by k3c's own bounded parser (k3c.ir.dim_parser), never by
sympify; a field of the wrong kind, size or range is a ManifestError naming the file and the
field; a file it names must be a plain relative path that stays inside the folder.

    f = Fields(path)                       # path: the manifest, for the messages
    f.obj(m, "entries")  f.text(v, "entries.decode.file")  f.integer(v, "opset", lo=1)
    f.file(v, "weights") -> str            # "a/b.bin", never "../x", "/x" or "a/./b"
    f.dims(m["dims"], "dims") -> {name: (lo, hi)};  f.dim(text, where, symbols) -> int | sympy.Expr
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import NoReturn

import sympy

from ..errors import ManifestError
from ..ir import dims as D

MAX_ITEMS = 100_000  # entries of any list or object: far above a real artifact, bounds the work
MAX_TEXT = 4096
MAX_INT = 1 << 62
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")  # a dim's name
_SHA256 = re.compile(r"[0-9a-f]{64}")


class Fields:
    """The checks of one manifest's fields; every refusal names `path` and the field."""

    def __init__(self, path: str | Path):
        self.path = path

    def fail(self, field: str, what: str) -> NoReturn:
        raise ManifestError(f"{self.path}: field {field!r} {what}")

    def obj(self, value: object, field: str, *, keys: tuple[str, ...] = ()) -> dict:
        """`value` as a JSON object (string keys), with `keys` present."""
        if not isinstance(value, dict):
            self.fail(field, f"must be an object, got {_kind(value)}")
        if len(value) > MAX_ITEMS:
            self.fail(field, f"has {len(value)} members (at most {MAX_ITEMS})")
        for k in keys:
            if k not in value:
                self.fail(f"{field}.{k}" if field else k, "is missing")
        return value

    def seq(self, value: object, field: str) -> list:
        if not isinstance(value, list):
            self.fail(field, f"must be a list, got {_kind(value)}")
        if len(value) > MAX_ITEMS:
            self.fail(field, f"has {len(value)} items (at most {MAX_ITEMS})")
        return value

    def text(self, value: object, field: str, *, choices: tuple[str, ...] = ()) -> str:
        if not isinstance(value, str):
            self.fail(field, f"must be a string, got {_kind(value)}")
        if not value or len(value) > MAX_TEXT or not value.isprintable():
            self.fail(field, f"must be a printable string of 1 to {MAX_TEXT} characters")
        if choices and value not in choices:
            self.fail(field, f"is {value[:40]!r}; expected {' or '.join(repr(c) for c in choices)}")
        return value

    def optional_text(self, value: object, field: str) -> str | None:
        return None if value is None else self.text(value, field)

    def integer(self, value: object, field: str, *, lo: int = 0, hi: int = MAX_INT) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(field, f"must be an integer, got {_kind(value)}")
        if not lo <= value <= hi:
            self.fail(field, f"is {value}; expected an integer in [{lo}, {hi}]")
        return value

    def names(self, value: object, field: str) -> list[str]:
        """A list of distinct names (inputs, outputs, weights)."""
        items = [self.text(v, f"{field}[{i}]") for i, v in enumerate(self.seq(value, field))]
        if len(set(items)) != len(items):
            self.fail(field, "names an item twice")
        return items

    def file(self, value: object, field: str) -> str:
        """A file name relative to the artifact folder that cannot leave it."""
        name = self.text(value, field)
        parts = name.split("/")
        if "\\" in name or "\0" in name or any(p in ("", ".", "..") for p in parts) or len(parts) > 8:
            self.fail(field, f"is {name[:80]!r}; a file of an artifact is a plain relative path inside its folder")
        return name

    def digest(self, value: object, field: str) -> str:
        if not isinstance(value, str) or not _SHA256.fullmatch(value):
            self.fail(field, "must be a SHA-256 digest (64 lowercase hex digits)")
        return value

    def dim_name(self, value: object, field: str) -> str:
        if not isinstance(value, str) or not _NAME.fullmatch(value):
            self.fail(field, f"is {str(value)[:40]!r}; a dim's name is an identifier of at most 64 characters")
        return value

    def dims(self, value: object, field: str) -> dict[str, tuple[int, int | None]]:
        """{name: [lo, hi]} (hi null: unbounded) -> {name: (lo, hi)}."""
        out = {}
        for name, rng in self.obj(value, field).items():
            self.dim_name(name, f"{field} key")
            where = f"{field}.{name}"
            rng = self.seq(rng, where)
            if len(rng) != 2:
                self.fail(where, "must be [lo, hi]")
            lo = self.integer(rng[0], f"{where}[0]")
            hi = None if rng[1] is None else self.integer(rng[1], f"{where}[1]", lo=lo)
            out[name] = (lo, hi)
        return out

    def dim(self, value: object, field: str, symbols: Mapping[str, sympy.Symbol]) -> D.Dim:
        """An int, or a dim expression over `symbols` parsed with bounded work."""
        if isinstance(value, int) and not isinstance(value, bool):
            return self.integer(value, field)
        text = self.text(value, field)
        if text in symbols:  # most dims are a bare name: no parse needed
            return symbols[text]
        try:
            d = D.parse(text, symbols)
        except (ValueError, TypeError, ArithmeticError) as err:
            self.fail(field, f"is not a dim k3c reads: {err}")
        if isinstance(d, int) and not 0 <= d <= MAX_INT:
            self.fail(field, f"is {d}; a dim is an integer in [0, {MAX_INT}]")
        return d

    def shape(self, value: object, field: str, symbols: Mapping[str, sympy.Symbol]) -> list[D.Dim]:
        items = self.seq(value, field)
        if len(items) > 16:
            self.fail(field, f"has {len(items)} dims (at most 16)")
        return [self.dim(d, f"{field}[{i}]", symbols) for i, d in enumerate(items)]

    def limits(self, value: object, field: str, ranks: Mapping[str, int]) -> dict:
        """An entry's `limits` (backends/contract.py) over its inputs (name -> rank)."""
        v = self.obj(value, field)
        extra = set(v) - {"ids", "positions", "lengths"}
        if extra:
            self.fail(field, f"has unknown member(s) {sorted(extra)[:4]}")

        def member(name: object, where: str, rank: int = 1) -> str:
            if not isinstance(name, str) or ranks.get(name, 0) < rank:
                self.fail(where, f"names {str(name)[:40]!r}, not an input of rank >= {rank} of the entry")
            return name

        out: dict = {"ids": {}, "positions": {}, "lengths": {}}
        for name, rows in self.obj(v.get("ids", {}), f"{field}.ids").items():
            out["ids"][member(name, f"{field}.ids")] = self.integer(rows, f"{field}.ids.{name}", lo=1)
        for name, pair in self.obj(v.get("positions", {}), f"{field}.positions").items():
            where = f"{field}.positions.{member(name, f'{field}.positions')}"
            if len(self.seq(pair, where)) != 2:
                self.fail(where, "must be [capacity, token input]")
            out["positions"][name] = [self.integer(pair[0], f"{where}[0]", lo=1), member(pair[1], f"{where}[1]", 2)]
        for name, pair in self.obj(v.get("lengths", {}), f"{field}.lengths").items():
            where = f"{field}.lengths.{member(name, f'{field}.lengths')}"
            if len(self.seq(pair, where)) != 2:
                self.fail(where, "must be [least, token input]")
            out["lengths"][name] = [self.integer(pair[0], f"{where}[0]", hi=1), member(pair[1], f"{where}[1]", 2)]
        return out

    def version(self, manifest: dict, fmt: str, versions: tuple[int, ...] = (1,)) -> None:
        """The manifest's `format` is `fmt` and its `format_version` (when it has one) one k3c reads."""
        got = manifest.get("format")
        if got != fmt:
            self.fail("format", f"is {str(got)[:40]!r}; this loader reads {fmt!r}")
        if "format_version" in manifest:
            v = manifest["format_version"]
            if isinstance(v, bool) or v not in versions:
                self.fail("format_version", f"is {str(v)[:20]}; this k3c reads version(s) "
                          f"{', '.join(map(str, versions))} (a newer k3c wrote it?)")


def symbols(dims: Mapping[str, object]) -> dict[str, sympy.Symbol]:
    return {n: D.sym(n) for n in dims}


def evaluate(d: D.Dim, env: Mapping[str, int], where: str) -> int:
    """The value of a parsed dim once its symbols are bound; an ArtifactError when it has none
    (a division by a dim that is 0, a symbol no input binds)."""
    try:
        return D.evaluate(d, env)
    except (KeyError, TypeError, ValueError, ArithmeticError) as err:
        raise ManifestError(f"{where}: dim {D.to_str(d)} has no value for {dict(env)} ({err})") from None


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__
