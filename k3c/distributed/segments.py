"""A rank's graph cut at its collectives: the segments a backend lowers, and the plan that runs
them with the collectives between (through the rank's communicator: torch.distributed in a
rank process, the simulator's in one).

    plan = split(graph)          # [Segment | Node]: the pieces in order
    outs = run_plan(plan, graph, run_segment, inputs)

A segment is an ordinary graph: its inputs are the values it reads that came before it (the
entry's inputs, earlier segments' results, the collectives' results), its outputs those of its
values that something after it reads. Each is lowered as an entry `{entry}_s{i}` of the rank's
artifact, so every backend runs it as it runs any graph.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import sympy
import torch

from ..ir import Graph
from ..ir import dims as D
from ..ir.graph import Node
from ..ir.ops import OPS


@dataclass
class Segment:
    entry: str           # its name in the rank's artifact
    inputs: list[str]
    outputs: list[str]


def is_collective(node: Node) -> bool:
    return "collective" in OPS[node.op].families


def split(graph: Graph, entry: str) -> tuple[list[Segment | Node], dict[str, Graph]]:
    """The pieces of `graph` in order (segments and collective nodes) and each segment's graph."""
    runs: list[list[Node] | Node] = [[]]
    for n in graph.nodes:
        if is_collective(n):
            runs += [n, []]
        else:
            runs[-1].append(n)
    later: list[set[str]] = []  # what the pieces after each one read
    needed = set(graph.output_values)
    for piece in reversed(runs):
        later.append(set(needed))
        for n in (piece if isinstance(piece, list) else [piece]):
            needed.update(n.inputs)
    later.reverse()
    producers = graph.producers()
    fixed = _fixed_values(graph)
    plan: list[Segment | Node] = []
    graphs: dict[str, Graph] = {}
    before: list[str] = list(graph.inputs)  # the values there are when a piece starts
    for piece, after in zip(runs, later):
        if isinstance(piece, Node):
            plan.append(piece)
            before += piece.outputs
            continue
        if not piece:
            continue
        # a value made from weights alone (a constant, a folded scalar) is made again where it
        # is read rather than handed across: it has no dims a segment could bind
        need = [i for n in piece for i in n.inputs if i in fixed and i not in {o for m in piece for o in m.outputs}]
        again: list[Node] = []
        while need:
            v = need.pop()
            p = producers[v]
            if p not in again:
                again.append(p)
                need += [i for i in p.inputs if i in fixed]
        piece = [n for n in graph.nodes if n in again] + piece
        made = {o for n in piece for o in n.outputs}
        ins: list[str] = []
        for n in piece:
            ins += [i for i in n.inputs if i not in made and i not in graph.weights and i not in ins]
        outs = [o for n in piece for o in n.outputs if o in after]
        ins += _binders(graph, piece, ins, before)
        before += [o for n in piece for o in n.outputs]
        name = f"{entry}_s{len(graphs)}"
        g = graph.copy()
        g.name, g.nodes, g.inputs, g.outputs = f"{graph.name}.s{len(graphs)}", [
            Node(n.op, list(n.inputs), list(n.outputs), dict(n.attrs), dict(n.meta)) for n in piece], ins, \
            [(o, o) for o in outs]
        g.meta = {**graph.meta, "entry": name, "segment_of": entry}
        g.prune_types()
        used = {str(d) for t in g.types.values() for x in t.shape if not isinstance(x, int)
                for d in getattr(x, "free_symbols", ())}
        g.dims = {k: v for k, v in g.dims.items() if k in used}  # a segment binds only its own dims
        graphs[name] = g
        plan.append(Segment(name, ins, outs))
    return plan, graphs


def _binders(graph: Graph, piece: list[Node], ins: list[str], before: list[str]) -> list[str]:
    """Earlier values a segment takes only for their sizes: a dim its nodes use that none of
    its inputs holds as an axis of its own (B and T after a collective that returns [B*T, D])
    is bound from the first earlier value that does (the entry's inputs first)."""
    def bare(names):
        return {d for v in names for d in graph.types[v].shape if isinstance(d, sympy.Symbol)}

    used = {d for n in piece for v in n.inputs + n.outputs for x in graph.types[v].shape
            if not isinstance(x, int) for d in x.free_symbols}
    missing, extra = used - bare(ins), []
    for v in before:
        if not missing:
            break
        if v not in ins and v not in graph.weights and bare([v]) & missing:
            extra.append(v)
            missing -= bare([v])
    return extra


def _fixed_values(graph: Graph) -> set[str]:
    """Values computed from weights and attributes only (no input, no collective upstream)."""
    fixed: set[str] = set()
    for n in graph.nodes:
        if not is_collective(n) and all(i in fixed or i in graph.weights for i in n.inputs):
            fixed.update(n.outputs)
    return fixed


def run_collective(node: Node, env: dict[str, torch.Tensor]) -> None:
    """One collective node by its reference (which calls the running rank's communicator)."""
    spec = OPS[node.op]
    outs = spec.ref(*[env[i] for i in node.inputs], **spec.full_attrs(node.attrs))
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    env.update(zip(node.outputs, outs))


def run_plan(plan: list[Segment | Node], graph_inputs: list[str], graph_outputs: list[str],
             run_segment: Callable[[str, list[torch.Tensor]], list[torch.Tensor]],
             inputs: list[torch.Tensor], timings: dict[str, float] | None = None) -> list[torch.Tensor]:
    """Run the pieces in order; `timings` (when given) gathers seconds in segments and collectives."""
    import time

    env = dict(zip(graph_inputs, inputs))
    for piece in plan:
        t0 = time.perf_counter()
        if isinstance(piece, Segment):
            env.update(zip(piece.outputs, run_segment(piece.entry, [env[i] for i in piece.inputs])))
            kind = "segments"
        else:
            run_collective(piece, env)
            kind = "collectives"
        if timings is not None:
            timings[kind] = timings.get(kind, 0.0) + time.perf_counter() - t0
    return [env[v] for v in graph_outputs]


def plan_to_json(plan: list[Segment | Node]) -> list[dict]:
    return [{"segment": p.entry, "inputs": p.inputs, "outputs": p.outputs} if isinstance(p, Segment)
            else {"collective": p.op, "inputs": p.inputs, "outputs": p.outputs,
                  "attrs": {k: str(v) if isinstance(v, sympy.Basic) else v for k, v in p.attrs.items()}}
            for p in plan]


def plan_from_json(rows: list[dict]) -> list[Segment | Node]:
    return [Segment(r["segment"], r["inputs"], r["outputs"]) if "segment" in r
            else Node(r["collective"], r["inputs"], r["outputs"], _attrs(r["collective"], r["attrs"])) for r in rows]


def _attrs(op: str, attrs: dict) -> dict:
    """A collective's attributes as the IR holds them: its dims (the rows an all-to-all brings)
    as dim expressions again."""
    kinds = {k: a.kind for k, a in OPS[op].attr_specs.items()}
    return {k: D.parse(v, {n: D.sym(n) for n in re.findall(r"[A-Za-z_]\w*", v)})
            if kinds.get(k) in ("dim", "rows") and isinstance(v, str) else v for k, v in attrs.items()}
