"""Which dims of a module's inputs are dynamic, and what the capture says it took.

A module's `forward` (anything but a zoo model's prefill/decode) gets its dynamic dims one of
three ways, the first given winning:

    dynamic_shapes=  exactly as torch.export.export takes it: a tuple in argument order or a
                     dict by parameter name, of {axis: torch.export.Dim} per tensor
    dims=            the short named form, per input by parameter name, either a string with
                     one token per axis, a name for a dynamic dim and `_` (or the size) for a
                     static one, `{"q": "B T _ _", "x": "N _"}`, or `{axis: name}`, `{"x": {0: "N"}}`.
                     The same name on several inputs is one dim; every dim not named is static.
    neither          the default for `[B, T, ...]` modules: dim 0 of a tensor input is B when it
                     has the first input's size there; dim 1 is T for `[B, T, ...]` tensors (rank
                     3 and up, or integer rank 2: token ids) when it has the first such input's
                     size there; every other dim is static. A state `[B, H, K, V]` beside
                     `q [B, T, H, K]` keeps H static; a 2-D `[N, 512]` activation has one
                     dynamic dim, N (named B).

When torch.export finds a named or guessed dim is not free (a module reshapes it to a constant,
two dims that must be equal), the capture refuses with one InputError naming the input and the
axis, and writes out the `dims=` to pass instead. The graph records what was taken in
`meta["dynamic"]` (the short form, inputs with a dynamic dim only) and `meta["dims_from"]`.
"""

from __future__ import annotations

import inspect
import re

import torch
from torch.export import Dim

from ..errors import InputError, UsageError
from ..ir import dims as D

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*$")
_ACCESS = re.compile(r"L\['([^']+)'\](?:\[[^\]]*\])*\.size\(\)\[(\d+)\]")


def input_names(module: torch.nn.Module, args: tuple) -> list[str]:
    """The parameter names of `module.forward` for the positional `args` (arg0, ... past them)."""
    try:
        params = [p.name for p in inspect.signature(module.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    return [params[i] if i < len(params) else f"arg{i}" for i in range(len(args))]


def _tokens(entry, name: str, x: torch.Tensor) -> dict[int, str]:
    """{axis: dim name} of one input's entry in `dims=`, checked against its example."""
    if isinstance(entry, str):
        toks = entry.split()
        if len(toks) != x.dim():
            raise InputError(f"dims={{{name!r}: {entry!r}}}: {len(toks)} tokens for input {name!r} of rank "
                             f"{x.dim()} {list(x.shape)}; write one per axis, a name or _ for a static one")
        entry = {}
        for axis, tok in enumerate(toks):
            if tok.isdigit():
                if int(tok) != x.shape[axis]:
                    raise InputError(f"dims: input {name!r} dim {axis} is {x.shape[axis]} in the example, "
                                     f"not {tok}")
            elif tok != "_":
                entry[axis] = tok
    if not isinstance(entry, dict):
        raise UsageError(f"dims[{name!r}] must be a string such as 'B T _' or a dict {{axis: name}}, "
                         f"got {type(entry).__name__}")
    out = {}
    for axis, dim in entry.items():
        if not isinstance(axis, int) or not -x.dim() <= axis < x.dim():
            raise InputError(f"dims: input {name!r} {list(x.shape)} has no axis {axis!r}")
        label = dim.__name__ if isinstance(dim, type(Dim("T"))) else dim
        if not isinstance(label, str) or not _NAME.match(label):
            raise InputError(f"dims: input {name!r} dim {axis}: {dim!r} is not a dim name (a letter, then "
                             f"letters, digits or _)")
        out[axis % x.dim()] = label
    return out


def named_spec(dims: dict, names: list[str], args: tuple) -> tuple:
    """The torch.export spec of the short form `dims=` (module docstring)."""
    if not isinstance(dims, dict):
        raise UsageError(f"dims= must be a dict by input name, e.g. {{'x': 'B _'}}, got {type(dims).__name__}")
    unknown = [k for k in dims if k not in names]
    if unknown:
        raise InputError(f"dims: no input named {unknown[0]!r}; the inputs are {', '.join(names)}")
    pool: dict[str, object] = {}
    spec = []
    for name, x in zip(names, args):
        if name not in dims:
            spec.append(None)
            continue
        if not isinstance(x, torch.Tensor):
            raise InputError(f"dims: input {name!r} is a {type(x).__name__}, not a tensor")
        axes = _tokens(dims[name], name, x)
        spec.append({axis: pool.setdefault(label, Dim(label)) for axis, label in axes.items()} or None)
    return tuple(spec)


def by_position(dynamic_shapes, names: list[str]):
    """torch.export's spec with a dict by parameter name put in argument order (the capture
    pairs specs with inputs by position); a tuple or list is taken as it is."""
    if isinstance(dynamic_shapes, dict):
        unknown = [k for k in dynamic_shapes if k not in names]
        if unknown:
            raise InputError(f"dynamic_shapes: no input named {unknown[0]!r}; the inputs are {', '.join(names)}")
        return tuple(dynamic_shapes.get(n) for n in names)
    return tuple(dynamic_shapes)


def default_spec(args: tuple, max_t: int | None = None, t_alike: bool = False) -> tuple:
    """The default of a module's forward: B at dim 0, T at dim 1 of `[B, T, ...]` tensors, each
    only where the example has the size the first such input has (module docstring).
    `t_alike`: T only on those whose sizes after dim 0 agree with the first such input's as
    far as both go (the second guess, when a size of another input only happens to equal T's:
    a state [B, H, K, V] beside q [B, T, H, K] at T == H)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor) and a.dim() >= 1]
    if not tensors:
        return tuple(None for _ in args)
    B = Dim("B")
    T = Dim("T") if max_t is None else Dim("T", max=max_t)
    b_size = tensors[0].shape[0]
    seq = [a for a in tensors if a.dim() >= 3 or (a.dim() == 2 and not a.is_floating_point())]
    t_size = seq[0].shape[1] if seq else None
    spec = []
    for a in args:
        d = {}
        if isinstance(a, torch.Tensor) and a.dim() >= 1 and a.shape[0] == b_size:
            d[0] = B
        if isinstance(a, torch.Tensor) and any(a is s for s in seq) and a.shape[1] == t_size \
                and (not t_alike or _alike(a.shape[1:], seq[0].shape[1:])):
            d[1] = T
        spec.append(d or None)
    return tuple(spec)


def _alike(a, b) -> bool:
    n = min(len(a), len(b))
    return tuple(a[:n]) == tuple(b[:n])


def short_form(spec_entry: dict | None, rank: int) -> str:
    """'B T _ _' of {axis: Dim} for a tensor of `rank`."""
    entry = spec_entry or {}
    return " ".join(entry[i].__name__ if i in entry else "_" for i in range(rank))


def taken(graph) -> dict[str, str]:
    """What the graph's inputs hold as dynamic, in the short form (inputs with a dynamic dim)."""
    out = {}
    for name in graph.inputs:
        t = graph.types[name]
        toks = ["_" if isinstance(d, int) else D.to_str(d) for d in t.shape]
        if any(tok != "_" for tok in toks):
            out[name] = " ".join(toks)
    return out


def refuse(err: Exception, spec: tuple, names: list[str], args: tuple, how: str, module: str,
           fallback: tuple) -> InputError:
    """The one-line InputError of a capture whose dynamic dims torch.export would not take:
    the input and axis it names, and the `dims=` to write instead (`spec` without the culprits,
    or `fallback` when torch named none)."""
    message = str(err)
    hits = list(dict.fromkeys((n, int(a)) for n, a in _ACCESS.findall(message) if n in names))
    spec_of = dict(zip(names, spec))
    culprits = [(n, a) for n, a in hits if isinstance(spec_of.get(n), dict) and a in spec_of[n]]
    if not culprits:  # torch named a Dim ("Constraints violated (T)"): every input carrying it
        violated = set(re.findall(r"Constraints violated \(([^)]+)\)", message)[:1][0].replace(" ", "").split(",")) \
            if "Constraints violated (" in message else set()
        culprits = [(n, a) for n in names if isinstance(spec_of.get(n), dict)
                    for a, d in spec_of[n].items() if d.__name__ in violated]
    reason = _reason(message, err)
    fixed = {n: ({a: d for a, d in e.items() if (n, a) not in culprits} if isinstance(e, dict) else None)
             for n, e in spec_of.items()}
    if not culprits or not any(fixed.values()):  # nothing left to keep: the default's guess
        fixed = dict(zip(names, fallback))
    ranks = {n: x.dim() for n, x in zip(names, args) if isinstance(x, torch.Tensor)}
    suggestion = {n: short_form(e, ranks[n]) for n, e in fixed.items() if n in ranks}
    groups: dict[tuple, list[str]] = {}
    for n, a in culprits:
        groups.setdefault((spec_of[n][a].__name__, a, _size(args, names, n, a)), []).append(repr(n))
    where = "; ".join(f"{d} = dim {a} (size {size}) of input {', '.join(ins)}" for (d, a, size), ins in groups.items())
    said = f"{how} took {where}" if where else f"the dims of {how} ({taken_of(spec, names, args)})"
    return InputError(f"capture of {module}: {said}, which torch.export refuses ({reason}); name the "
                      f"dynamic dims, e.g. dims={suggestion}")


def _reason(message: str, err: Exception) -> str:
    """torch's reason in a few words: the dim it fixed, the sizes it found unequal, or its first line."""
    fixed = re.search(r"You marked (\w+) as dynamic but your code specialized it to be a constant \((-?\d+)\)",
                      message)
    if fixed:
        return f"the module fixes {fixed.group(1)} at {fixed.group(2)}"
    line = next((ln.strip() for ln in message.splitlines() if "L['" in ln), None) or \
        (message.splitlines()[0].strip() if message.strip() else type(err).__name__)
    line = line.removeprefix("torch.export failed: ").removeprefix("- ")
    return line if len(line) <= 160 else line[:157] + "..."


def taken_of(spec: tuple, names: list[str], args: tuple) -> str:
    """The short form of a spec, for a message."""
    return ", ".join(f"{n}: {short_form(e, x.dim())!r}" for n, e, x in zip(names, spec, args)
                     if isinstance(e, dict) and isinstance(x, torch.Tensor))


def _size(args: tuple, names: list[str], name: str, axis: int) -> int:
    return int(args[names.index(name)].shape[axis])


def is_dim_error(err: Exception, named: bool = False) -> bool:
    """Whether torch.export refused the dynamic dims (rather than the module's code); with
    `named`, also a check in the module that met a symbolic size (`sizes 1 and s85 differ`)."""
    message = str(err)
    if _ACCESS.search(message) or "Constraints violated" in message or "specializ" in message:
        return True
    return named and bool(re.search(r"\bs\d+\b", message))


def check_named(graph, spec: tuple, names: list[str]) -> None:
    """A dim named in `dims=` must have stayed dynamic (torch.export's narrowing retry may fix
    one to the example's size): else an InputError naming it."""
    for name, entry in zip(names, spec):
        if not isinstance(entry, dict) or name not in graph.types:
            continue
        shape = graph.types[name].shape
        for axis, dim in entry.items():
            if isinstance(shape[axis], int):
                raise InputError(f"dims: input {name!r} dim {axis} was named {dim.__name__}, but the module "
                                 f"fixes it at {shape[axis]} (torch.export specialised it): leave it static")
