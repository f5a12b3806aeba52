"""An estimate of FLOPs and bytes moved per op, at a binding of the symbolic dims.

The passes guard folds with it (a fold must not make things worse) and report what a pass
changed. It is a model, not a measurement: each op's FLOPs come from the cost rule of its
declaration (`defop(..., flops=...)`: a multiply-add is 2 FLOPs, an elementwise op a few per
element), and bytes are what an op reads and writes once (its distinct inputs and its
outputs). Ops of the `view` family (reshape, slice, split, expand) move nothing: a backend
makes them views or folds them into their consumer.

    cost = graph_cost(graph)                   # at COST_AT: B=1, T=1024, P=1024
    cost.flops, cost.bytes
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import sympy

from ..ir import OPS, Graph, Node, TensorType
from ..ir import dims as D
from ..ir.interpret import resolve
from ..ir.ops.delta_family import DeltaForm
from ..kernels.delta.chunk import DEFAULT_CHUNK_SIZE

COST_AT: dict[str, int] = {"B": 1, "T": 1024, "P": 1024}
"""The dim binding costs are estimated at (a dim not named here counts as 1024)."""

VIEWS = frozenset({"const"})  # besides the `view` family: moves no bytes (a scalar literal)

@dataclass(frozen=True)
class Cost:
    flops: int
    bytes: int

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.flops + other.flops, self.bytes + other.bytes)


Shape = tuple[int, ...]


@lru_cache(maxsize=65536)
def _eval(d: D.Dim, env: tuple[tuple[str, int], ...]) -> int:
    if isinstance(d, int):
        return d
    return int(d.subs({sympy.Symbol(n, integer=True, positive=True): v for n, v in env}))


def binding(graph: Graph, at: dict[str, int] | None = None) -> dict[str, int]:
    at = COST_AT if at is None else at
    return {n: at.get(n, 1024) for n in graph.dims}


def _shape(t: TensorType, env: tuple) -> Shape:
    return tuple(_eval(d, env) for d in t.shape)


def static_shape(t: TensorType, env: dict[str, int]) -> Shape:
    """The shape of `t` with its dims bound by `env` (a binding() result)."""
    return _shape(t, tuple(sorted(env.items())))


def _bytes(t: TensorType, shape: Shape) -> int:
    return math.prod(shape) * t.torch_dtype.itemsize


def _flops(node: Node, ins: list[Shape], outs: list[Shape], attrs: dict) -> int:
    """The op's own cost rule (its spec's `flops`), else one FLOP per output element."""
    rule = OPS[node.op].flops
    return rule(ins, outs, attrs) if rule is not None else sum(math.prod(s) for s in outs)


def node_cost(graph: Graph, node: Node, env: dict[str, int], types=None) -> Cost:
    types = graph.types if types is None else types
    key = tuple(sorted(env.items()))
    ins = [_shape(types[i], key) for i in node.inputs]
    outs = [_shape(types[o], key) for o in node.outputs]
    attrs = {k: resolve(v, env) for k, v in OPS[node.op].full_attrs(node.attrs).items()}
    flops = _flops(node, ins, outs, attrs)
    if node.op in VIEWS or "view" in OPS[node.op].families:
        return Cost(flops, 0)
    seen, nbytes = set(), 0
    touched = _experts_touched(node, ins)
    for i, (name, shape) in enumerate(zip(node.inputs, ins)):
        if name not in seen:
            seen.add(name)
            nbytes += int(_bytes(types[name], shape) * touched.get(i, 1.0))
    nbytes += sum(_bytes(types[o], s) for o, s in zip(node.outputs, outs))
    return Cost(flops, nbytes)


# inputs of a routed-expert op (the `moe` family) that hold one slice per expert
_PER_EXPERT = frozenset({"w13", "w2", "w13_packed", "w13_scale", "w2_packed", "w2_scale"})


def _experts_touched(node: Node, ins: list[Shape]) -> dict[int, float]:
    """The fraction of each expert weight a routed-expert op reads: N * k (token, slot) pairs
    reach at most min(E, N k) of the E experts (a decode step of K3 reads 16 of 896)."""
    spec = OPS[node.op]
    if "moe" not in spec.families or "idx" not in spec.tensor_inputs:
        return {}
    names = spec.tensor_inputs[:len(ins)]
    weights = [i for i, n in enumerate(names) if n in _PER_EXPERT]
    if not weights:
        return {}
    E, pairs = ins[weights[0]][0], math.prod(ins[names.index("idx")])
    return {i: min(E, pairs) / E for i in weights}


def op_cost(op: str, in_types: list[TensorType], attrs: dict | None = None) -> tuple[Cost, list[TensorType]]:
    """(cost, output types) of one `op` on operands of static `in_types`, counted as node_cost
    counts a node of the graph: for a kernel outside a graph (a benchmark's)."""
    attrs = dict(attrs or {})
    outs = OPS[op].infer(*in_types, **OPS[op].full_attrs(attrs))
    node = Node(op, [f"in{i}" for i in range(len(in_types))], [f"out{i}" for i in range(len(outs))], attrs)
    types = {**dict(zip(node.inputs, in_types)), **dict(zip(node.outputs, outs))}
    return node_cost(Graph(), node, {}, types), outs


def chunk_delta_cost(B: int, T: int, H: int, K: int, V: int, dtype: str = "bf16", chunk_size: int = DEFAULT_CHUNK_SIZE,
                     gate: str = "channel") -> dict[str, Cost]:
    """The three pieces of the chunked delta rule (KDA for gate "channel") at static sizes,
    as the chunk-delta-rule pass writes them: {"chunk_prepare": ..., "chunk_state_scan": ...,
    "chunk_output": ...}, in the dtype of q, k, v (state and pieces fp32)."""
    q, v = TensorType(dtype, (B, T, H, K)), TensorType(dtype, (B, T, H, V))
    beta = TensorType("f32", (B, T, H))
    form = DeltaForm(gate)
    g = [TensorType("f32", form.g_shape(B, T, H, K))] if form.decays else []
    prep, (q_dec, k_dec, w, u, aqk, decay) = op_cost("chunk_prepare", [q, q, v, beta, *g],
                                                     {"chunk_size": chunk_size, "gate": gate})
    scan, (v_new, starts, _) = op_cost("chunk_state_scan", [w, u, k_dec, decay, TensorType("f32", (B, H, K, V))])
    out, _ = op_cost("chunk_output", [q_dec, aqk, v_new, starts], {"scale": K**-0.5, "T": T})
    return {"chunk_prepare": prep, "chunk_state_scan": scan, "chunk_output": out}


def graph_cost(graph: Graph, at: dict[str, int] | None = None) -> Cost:
    """The summed cost of every node of `graph` at the binding `at` (default COST_AT)."""
    env = binding(graph, at)
    total = Cost(0, 0)
    for n in graph.nodes:
        total = total + node_cost(graph, n, env)
    return total


def nodes_cost(graph: Graph, nodes: list[Node], at: dict[str, int] | None = None) -> Cost:
    env = binding(graph, at)
    total = Cost(0, 0)
    for n in nodes:
        total = total + node_cost(graph, n, env)
    return total


def staged_cost(b, at: dict[str, int] | None = None) -> Cost:
    """The cost of the nodes a Builder has staged (their types are not in the graph yet)."""
    env = binding(b.graph, at)
    types = {**b.graph.types, **b.types}
    total = Cost(0, 0)
    for n in b.nodes:
        total = total + node_cost(b.graph, n, env, types)
    return total


def no_worse(before: Cost, after: Cost) -> bool:
    """A rewrite is kept only when it makes neither FLOPs nor bytes worse."""
    return after.flops <= before.flops and after.bytes <= before.bytes


# ---- collectives: the bytes a rank sends ---------------------------------------------------
# Counted as the volume of the bandwidth-optimal algorithm of each primitive over M ranks: an
# all-reduce sends 2 (M - 1) / M of its buffer (reduce-scatter then all-gather, as a ring
# does), an all-gather its shard to M - 1 ranks, a reduce-scatter (M - 1) / M of its buffer,
# an all-to-all the rows it addresses to other ranks (and its M - 1 counts, when the receivers
# cannot know them). The rank runner counts what it hands torch.distributed the same way
# (k3c.distributed.comm), so a plan and a run agree where the sizes do.
COUNT_BYTES = 8  # one int64 row count


def sent_bytes(kind: str, nbytes: float, members: int) -> float:
    """Bytes one rank sends for a primitive on a buffer of `nbytes` (all_to_all: the bytes it
    addresses to the other ranks, already)."""
    M = members
    if M <= 1:
        return 0
    return {"all_reduce": 2 * (M - 1) * nbytes / M, "all_gather": (M - 1) * nbytes,
            "reduce_scatter": (M - 1) * nbytes / M, "all_to_all": nbytes}[kind]


def comm_bytes(graph: Graph, node: Node, env: dict[str, int]) -> float:
    """The bytes one rank sends for collective `node` at the binding `env`. Exact for the
    all-reduce, all-gather and reduce-scatter; for the expert dispatch and combine (and a plain
    all_to_all) the expectation at balanced routing: each rank's token slice N / M, and of its
    slots the share (M - 1) / M bound for other ranks."""
    key = tuple(sorted(env.items()))
    shapes = [_shape(graph.types[i], key) for i in node.inputs]
    nbytes = [_bytes(graph.types[i], s) for i, s in zip(node.inputs, shapes)]
    M = len(node.attrs["group"])
    if M <= 1:
        return 0
    away = (M - 1) / M
    if node.op in ("all_reduce", "all_gather", "reduce_scatter"):
        return sent_bytes(node.op, nbytes[0], M)
    if node.op == "all_to_all":
        return nbytes[0] * away + COUNT_BYTES * (M - 1)
    item = graph.types[node.inputs[0]].torch_dtype.itemsize
    peers = node.attrs.get("peers", 0)
    if node.op == "moe_dispatch":
        (N, width), k = shapes[0], shapes[1][1]
        return sum(exchange_bytes(N, k, width, item, M, peers)[:2])
    if node.op == "moe_combine":
        width, (N, k) = shapes[0][1], shapes[2]
        return sum(exchange_bytes(N, k, width, item, M, peers)[2:])
    raise ValueError(f"{node.op} is not a collective")


def exchange_bytes(N: float, k: int, width: int, item: int, M: int, peers: int = 0) -> list[float]:
    """What one member sends in each of the four all-to-alls of an expert dispatch + combine
    over M members (kernels/collectives/naive.py) at balanced routing: its token slice N / P
    (P = `peers` members share its N tokens; 0: all M do), k slots each, the share (M - 1) / M
    of them bound for other members.
    [dispatch rows (+ the counts, exchanged), dispatch expert ids, outputs back, the slices
    gathered within the P]."""
    if M <= 1:
        return [0.0, 0.0, 0.0, 0.0]
    P = peers or M
    away, slots = (M - 1) / M, N / P * k
    return [slots * away * width * item + COUNT_BYTES * (M - 1), slots * away * COUNT_BYTES,
            slots * away * width * item, (P - 1) * N / P * width * item]


def combine_bytes(width: int, item: int, k: int, tp: int, ep: int, tokens: int = 1 << 16) -> dict[str, float]:
    """Bytes per token one rank sends to combine one MoE layer's routed experts on a tp x ep
    mesh (experts over ep, their columns over tp), by each form the partition can run:
    "all_reduce" sums the partial outputs [N, width] over the world; "all_to_all" dispatches
    each slot to the tp ranks that hold its expert's columns and combines over the world (at
    balanced routing). `tokens` only spreads the row counts' bytes."""
    W = tp * ep
    return {"all_reduce": sent_bytes("all_reduce", width * item, W),
            "all_to_all": sum(exchange_bytes(tokens, k * tp, width, item, W)) / tokens}


def graph_comm(graph: Graph, at: dict[str, int] | None = None) -> dict[str, dict]:
    """Per collective op of `graph`: how many nodes, and the bytes one rank sends in all."""
    env = binding(graph, at)
    out: dict[str, dict] = {}
    for n in graph.nodes:
        if "collective" in OPS[n.op].families:
            row = out.setdefault(n.op, {"count": 0, "bytes": 0.0})
            row["count"] += 1
            row["bytes"] += comm_bytes(graph, n, env)
    return out
