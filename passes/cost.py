"""An estimate of FLOPs and bytes moved per op, at a binding of the symbolic dims.

The passes guard folds with it (a fold must not make things worse) and report what a pass
changed. It is a model, not a measurement: a multiply-add is 2 FLOPs, an elementwise op
costs a few FLOPs per element, and bytes are what an op reads and writes once (its
distinct inputs and its outputs). Views (reshape, slice, split, expand) move nothing: a
backend makes them views or folds them into their consumer.

    cost = graph_cost(graph)                   # at COST_AT: B=1, T=1024, P=1024
    cost.flops, cost.bytes
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import sympy

from ..ir import OPS, Graph, Node, TensorType
from ..ir import dims as D
from ..ir.interpret import resolve

COST_AT: dict[str, int] = {"B": 1, "T": 1024, "P": 1024}
"""The dim binding costs are estimated at (a dim not named here counts as 1024)."""

VIEWS = frozenset({"reshape", "slice", "split", "expand", "const"})

_ELEMENTWISE_FLOPS = {"cast": 0, "neg": 1, "abs": 1, "relu": 1, "silu": 2, "softplus": 2, "elu": 2, "gelu": 4}


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


def _pairs(T: int, S: int) -> int:
    """Query-key pairs of causal attention, bottom-right aligned (S >= T keys)."""
    return T * (S - T + 1) + T * (T - 1) // 2


# ------------------------------------------------------------------------- FLOPs per op
# f(input shapes, output shapes, attrs) -> FLOPs


def _linear(ins, outs, a):
    return 2 * math.prod(outs[0]) * ins[0][-1] + (math.prod(outs[0]) if len(ins) > 2 else 0)


def _attention(ins, outs, a):
    B, T, H, Dq = ins[0]
    S, Dv = ins[1][1], ins[2][3]
    return _pairs(T, S) * B * H * (2 * Dq + 2 * Dv + 4)


def _mla(ins, outs, a):
    B, T, H, Dq = ins[0]
    S, Dc, Dr = ins[1][1], ins[1][2], ins[2][2]
    Dv = a["v_head_dim"]
    up = 2 * B * S * Dc * H * (Dq - Dr + Dv)
    return up + _pairs(T, S) * B * H * (2 * Dq + 2 * Dv + 4)


def _mla_absorbed(ins, outs, a):
    B, T, H, Dq = ins[0]
    S, Dc, Dr = ins[1][1], ins[1][2], ins[2][2]
    Dn, Dv = Dq - Dr, ins[4][1]
    return 2 * B * T * H * (Dn * Dc + Dc * Dv) + _pairs(T, S) * B * H * (2 * (Dc + Dr) + 2 * Dc + 4)


def _recurrent(per_kv: int):
    def f(ins, outs, a):
        B, T, H, K = ins[0]
        return per_kv * B * T * H * K * ins[2][3]

    return f


def _situ_like(act: str) -> int:
    return 9 if act == "situ" else 3


def _gated_mlp(ins, outs, a):
    rows, two_i, d = math.prod(ins[0][:-1]), ins[1][0], ins[1][1]
    return 2 * rows * two_i * d + _situ_like(a["act"]) * rows * two_i // 2


def _moe_experts(ins, outs, a):
    (N, d), two_i, k = ins[0], ins[1][1], ins[3][1]
    I, d_out = two_i // 2, ins[2][1]
    return 2 * N * k * two_i * d + _situ_like(a["act"]) * N * k * I + 2 * N * k * I * d_out + N * k * d_out


def _chunk_prepare(ins, outs, a):
    B, H, NC, C, K = outs[0]
    V = outs[3][4]
    if a["gate"] == "linear":
        return B * H * NC * 2 * C * C * K
    scores = 4 * C * C * K + (8 * C * K if a["gate"] != "none" else 0)
    wy = C * C * C // 3 + 2 * C * C * K + 2 * C * C * V
    return B * H * NC * (scores + wy)


def _chunk_scan(ins, outs, a):
    B, H, NC, C, V = ins[1]
    K = ins[2][4]
    return B * H * NC * (4 * C * K * V + K * V + C * V)


def _chunk_output(ins, outs, a):
    B, H, NC, C, V = ins[2]
    K = ins[0][4]
    return B * H * NC * (2 * C * K * V + 2 * C * C * V + C * V)


FLOPS: dict[str, Callable[[list[Shape], list[Shape], dict], int]] = {
    "linear": _linear,
    "matmul": lambda ins, outs, a: 2 * math.prod(outs[0]) * ins[0][-1],
    "rms_norm": lambda ins, outs, a: (4 + (len(ins) > 1)) * math.prod(ins[0]),
    "layer_norm": lambda ins, outs, a: (7 + len(ins) - 1) * math.prod(ins[0]),
    "softmax": lambda ins, outs, a: 4 * math.prod(ins[0]),
    "situ": lambda ins, outs, a: 9 * math.prod(outs[0]),
    "causal_attention": _attention,
    "mla_attention": _mla,
    "mla_attention_absorbed": _mla_absorbed,
    "attn_res_mix": lambda ins, outs, a: 6 * math.prod(ins[0]),
    "kda": _recurrent(7),
    "gated_delta_rule": _recurrent(7),
    "delta_rule": _recurrent(6),
    "linear_attention": _recurrent(4),
    "short_conv": lambda ins, outs, a: (2 * ins[1][1] + 2) * math.prod(ins[0]),
    "moe_gate_up": lambda ins, outs, a: 2 * math.prod(outs[0]) * ins[0][1],
    "moe_down": lambda ins, outs, a: 2 * math.prod(ins[0]) * ins[1][1] + math.prod(outs[0]) * ins[2][1],
    "gated_mlp": _gated_mlp,
    "moe_experts": _moe_experts,
    "chunk_prepare": _chunk_prepare,
    "chunk_state_scan": _chunk_scan,
    "chunk_output": _chunk_output,
}


def _default_flops(node: Node, ins: list[Shape], outs: list[Shape]) -> int:
    fams = OPS[node.op].families
    if "constant" in fams or node.op in VIEWS or node.op in ("permute", "concat", "stack", "embedding", "gather"):
        return 0
    if "reduce" in fams or node.op == "topk":
        return math.prod(ins[0])
    return _ELEMENTWISE_FLOPS.get(node.op, 1) * sum(math.prod(s) for s in outs)


def node_cost(graph: Graph, node: Node, env: dict[str, int]) -> Cost:
    return _cost(node, [graph.types[i] for i in node.inputs], [graph.types[o] for o in node.outputs], env)


def _cost(node: Node, in_types: list[TensorType], out_types: list[TensorType], env: dict[str, int]) -> Cost:
    key = tuple(sorted(env.items()))
    ins = [_shape(t, key) for t in in_types]
    outs = [_shape(t, key) for t in out_types]
    attrs = {k: resolve(v, env) for k, v in OPS[node.op].full_attrs(node.attrs).items()}
    fn = FLOPS.get(node.op)
    flops = fn(ins, outs, attrs) if fn else _default_flops(node, ins, outs)
    if node.op in VIEWS:
        return Cost(flops, 0)
    seen, nbytes = set(), 0
    touched = _experts_touched(node.op, ins)
    for i, (name, t, shape) in enumerate(zip(node.inputs, in_types, ins)):
        if name not in seen:
            seen.add(name)
            nbytes += int(_bytes(t, shape) * touched.get(i, 1.0))
    nbytes += sum(_bytes(t, s) for t, s in zip(out_types, outs))
    return Cost(flops, nbytes)


# routed-expert op -> (positions of its [E, ...] expert weights, position of idx [N, k])
_EXPERT_WEIGHTS = {"moe_experts": ((1, 2), 3), "moe_gate_up": ((1,), 2), "moe_down": ((1,), 2)}


def _experts_touched(op: str, ins: list[Shape]) -> dict[int, float]:
    """The fraction of each expert weight a routed-expert op reads: N * k (token, slot) pairs
    reach at most min(E, N k) of the E experts (a decode step of K3 reads 16 of 896)."""
    if op not in _EXPERT_WEIGHTS:
        return {}
    weights, idx = _EXPERT_WEIGHTS[op]
    E, pairs = ins[weights[0]][0], math.prod(ins[idx])
    return {i: min(E, pairs) / E for i in weights}


def op_cost(op: str, in_types: list[TensorType], attrs: dict | None = None) -> tuple[Cost, list[TensorType]]:
    """(cost, output types) of one `op` on operands of static `in_types`, counted as node_cost
    counts a node of the graph: for a kernel outside a graph (a benchmark's)."""
    attrs = dict(attrs or {})
    outs = OPS[op].infer(*in_types, **OPS[op].full_attrs(attrs))
    node = Node(op, [f"in{i}" for i in range(len(in_types))], [f"out{i}" for i in range(len(outs))], attrs)
    return _cost(node, in_types, outs, {}), outs


def chunk_delta_cost(B: int, T: int, H: int, K: int, V: int, dtype: str = "bf16", chunk_size: int = 64,
                     gate: str = "channel") -> dict[str, Cost]:
    """The three pieces of the chunked delta rule (KDA for gate "channel") at static sizes,
    as the chunk-delta-rule pass writes them: {"chunk_prepare": ..., "chunk_state_scan": ...,
    "chunk_output": ...}, in the dtype of q, k, v (state and pieces fp32)."""
    q, v = TensorType(dtype, (B, T, H, K)), TensorType(dtype, (B, T, H, V))
    beta = TensorType("f32", (B, T, H))
    g = [TensorType("f32", (B, T, H, K) if gate == "channel" else (B, T, H))] if gate in ("channel", "head") else []
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
