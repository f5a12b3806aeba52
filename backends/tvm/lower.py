"""IR graphs -> one Relax `IRModule` built with `relax.BlockBuilder`.

Each entry graph ("prefill", "decode" or "forward") becomes a Relax function of that name:

    prefill(input_ids, <weights...>) -> (logits, <state...>)
    decode(input_ids, <state...>, <weights...>) -> (logits, <state...>)

The graph inputs come first, in the graph's order, then the weights: every entry takes the
same weight list (all weights of all entries, sorted by name), and each function carries
`num_input` = its number of graph inputs. Weights are parameters, not constants, so the
compiled library holds no weight data: the runner passes them in (after the one-time
`transform_params` that the build lifts out, which pre-transposes GEMM weights).
"""

from __future__ import annotations

import re

import sympy
from tvm import relax

from ...ir import Graph, Node, named_inputs
from .. import tables as L
from .context import LowerContext


class LoweringError(Exception):
    """A node whose lowering failed: names the op, the value and the model line."""

    def __init__(self, node: Node, error: Exception):
        where = f" at {node.loc}" if node.loc else ""
        super().__init__(f"tvm: lowering {node.op} (%{node.outputs[0]}){where} failed: {error}")


def var_name(value: str) -> str:
    """A Relax/TIR-friendly name for an IR value name."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", value)
    return name if name[:1].isalpha() or name[:1] == "_" else "v_" + name


def weight_names(graphs: dict[str, Graph]) -> list[str]:
    return sorted({w for g in graphs.values() for w in g.weights})


def weight_types(graphs: dict[str, Graph]) -> dict:
    out = {}
    for g in graphs.values():
        for w in g.weights:
            out.setdefault(w, g.types[w])
    return out


def _check_dims_bound(graph: Graph) -> None:
    """Relax learns a dim from an input whose shape has it on its own: say which one is missing."""
    plain = {d.name for n in graph.inputs for d in graph.types[n].shape if isinstance(d, sympy.Symbol)}
    for name in graph.dims:
        if name not in plain:
            raise ValueError(f"tvm: dim {name} of {graph.name} is not the size of any input axis on its own "
                             f"(only inside expressions), so the compiled function could not learn it")


def relax_inputs(node: Node, values: dict[str, relax.Expr]) -> dict:
    """The node's inputs as keywords named by its op's spec: Relax values (a list for a variadic
    input, None for an absent optional one)."""
    return {name: [values[v] for v in value] if isinstance(value, list) else None if value is None else values[value]
            for name, value in named_inputs(node).items()}


def lower_graph(bb: relax.BlockBuilder, graph: Graph, entry: str, weights: list[str], wtypes: dict,
                target: str, options: dict | None = None, kernels: dict | None = None) -> None:
    """Add the Relax function `entry` computing `graph` to the BlockBuilder's module.

    `kernels` (key -> GlobalVar) lets the entries of one module share their TensorIR kernels.
    """
    _check_dims_bound(graph)
    ctx = LowerContext(bb, graph, target, options, kernels)
    params = [relax.Var(var_name(n), ctx.relax_type(graph.types[n])) for n in graph.inputs]
    params += [relax.Var(var_name(w), ctx.relax_type(wtypes[w])) for w in weights]
    values: dict[str, relax.Expr] = dict(zip(list(graph.inputs) + weights, params))
    table = L.load("tvm")
    with bb.function(entry, params, attrs={"num_input": len(graph.inputs)}):
        with bb.dataflow():
            for node in graph.nodes:
                if node.op not in table:
                    raise LoweringError(node, KeyError(f"no tvm lowering for op {node.op!r}"))
                try:
                    outs = table[node.op].fn(ctx, node, **relax_inputs(node, values))
                except Exception as e:
                    raise LoweringError(node, e) from e
                outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
                for name, expr in zip(node.outputs, outs):
                    values[name] = expr if isinstance(expr, relax.Var) else bb.emit(expr, var_name(name))
            out = bb.emit_output(relax.Tuple([values[v] for v in graph.output_values]))
        bb.emit_func_output(out)


def lower_module(graphs: dict[str, Graph], target: str = "llvm", options: dict | None = None):
    """The Relax IRModule of all entries (before the build pipeline)."""
    bb = relax.BlockBuilder()
    weights, wtypes = weight_names(graphs), weight_types(graphs)
    kernels: dict = {}
    for entry, graph in graphs.items():
        lower_graph(bb, graph, entry, weights, wtypes, target, options, kernels)
    return bb.get()
