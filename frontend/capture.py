"""`k3c.capture`: torch.export with dynamic batch and sequence dims -> k3c IR.

Entries of a zoo model: `prefill` (input_ids [B, T] -> logits, state...), `decode`
(input_ids [B, 1] and the state -> logits, new state), `extend` (input_ids [B, T] and the
state -> logits, new state: T more tokens onto P cached ones) and `forward` (-> logits). Any other
nn.Module is captured through its `forward`, its inputs named by its parameters, its dynamic
dims from `dynamic_shapes=` (torch.export's form), `dims=` (named: `{"x": "N _"}`) or the
default for `[B, T, ...]` modules; the graph's meta says which it took (frontend/dims.py).

With `max_context=N` the zoo entries are the serving forms: prefill takes (input_ids, lengths)
of right-padded prompts (T <= N) and returns every cache at capacity [B, N, ...] and the
state's `positions`; decode takes that state (N static, only B dynamic) and writes one row a
sequence, each at its own position.
"""

from __future__ import annotations

import time

import sympy
import torch
from torch.export import Dim
from torch.utils import _pytree as pytree

from ..errors import CaptureError, UsageError
from ..ir import Graph, verify
from . import dims as D
from .export import export
from .source import describe
from .table import builders
from .translate import Translator, UnsupportedOpError


class _Entry(torch.nn.Module):
    """A zoo model's prefill/decode/forward as the `forward` that torch.export traces."""

    def __init__(self, model: torch.nn.Module, entry: str, max_context: int | None = None):
        super().__init__()
        self.m, self.entry, self.max_context = model, entry, max_context

    def forward(self, input_ids, state=None, lengths=None):
        if self.entry == "decode":
            return self.m.decode(input_ids, state)
        if self.entry == "extend":  # the serving form takes each row's real tokens too
            return self.m.extend(input_ids, state, lengths)
        if self.max_context is not None:  # the serving prefill: `state` is the prompts' lengths
            return self.m.prefill(input_ids, lengths=state, max_context=self.max_context)
        return getattr(self.m, self.entry)(input_ids)


def _path_name(path) -> str:
    parts = []
    for k in path:
        if isinstance(k, pytree.MappingKey):
            parts.append(str(k.key))
        elif isinstance(k, pytree.SequenceKey):
            parts.append(str(k.idx))
        else:
            parts.append(str(k).strip(".[]'\""))
    return ".".join(parts)


def _names(tree, default: str) -> list[str]:
    leaves = pytree.tree_flatten_with_path(tree)[0]
    names = [_path_name(p) for p, _ in leaves]
    return [n if n else default for n in names]


def _example_decode_state(model, input_ids: torch.Tensor):
    """A state for a decode example: prefill 3 tokens (so cache dims are not 0 or 1)."""
    B = input_ids.shape[0]
    prefix = torch.zeros(B, 3, dtype=input_ids.dtype, device=input_ids.device)
    with torch.no_grad():
        return model.prefill(prefix)[1]


def _growing_dims(model, input_ids: torch.Tensor) -> dict[str, set[int]]:
    """State dims that grow with the prefix length (KV and latent caches): compare two prefills."""
    B = input_ids.shape[0]
    dev = input_ids.device
    with torch.no_grad():
        a = model.prefill(torch.zeros(B, 2, dtype=torch.long, device=dev))[1]
        b = model.prefill(torch.zeros(B, 3, dtype=torch.long, device=dev))[1]
    return {k: {i for i, (x, y) in enumerate(zip(a[k].shape, b[k].shape)) if x != y} for k in a}


def _length_bounds(model, max_context: int | None = None) -> tuple[int | None, int | None]:
    """The most tokens a prefill (T) and a decode cache (P) may hold, or None: unbounded.
    A position table (GPT-2's n_positions) bounds both, a fixed capacity the prefill; a graph
    records the bound in its dims, and every runner enforces it."""
    limit = getattr(getattr(model, "config", None), "n_positions", None)
    bounds = (None, None) if limit is None else (int(limit), int(limit) - 1)
    if max_context is not None:
        bounds = (min(max_context, bounds[0] or max_context), bounds[1])
    return bounds


def _serving_spec(model, entry: str, args: tuple, dynamic: bool, max_context: int):
    """Dynamic dims of the serving forms: B (when dynamic) everywhere, T in prefill; a fixed
    capacity is a static dim, so a decode step has no other."""
    batch = {0: Dim("B")} if dynamic else {}
    if entry == "decode":
        return (dict(batch), {k: dict(batch) for k in args[1]})
    max_t = _length_bounds(model, max_context)[0]
    if entry == "extend":
        return ({**batch, 1: Dim("T", max=max_t)}, {k: dict(batch) for k in args[1]}, dict(batch))
    return ({**batch, 1: Dim("T", max=max_t)}, dict(batch))


def _serving_args(model, args: tuple, entry: str, max_context: int) -> tuple:
    """Example inputs of a serving entry: (ids, lengths) for prefill, (ids[:, :1], state) for decode."""
    ids = args[0]
    if entry in ("decode", "extend"):
        held = max(1, min(3, max_context - 2))  # a small capacity still fits the held rows plus two new ones
        new = ids[:, :1] if entry == "decode" else ids[:, :max(2, min(ids.shape[1], max_context - held))]
        if len(args) > 1:
            state = args[1]
        else:
            prefix = torch.zeros(ids.shape[0], held, dtype=ids.dtype, device=ids.device)
            with torch.no_grad():
                state = model.prefill(prefix, max_context=max_context)[1]
        if entry == "decode":
            return (new, state)
        return (new, state, torch.full((ids.shape[0],), new.shape[1], dtype=torch.long))
    lengths = args[1] if len(args) > 1 else torch.full((ids.shape[0],), ids.shape[1], dtype=torch.long)
    return (ids, lengths)


def _dynamic_spec(model, entry: str, args: tuple, dynamic: bool):
    max_t, max_p = _length_bounds(model)
    P = Dim("P") if max_p is None else Dim("P", max=max_p)
    if entry in ("decode", "extend"):
        # the cache grows by one token a step, so its length stays dynamic even when dynamic=False
        # pins the batch (a decode entry for the example's cache length alone would run one step)
        ids, state = args
        grow = _growing_dims(model, ids) if not ids.is_meta else _meta_growing(state)
        batch = {0: Dim("B")} if dynamic else {}
        st = {k: {**batch, **{i: P for i in grow.get(k, ())}} for k in state}
        if entry == "extend":  # T new tokens onto P cached ones
            return ({**batch, 1: Dim("T") if max_t is None else Dim("T", max=max_t - 1)}, st)
        return (dict(batch), st)
    if not dynamic:
        return None
    B = Dim("B")
    T = Dim("T") if max_t is None else Dim("T", max=max_t)
    if entry in ("prefill", "forward") and hasattr(model, "prefill"):
        return ({0: B, 1: T},)
    specs = []
    for a in args:
        if isinstance(a, torch.Tensor) and a.dim() >= 2:
            specs.append({0: B, 1: T})
        elif isinstance(a, torch.Tensor) and a.dim() == 1:
            specs.append({0: B})
        else:
            specs.append(None)
    return tuple(specs)


def _module_spec(args: tuple, names: list[str], dynamic: bool, dynamic_shapes, dims, max_t):
    """(spec, how) of a module's forward: torch.export's own, the named short form, the default
    guess, or all static (frontend/dims.py)."""
    if dynamic_shapes is not None:
        return D.by_position(dynamic_shapes, names), "dynamic_shapes="
    if dims is not None:
        return D.named_spec(dims, names, args), "dims="
    if not dynamic:
        return None, "dynamic=False"
    return D.default_spec(args, max_t), "the default"


def _second_guess(err, wrapper, model, examples: tuple, spec, how: str, names: list[str]):
    """The default's T on every `[B, T, ...]` input of T's size failed: T only where an
    input's trailing sizes agree with the first such input's (another input's size may equal
    T's by chance: a head count); the graph's meta["dynamic"] says what was taken.
    Named dims, or a second guess that fails too, are an InputError with the dims= to write."""
    max_t = _length_bounds(model)[0]
    once = D.default_spec(examples, max_t, t_alike=True)
    axes = lambda sp: [sorted(e) if isinstance(e, dict) else None for e in sp]  # noqa: E731
    if how == "the default" and axes(once) != axes(spec):
        args = _widen_examples(examples, once, apart=True)
        try:
            ep = export(wrapper, args, once, specialise=False)
            return ep, once, "the default", args
        except CaptureError as e:
            if not D.is_dim_error(e, named=True):
                raise
            err, spec = e, once
    raise D.refuse(err, spec, names, examples, how, type(model).__name__, once) from None


def _flat_spec(spec) -> list:
    """The per-tensor {axis: Dim} dicts of a dynamic_shapes spec, in argument order."""
    return pytree.tree_flatten(spec, is_leaf=lambda x: isinstance(x, dict) and all(isinstance(k, int) for k in x))[0]


def _widen_examples(args: tuple, spec, apart: bool = False) -> tuple:
    """torch.export specialises a dim whose example size is 0 or 1: each dynamic dim's
    examples are repeated along it to a size >= 2. `apart` (the default guess, whose dims
    come from sizes): also to a size no static axis and no other dim has, since torch may tie
    a dim to a static size its example happens to equal (T = 2 beside H = 2). Named dims keep
    the user's sizes, so a refusal names them as given."""
    if spec is None:
        return args
    flat_args, tree = pytree.tree_flatten(args)
    flat_spec = _flat_spec(spec)
    sizes: dict[str, int] = {}
    static: set[int] = set()
    for a, dims in zip(flat_args, flat_spec):
        if isinstance(a, torch.Tensor):
            named = dims if isinstance(dims, dict) else {}
            static.update(int(n) for axis, n in enumerate(a.shape) if axis not in named)
            for axis, d in named.items():
                sizes.setdefault(getattr(d, "__name__", str(d)), int(a.shape[axis]))
    target: dict[str, int] = {}
    for name, n in sizes.items():
        taken = static | set(target.values()) | {v for k, v in sizes.items() if k != name}
        if n >= 2 and (n not in static or not apart):
            target[name] = n
            continue
        m = max(n, 2)
        while apart and m in taken:
            m += 1
        target[name] = m
    out = []
    for a, dims in zip(flat_args, flat_spec):
        if isinstance(a, torch.Tensor) and isinstance(dims, dict):
            for axis, d in dims.items():
                want = target[getattr(d, "__name__", str(d))]
                if a.shape[axis] not in (0, want):
                    a = a.index_select(axis, torch.arange(want) % a.shape[axis])
        out.append(a)
    return pytree.tree_unflatten(out, tree)


def _meta_growing(state) -> dict[str, set[int]]:
    """On the meta device nothing runs: caches are the state entries with 3+ dims named by
    their layer kind (`ckv`, `krope`, `k`, `v`), growing along dim 1."""
    return {k: {1} for k in state if k.rsplit(".", 1)[-1] in ("ckv", "krope", "k", "v")}


def capture(model: torch.nn.Module, example_inputs: tuple, dynamic: bool = True, *,
            entry: str | None = None, dynamic_shapes=None, dims: dict | None = None, name: str | None = None,
            verbose: bool = False, max_context: int | None = None) -> Graph:
    """Capture `model` with torch.export into a verified k3c Graph.

    `entry` picks the method of a zoo model: "prefill" (default), "decode" or "forward".
    For "decode", `example_inputs` is `(input_ids,)` (a state is made by a short prefill)
    or `(input_ids, state)`. `max_context` captures the serving forms (fixed-capacity caches
    of that many rows; prefill then takes `(input_ids, lengths)`). Raises UnsupportedOpError
    listing every op the frontend does not know, each with the line of model code that
    produced it.

    For a module's forward, `dynamic_shapes` is torch.export's spec (by position or by
    parameter name) and `dims` the short named form, `{"q": "B T _ _"}` or `{"x": {0: "N"}}`:
    every dim not named is static. Without either, dim 0 is B and dim 1 of `[B, T, ...]`
    inputs is T where the sizes agree; a dim torch.export will not take as named or guessed is
    an InputError naming the input, the axis and the `dims=` to write.
    """
    if not isinstance(example_inputs, tuple):
        example_inputs = (example_inputs,)
    is_lm = hasattr(model, "prefill") and hasattr(model, "decode")
    entry = entry or ("prefill" if is_lm else "forward")
    if entry not in ("prefill", "decode", "extend", "forward"):
        raise ValueError(f"entry must be 'prefill', 'decode', 'extend' or 'forward', got {entry!r}")
    if entry != "forward" and not is_lm:
        raise ValueError(f"entry {entry!r} needs a model with prefill/decode (a k3c.models model)")
    # fresh contiguous copies: a view's strides would tie its dims to the base tensor's
    args = pytree.tree_map(lambda t: t.clone(memory_format=torch.contiguous_format)
                           if isinstance(t, torch.Tensor) else t, example_inputs)
    serving = max_context is not None and is_lm and entry != "forward"
    if serving:
        args = _serving_args(model, args, entry, max_context)
    elif entry in ("decode", "extend") and len(args) == 1:
        ids = args[0][:, :1] if entry == "decode" else args[0]
        args = (ids, _example_decode_state(model, ids) if not ids.is_meta else _meta_state(model, ids))
    wrapper = _Entry(model, entry, max_context if serving else None) if is_lm else model
    if dims is not None and is_lm:
        raise UsageError("dims= names the inputs of a module's forward; a zoo model's entries have theirs "
                         "(B, T, P): pass dynamic_shapes= to override them")
    arg_names = D.input_names(model, args) if not is_lm else []
    how = None
    if not is_lm:
        spec, how = _module_spec(args, arg_names, dynamic, dynamic_shapes, dims, _length_bounds(model)[0])
    elif dynamic_shapes is not None:
        spec = dynamic_shapes
    else:
        spec = _serving_spec(model, entry, args, dynamic, max_context) if serving else \
            _dynamic_spec(model, entry, args, dynamic)
    examples, args = args, _widen_examples(args, spec, apart=how == "the default")
    t0 = time.perf_counter()
    try:  # a dim named or guessed is not narrowed to a constant behind the user's back
        ep = export(wrapper, args, spec, specialise=how not in ("dims=", "the default"))
    except CaptureError as e:
        if how in ("dims=", "the default") and D.is_dim_error(e, named=True):
            ep, spec, how, args = _second_guess(e, wrapper, model, examples, spec, how, arg_names)
        else:
            raise
    unknown = _unknown_ops(ep)
    if unknown:
        ep = ep.run_decompositions(_decompositions())
        unknown = _unknown_ops(ep)
        if unknown:
            raise UnsupportedOpError(unknown)
    with torch.no_grad():
        outputs = wrapper(*args)
    in_names = _names(args, "input") if entry != "forward" or not is_lm else ["input_ids"]
    if not is_lm:  # a module's inputs by the names of its forward's parameters
        in_names = [".".join([arg_names[int(n.split(".")[0])], *n.split(".")[1:]]) for n in in_names]
    if is_lm and serving and entry == "prefill":
        in_names = ["input_ids", "lengths"]
    elif is_lm and serving and entry == "extend":
        in_names = ["input_ids"] + [n.split(".", 1)[1] for n in in_names[1:-1]] + ["lengths"]
    elif is_lm:
        in_names = ["input_ids"] + [n.split(".", 1)[1] for n in in_names[1:]]
    out_names = _names(outputs, "output")
    if is_lm and entry != "forward":
        out_names = ["logits"] + [n.split(".", 1)[1] for n in out_names[1:]]
    elif is_lm:
        out_names = ["logits"]
    graph = Graph(name or f"{getattr(model, 'name', type(model).__name__)}.{entry}")
    symbols = _symbol_names(ep, spec, args)
    graph.dims = {n: _range(ep, s) for s, n in symbols.items()}
    Translator(ep, graph, symbols, in_names, out_names, weight_prefix="m." if is_lm else "").run(builders())
    graph.meta = {"entry": entry, "model": getattr(model, "name", type(model).__name__)}
    if serving:
        graph.meta["max_context"] = max_context
    graph.prune_types()
    if not is_lm:  # what the capture took as dynamic, and on whose word
        graph.meta["dynamic"] = D.taken(graph)
        graph.meta["dims_from"] = how
        if how == "dims=":
            D.check_named(graph, spec, arg_names)
    if verbose:
        print(f"captured {graph.name}: {len(graph.nodes)} nodes in {time.perf_counter() - t0:.1f}s")
    return verify(graph)


def _meta_state(model, ids: torch.Tensor):
    """A decode example state on the meta device, from the shapes a prefill would give."""
    with torch.no_grad():
        return model.prefill(torch.zeros(ids.shape[0], 3, dtype=torch.long, device="meta"))[1]


def _symbol_names(ep, spec, args) -> dict[sympy.Symbol, str]:
    """torch.export's shape symbols (s0, s1, ...) -> the names of the Dims that made them."""
    names: dict[sympy.Symbol, str] = {}
    user = [n for n in ep.graph.nodes if n.op == "placeholder"
            and n.name in {s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"}]
    flat_spec = _flat_spec(spec) if spec is not None else []
    for node, dims in zip(user, flat_spec):
        if not isinstance(dims, dict):
            continue
        val = node.meta["val"]
        for axis, dim in dims.items():
            s = val.shape[axis]
            if isinstance(s, torch.SymInt) and isinstance(s.node.expr, sympy.Symbol):
                names.setdefault(s.node.expr, getattr(dim, "__name__", None) or str(s.node.expr))
    return names


def _range(ep, s: sympy.Symbol) -> tuple[int, int | None]:
    vr = ep.range_constraints.get(s)
    lo = max(1, int(vr.lower)) if vr is not None and isinstance(vr.lower, sympy.Integer) else 1
    hi = int(vr.upper) if vr is not None and isinstance(vr.upper, sympy.Integer) else None
    return lo, hi


def _unknown_ops(ep) -> list[tuple[str, str]]:
    out, table = [], builders()
    for n in ep.graph.nodes:
        if n.op != "call_function" or n.target in table:
            continue
        if str(n.target).startswith("<built-in function") or "sym_size" in str(n.target):
            continue
        out.append((str(n.target), describe(n.meta.get("stack_trace"))))
    return out


def _decompositions() -> dict:
    """torch's core-ATen decompositions for every op k3c does not keep whole."""
    table, kept = torch.export.default_decompositions(), builders()
    for op in list(table):
        if op in kept:
            del table[op]
    return table
