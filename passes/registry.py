"""The pass registry: every pass by name, with its options and their defaults.

A pass is a function `fn(graph, **options) -> {rule name: sites}` that edits `graph` in
place; `register_pass` names it. Most passes are a list of `Rule`s handed to
`apply_rules` (driver.py); `rule_pass` registers exactly that. A pipeline step names a pass
and optionally its options: "chunk-delta-rule{chunk_size=32}".
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from ..ir import Graph
from ..ir.text import parse_value, split_top
from ..registry import Registry
from .driver import Rule, apply_rules


@dataclass
class Pass:
    name: str
    fn: Callable[..., Counter | dict]
    doc: str
    options: dict = field(default_factory=dict)  # name -> default


PASSES: Registry = Registry("pass")


def register_pass(name: str, *, replace: bool = False, **options):
    """Decorator: register `fn(graph, **options) -> {rule: sites}` as pass `name`; `options`
    are the pass's options with their defaults. A second registration of `name` needs
    `replace=True` (or `k3c.registry.scope()` around the first)."""

    def deco(fn):
        doc = (fn.__doc__ or "").strip().splitlines()
        PASSES.add(name, Pass(name, fn, doc[0] if doc else "", dict(options)), replace=replace)
        return fn

    return deco


def rule_pass(name: str, rules: list[Rule], doc: str, *, replace: bool = False) -> Pass:
    """Register a pass that is just `rules` applied to a fixed point."""

    def fn(graph: Graph) -> Counter:
        return apply_rules(graph, rules)

    fn.__doc__ = doc
    register_pass(name, replace=replace)(fn)
    return PASSES[name]


def parse_step(step: str | tuple[str, dict]) -> tuple[str, dict]:
    """"name" or "name{k=v, ...}" or (name, {k: v}) -> (name, options), checked."""
    if isinstance(step, tuple):
        name, opts = step[0], dict(step[1])
    else:
        m = re.fullmatch(r"\s*([\w\-]+)\s*(?:\{(.*)\})?\s*", step)
        if not m:
            raise ValueError(f"malformed pass {step!r} (expected 'name' or 'name{{key=value, ...}}')")
        name, opts = m.group(1), {}
        for item in split_top(m.group(2) or ""):
            k, eq, v = item.partition("=")
            if not eq:
                raise ValueError(f"malformed pass option {item!r} in {step!r} (expected key=value)")
            opts[k.strip()] = parse_value(v, {})
    if name not in PASSES:
        raise ValueError(f"unknown pass {name!r}; known: {', '.join(sorted(PASSES))}")
    bad = sorted(set(opts) - set(PASSES[name].options))
    if bad:
        known = ", ".join(PASSES[name].options) or "none"
        raise ValueError(f"pass {name!r} has no option(s) {bad}; its options: {known}")
    return name, opts


def format_step(name: str, opts: dict) -> str:
    """The text form of a step: "name" or "name{k=v, ...}" (what parse_step reads back)."""
    from ..ir.text import format_value

    if not opts:
        return name
    return name + "{" + ", ".join(f"{k}={format_value(v)}" for k, v in opts.items()) + "}"
