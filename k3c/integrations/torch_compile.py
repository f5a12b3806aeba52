"""`torch.compile(model, backend="k3c")`: each graph dynamo hands over, through k3c's IR.

    compiled = torch.compile(model, backend="k3c", options={"backend": "tvm"})   # onnx by default
    compiled(x)
    k3c.integrations.torch_compile.stats      # compiles, recompiles, fallbacks and their reasons

The backend is found by name through the `torch_dynamo_backends` entry point (pyproject.toml).
Dynamo gives an FX GraphModule and example inputs in which the module's parameters (and
buffers) are inputs too, and, once a shape has changed, SymInts for its dynamic sizes. Here
the parameters and buffers become the weights of a module around the GraphModule, a SymInt is
read from the tensor dim that carries its symbol, and the tensor dims dynamo made symbolic are
the dynamic dims of the capture (a static graph is captured static: dynamo guards its shapes
and recompiles, as it does for every backend). `k3c.compile` then runs the passes and builds
the artifact of the chosen backend. A graph k3c cannot take (an op its frontend does not know,
a node the backend cannot lower) runs eagerly instead, with the reason logged and kept in
`stats.fallbacks`; a weight changed in place after compilation also sends its graph back to
eager, since the artifact holds the old values.

Options: backend ("onnx", "tvm", "reference", "triton"), flavour (onnx), target (tvm),
passes, compute.
"""

from __future__ import annotations

import copy
import logging
import shutil
import tempfile
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import K3cError, UsageError

log = logging.getLogger("k3c.torch_compile")

OPTIONS = ("backend", "flavour", "target", "passes", "compute")
DEFAULT_BACKEND = "onnx"
GRAD_REASON = ("autograd is on and an input or weight requires grad: k3c's artifacts compute no gradients "
               "(call it under torch.no_grad() or torch.inference_mode())")


@dataclass
class Stats:
    """What the backend did since the last `reset()`: graphs compiled by k3c, how many of those
    were dynamo's recompiles of a frame it had compiled before (its compile id's second number),
    and the graphs left to eager with the reason (`(graph, reason)`)."""

    compiles: int = 0
    recompiles: int = 0
    fallbacks: list[tuple[str, str]] = field(default_factory=list)
    compile_ids: list[str] = field(default_factory=list)

    def reset(self) -> None:
        self.compiles, self.recompiles = 0, 0
        self.fallbacks.clear()
        self.compile_ids.clear()


stats = Stats()


def _compile_id() -> tuple[str, bool]:
    """Dynamo's id of this compile ("frame/attempt") and whether it recompiles a frame."""
    from torch._guards import CompileContext

    cid = CompileContext.current_compile_id()
    if cid is None:
        return "?", False
    return str(cid), bool(getattr(cid, "frame_compile_id", 0))


def _is_weight(node: torch.fx.Node, example: Any) -> bool:
    if isinstance(example, torch.nn.Parameter):
        return True
    source = getattr(node.meta.get("grapharg"), "source", None)
    return source is not None and "_buffers" in source.name


def _symbol(x: Any) -> str | None:
    """The name of a SymInt that is one free symbol (`s27`); None for a size dynamo specialised."""
    if not isinstance(x, torch.SymInt):
        return None
    expr = x.node.expr
    return str(expr) if getattr(expr, "is_Symbol", False) else None


def _fold_scalars(gm: torch.fx.GraphModule, example_inputs: list) -> tuple[torch.fx.GraphModule, dict]:
    """A Python number dynamo passes as a 0-d tensor (`dynamic=True` does so with a layer
    norm's eps) is read in the graph by `.item()`, which torch.export cannot trace: each such
    read becomes the number (a copy of the graph; dynamo's own is left as it is). Returns the
    graph and {input position: number}; the runner checks the number each call."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    found = {pos: node for pos, node in enumerate(placeholders)
             if getattr(node.meta.get("grapharg"), "pass_arg_as_tensor", False)}
    if not found:
        return gm, {}
    graph = copy.deepcopy(gm.graph)
    nodes = [n for n in graph.nodes if n.op == "placeholder"]
    scalars = {}
    for pos in found:
        node, value = nodes[pos], example_inputs[pos].item()
        for user in list(node.users):
            if user.op != "call_method" or user.target != "item":
                raise _Refused(f"graph input {node.name} (a Python number) is used as a tensor by {user.name}")
            for reader in list(user.users):
                reader.args = torch.fx.node.map_arg(reader.args, lambda a, u=user, v=value: v if a is u else a)
                reader.kwargs = torch.fx.node.map_arg(reader.kwargs, lambda a, u=user, v=value: v if a is u else a)
            graph.erase_node(user)
        scalars[pos] = value
    return torch.fx.GraphModule(gm, graph), scalars


class _Graph(torch.nn.Module):
    """The GraphModule with its weights held as parameters/buffers, its tensor inputs as the
    forward's arguments and its SymInts read from those tensors' shapes."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: list):
        super().__init__()
        gm, self.scalars = _fold_scalars(gm, example_inputs)
        self.gm = gm
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        # per graph input: ("weight", name) | ("tensor", i) | ("sym", (i, axis)) | ("const", n)
        self.plan: list[tuple[str, Any]] = []
        self.weights: list[tuple[int, torch.Tensor]] = []
        tensors: list[tuple[int, Any]] = []
        for pos, (node, x) in enumerate(zip(placeholders, example_inputs)):
            if pos in self.scalars:
                self.plan.append(("const", None))  # folded into the graph: the input is unused
            elif isinstance(x, torch.Tensor) and _is_weight(node, x):
                name = f"w{pos}"
                self.register_buffer(name, x.detach())
                self.plan.append(("weight", name))
                self.weights.append((pos, x))
            elif isinstance(x, torch.Tensor):
                self.plan.append(("tensor", len(tensors)))
                tensors.append((pos, node.meta.get("example_value", x)))
            elif isinstance(x, torch.SymInt) and _symbol(x) is None and x.node.expr.is_number:
                self.plan.append(("const", int(x.node.expr)))
            elif isinstance(x, torch.SymInt):
                if _symbol(x) is None:
                    raise _Refused(f"graph input {node.name} is the size expression {x.node.expr}")
                self.plan.append(("sym", _symbol(x)))
            else:
                raise _Refused(f"graph input {node.name} is a {type(x).__name__}, not a tensor")
        self.tensor_positions = [pos for pos, _ in tensors]
        # each SymInt from the first tensor dim that carries its symbol; those dims are dynamic
        self.dynamic: list[dict[int, str]] = [{} for _ in tensors]
        where: dict[str, tuple[int, int]] = {}
        for i, (_, fake) in enumerate(tensors):
            for axis, size in enumerate(getattr(fake, "shape", ())):
                sym = _symbol(size)
                if sym is not None:
                    where.setdefault(sym, (i, axis))
                    self.dynamic[i][axis] = sym
        for k, (kind, what) in enumerate(self.plan):
            if kind == "sym":
                if what not in where:
                    raise _Refused(f"a size input ({what}) that no tensor input's shape carries")
                self.plan[k] = ("sym", where[what])

    def forward(self, *tensors):
        args = []
        for kind, what in self.plan:
            if kind == "weight":
                args.append(getattr(self, what))
            elif kind == "tensor":
                args.append(tensors[what])
            elif kind == "const":
                args.append(what)
            else:
                i, axis = what
                args.append(tensors[i].shape[axis])
        return self.gm(*args)

    def dynamic_shapes(self) -> tuple:
        from torch.export import Dim

        # one entry: forward's *tensors, as torch.export binds the arguments
        return (tuple({axis: Dim(name) for axis, name in dims.items()} or None for dims in self.dynamic),)


class _Refused(K3cError):
    """A graph this backend leaves to eager (the message is the reason)."""


def _options(options: dict | None) -> tuple[str, dict]:
    options = dict(options or {})
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise UsageError(f"torch.compile(backend='k3c'): unknown option(s) {unknown}; known: {', '.join(OPTIONS)}")
    return options.pop("backend", DEFAULT_BACKEND), options


def _outputs(gm: torch.fx.GraphModule) -> bool:
    """Whether the graph returns a tuple/list (dynamo's graphs do) rather than one value."""
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    return isinstance(out, (tuple, list))


def k3c_backend(gm: torch.fx.GraphModule, example_inputs: list, options: dict | None = None, **_: Any):
    """The torch.compile backend: a callable over dynamo's inputs that builds the artifact on
    its first call (outside dynamo's own compilation, which a torch.export inside it upsets),
    or runs `gm` eagerly, with the reason recorded, where k3c cannot take the graph."""
    backend, rest = _options(options)
    cid, again = _compile_id()
    name = f"graph {cid}"
    try:
        module = _Graph(gm, list(example_inputs))
        if not _outputs(gm):
            raise _Refused("the graph does not return a tuple of tensors")
    except K3cError as err:
        return _fall_back(name, err, gm)
    stats.recompiles += again
    stats.compile_ids.append(cid)
    if again:
        log.info("k3c: %s recompiles a frame dynamo compiled before", name)
    return _Runner(module, gm, name, backend, rest)


def _reason(err: Exception) -> str:
    """One short line: the distinct ops the frontend lacks (a graph may list hundreds of nodes),
    else the error's text on one line, cut at 300 characters."""
    unknown = getattr(err, "unknown", None)
    if unknown:
        ops = list(dict.fromkeys(op for op, _ in unknown))
        more = f" and {len(ops) - 8} more" if len(ops) > 8 else ""
        return f"{len(unknown)} node(s) of ops k3c's frontend has no builder for: {', '.join(ops[:8])}{more}"
    text = " ".join(line.strip() for line in str(err).splitlines()) or type(err).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _fall_back(name: str, err: Exception, gm: torch.fx.GraphModule):
    reason = _reason(err)
    stats.fallbacks.append((name, reason))
    log.warning("k3c: %s runs eagerly: %s", name, reason)
    return gm.forward


class _Runner:
    """Dynamo's call: the tensor inputs to the artifact's forward, its outputs as a tuple."""

    def __init__(self, module: _Graph, gm: torch.fx.GraphModule, name: str, backend: str, options: dict):
        self.module, self.gm, self.name, self.backend, self.options = module, gm, name, backend, options
        self.compiled, self.eager, self.grad_said = None, None, False
        self.versions = [(pos, w, w._version) for pos, w in module.weights]
        self.scalars = list(module.scalars.items())

    def _compile(self, tensors: tuple) -> None:
        from .. import compile as k3c_compile

        out_dir = tempfile.mkdtemp(prefix="k3c-dynamo-")
        weakref.finalize(self, shutil.rmtree, out_dir, True)
        dynamic = any(self.module.dynamic)
        try:
            self.compiled = k3c_compile(self.module, self.backend, tensors, out_dir, force=True, dynamic=dynamic,
                                        dynamic_shapes=self.module.dynamic_shapes() if dynamic else None,
                                        **self.options)
        except K3cError as err:
            self.eager = _fall_back(self.name, err, self.gm)
            return
        stats.compiles += 1

    def __call__(self, *args):
        if self.eager is None and any(args[pos] is not w or w._version != v for pos, w, v in self.versions):
            self.eager = _fall_back(self.name, _Refused("a weight changed after k3c compiled the graph"), self.gm)
        if self.eager is None and any(args[pos].item() != v for pos, v in self.scalars):
            self.eager = _fall_back(self.name, _Refused("a Python number the graph takes changed after k3c "
                                                        "compiled it"), self.gm)
        tensors = tuple(args[p] for p in self.module.tensor_positions)
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            if not self.grad_said:  # this call only: under no_grad the same graph runs on k3c
                self.grad_said = True
                _fall_back(self.name, _Refused(GRAD_REASON), self.gm)
            return self.gm(*args)
        if self.eager is None and self.compiled is None:
            with torch.no_grad():
                self._compile(tensors)
        if self.eager is not None:
            return self.eager(*args)
        with torch.no_grad():
            return tuple(self.compiled.runner.run("forward", *tensors))


__all__ = ["k3c_backend", "stats", "Stats", "OPTIONS", "DEFAULT_BACKEND"]
