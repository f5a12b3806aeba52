"""Pipeline stages: one rank's graph (prefill or decode) cut into the consecutive stages of a
pp mesh, and what each stage receives from the one before it and sends to the one after.

A node belongs to the stage of the layers whose weights it reads (`layers.{i}.` names; the
embedding to the first stage, every other weight to the last). A node that reads no weight
runs in the first stage it can (that of what it reads), or with its first reader in a later
stage where that hands over no more values than its one result would (K3's stack of the
AttnRes bank runs with its reader, an add of two runs early), so what crosses a boundary is
for the Kimi family the hidden state, or (K3) the bank's block sums and the running partial
sum. Values made from weights
alone, or from the entry's inputs alone (shape arithmetic, a state's reshape), are made again
in each stage that reads them: every rank has the entry's inputs. A value made in stage s and
read in stage s + 2 passes through stage s + 1 (the bank grows along the pipeline), so each
stage talks to its neighbours only.

    cut = cut_stages(graph, mesh.pp, stage_layers(num_layers, mesh.pp))
    cut[s].graph, cut[s].recv, cut[s].send
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import UsageError
from ..ir import Graph
from ..ir.graph import Node
from .segments import is_collective

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass
class Stage:
    graph: Graph         # the stage's nodes; inputs: the entry's inputs it reads, then `recv` it reads
    recv: list[str]      # values the stage before hands over, in order
    send: list[str]      # values handed to the next stage, in order (made here or passed through)


def _weight_stage(name: str, layer_stage: dict[int, int], pp: int) -> int:
    m = _LAYER.search(name)
    if m:
        return layer_stage[int(m.group(1))]
    return 0 if "embed" in name else pp - 1


def cut_stages(graph: Graph, pp: int, layers: list[range]) -> list[Stage]:
    """`graph` cut into `pp` stages of the layers `layers` (one range per stage)."""
    layer_stage = {i: s for s, r in enumerate(layers) for i in r}
    weights, inputs = set(graph.weights), set(graph.inputs)
    producers = graph.producers()
    # made again wherever read: values of weights alone, and of the entry's inputs alone
    fixed: dict[str, int | None] = {}  # a weight-made value: the highest stage of the weights behind it
    shape: set[str] = set()
    for n in graph.nodes:
        if is_collective(n):
            continue
        if all(i in weights or i in fixed for i in n.inputs):
            ws = [_weight_stage(i, layer_stage, pp) for i in n.inputs if i in weights] + \
                 [fixed[i] for i in n.inputs if fixed.get(i) is not None]
            fixed.update(dict.fromkeys(n.outputs, max(ws) if ws else None))
        elif all(i in inputs or i in shape for i in n.inputs):
            shape.update(n.outputs)
    again = set(fixed) | shape
    own = [n for n in graph.nodes if not set(n.outputs) <= again]

    def weight_stages(n: Node) -> list[int]:
        return [_weight_stage(i, layer_stage, pp) for i in n.inputs if i in weights] + \
               [fixed[i] for i in n.inputs if fixed.get(i) is not None]

    made_by = {o: n for n in own for o in n.outputs}
    floor: dict[int, int] = {}  # the earliest stage each node can run in
    for n in own:
        lo = max([floor[id(made_by[i])] for i in n.inputs if i in made_by] + [0])
        ws = weight_stages(n)
        if ws and max(ws) < lo:
            raise UsageError(f"pipeline: {n.op} -> {n.outputs[0]} reads weights of stage {max(ws)} and a value "
                             f"of stage {lo}: the layers do not run in order")
        floor[id(n)] = max(ws) if ws else lo
    readers: dict[str, list[Node]] = {}
    for n in own:
        for i in n.inputs:
            readers.setdefault(i, []).append(n)
    stage: dict[int, int] = {}
    for n in reversed(own):
        after = [stage[id(r)] for o in n.outputs for r in readers.get(o, [])]
        f = floor[id(n)]
        if weight_stages(n) or not after or min(after) == f:
            stage[id(n)] = f
            continue
        # a node without weights read by a later stage runs there when that hands over no more
        # values than its one result would (a stack of the bank: yes; an add of two: no)
        late, cross = min(after), 0
        for i in set(n.inputs):
            p = made_by.get(i)
            if p is not None and floor[id(p)] < late and \
                    not any(stage.get(id(r), -1) >= late for r in readers[i] if r is not n):
                cross += 1
        stage[id(n)] = late if cross <= 1 else f
    where = {o: stage[id(n)] for n in own for o in n.outputs}
    out_stage = {}
    for name, v in graph.outputs:
        m = _LAYER.search(name + ".") if name != "logits" else None
        out_stage[(name, v)] = where.get(v, layer_stage[int(m.group(1))] if m else pp - 1)
    # relayed: made before stage s, read in s or after (by a node or as an output of that stage)
    read_at: dict[str, int] = {}
    for n in own:
        for i in n.inputs:
            if i in where:
                read_at[i] = max(read_at.get(i, 0), stage[id(n)])
    for (_, v), s in out_stage.items():
        if v in where:
            read_at[v] = max(read_at.get(v, 0), s)
    order = [o for n in own for o in n.outputs]
    recv = [[v for v in order if v in where and where[v] < s <= read_at.get(v, -1)] for s in range(pp)]
    return [_stage_graph(graph, s, [n for n in own if stage[id(n)] == s], again, producers,
                         [(k, v) for (k, v), t in out_stage.items() if t == s], recv[s],
                         recv[s + 1] if s + 1 < pp else [], where)
            for s in range(pp)]


def _stage_graph(graph: Graph, s: int, nodes: list[Node], again: set[str], producers: dict,
                 outputs: list[tuple[str, str]], recv: list[str], send: list[str], where: dict) -> Stage:
    need = [i for n in nodes for i in n.inputs if i in again] + [v for _, v in outputs if v in again]
    extra: list[Node] = []
    while need:
        v = need.pop()
        p = producers.get(v)
        if p is not None and p not in extra:
            extra.append(p)
            need += [i for i in p.inputs if i in again]
    nodes = [n for n in graph.nodes if n in extra or any(n is m for m in nodes)]
    made = {o for n in nodes for o in n.outputs}
    read = {i for n in nodes for i in n.inputs} | {v for _, v in outputs}
    ins = [i for i in graph.inputs if i in read] + [v for v in recv if v in read and v not in made]
    outs = list(outputs) + [(v, v) for v in send if where.get(v) == s]
    g = graph.copy()
    g.name = f"{graph.name}.stage{s}"
    g.nodes = [Node(n.op, list(n.inputs), list(n.outputs), dict(n.attrs), dict(n.meta)) for n in nodes]
    g.inputs, g.outputs = ins, outs
    g.meta = {**graph.meta, "stage": s}
    g.prune_types()
    g.weights = {w: t for w, t in g.weights.items() if w in {i for n in nodes for i in n.inputs}}
    return Stage(g, recv, send)
