"""Bodies of the recurrent ops: `kda`, `gated_delta_rule`, `delta_rule`, `linear_attention`
as the token-by-token definition (a Scan over T, any T). Whether a prefill runs chunked
instead is the chunk-delta-rule pass's decision: it rewrites the op into the chunk pieces
(chunked.py) before lowering.

Per token, with S [B, H, K, V] fp32 (the k3c.kernels naive references):
    S = exp(g_t) S                         (kda: per channel, gated: per head, delta: none)
    S = S + beta_t k_t (v_t - k_t^T S)^T
    o_t = scale q_t^T S
linear attention: S += k_t v_t^T, z += k_t, o_t = (q_t^T S) / (q_t^T z).
"""

from __future__ import annotations

from ....ir import OPS
from ....ir.ops.delta_family import FAMILY
from ...tables import builtin_family
from ..builder import Builder, subgraph
from ..custom import BODY_FLOATS, _call
from . import FUNCTIONS, function


def _delta_step(gate: str, scale: str):
    """The Scan body of one token of the delta family: (S, q, k, v[, g], beta) -> (S', o);
    `scale` is a value of the enclosing graph."""
    s = Builder(f"{gate}_step")
    S, q, k, v = (s.fresh(n) for n in ("S", "q", "k", "v"))
    g = s.fresh("g") if gate in ("channel", "head") else None
    beta = s.fresh("beta")
    S1 = S
    if gate == "channel":
        S1 = s.Mul(S, s.unsqueeze(s.Exp(g), -1))  # g_t [B, H, K]
    elif gate == "head":
        S1 = s.Mul(S, s.unsqueeze(s.Exp(g), -1, -2))  # g_t [B, H]
    v_old = s.MatMul(s.unsqueeze(k, 2), S1)  # [B, H, 1, V]
    u = s.Mul(s.unsqueeze(beta, 2, 3), s.Sub(s.unsqueeze(v, 2), v_old))
    S2 = s.Add(S1, s.MatMul(s.unsqueeze(k, 3), u))
    o = s.Mul(scale, s.squeeze(s.MatMul(s.unsqueeze(q, 2), S2), 2))
    g_rank = 3 if gate == "channel" else 2
    ins = [(S, "f32", 4), (q, "f32", 3), (k, "f32", 3), (v, "f32", 3)] + ([(g, "f32", g_rank)] if g else [])
    return s, ins + [(beta, "f32", 2)], [(S2, "f32", 4), (o, "f32", 3)]


def delta_scan(b: Builder, q, k, v, g, beta, state, scale, gate: str) -> list[str]:
    """Scan the delta rule over T (axis 1): returns (o [B, T, H, V], final state)."""
    s, ins, outs = _delta_step(gate, b.param(scale))
    body = subgraph(s, f"{gate}_delta_step", ins, outs)
    xs = [q, k, v] + ([g] if g is not None else []) + [beta]
    ranks = [4, 4, 4] + ([4 if gate == "channel" else 3] if g is not None else []) + [3]
    S, o = b.op("Scan", [state, *(time_major(b, x, r) for x, r in zip(xs, ranks))], 2, body=body,
                num_scan_inputs=len(xs))
    return [time_major(b, o, 4), S]


def time_major(b: Builder, x: str, rank: int) -> str:
    """[B, T, ...] <-> [T, B, ...]: Scan runs over axis 0, the axis every runtime scans."""
    return b.Transpose(x, perm=[1, 0] + list(range(2, rank)))


def linear_attention(b, q, k, v, state, z, scale):
    """Normalised linear attention by its recurrence (Scan over T)."""
    s = Builder("linear_step")
    S, zz, qt, kt, vt = (s.fresh(n) for n in ("S", "z", "q", "k", "v"))
    S2 = s.Add(S, s.MatMul(s.unsqueeze(kt, 3), s.unsqueeze(vt, 2)))
    z2 = s.Add(zz, kt)
    qs = s.Mul(b.param(scale), qt)
    num = s.squeeze(s.MatMul(s.unsqueeze(qs, 2), S2), 2)  # [B, H, V]
    den = s.ReduceSum(s.Mul(qs, z2), s.ints([-1]), keepdims=1)  # [B, H, 1]
    o = s.Div(num, den)
    body = subgraph(s, "linear_attention_step", [(S, "f32", 4), (zz, "f32", 3), (qt, "f32", 3), (kt, "f32", 3),
                                                  (vt, "f32", 3)], [(S2, "f32", 4), (z2, "f32", 3), (o, "f32", 3)])
    xs = [time_major(b, x, 4) for x in (q, k, v)]
    S_out, z_out, o_all = b.op("Scan", [state, z, *xs], 3, body=body, num_scan_inputs=3)
    return time_major(b, o_all, 4), S_out, z_out


def _member_body(gate: str):
    """The Scan body of a delta-family member by its gate kind, with the member's inputs as
    its parameters (the function of the op's name; a normalised one: linear_attention)."""
    if gate == "linear":
        return linear_attention
    if gate == "none":
        def body(b, q, k, v, beta, state, scale):
            """The delta rule by its recurrence (Scan over T): no decay."""
            return delta_scan(b, q, k, v, None, beta, state, scale, gate)
        return body

    def gated(b, q, k, v, g, beta, state, scale):
        """A gated delta rule by its recurrence (Scan over T): g per key channel or per head."""
        return delta_scan(b, q, k, v, g, beta, state, scale, gate)
    return gated


_MADE: set[str] = set()  # the ops member_function made a function for


def member_function(op: str) -> dict:
    """The function of delta-family op `op` (the body of its gate kind under the op's name, so
    `k3c.kda` stays `k3c.kda`), registered as its table entry is made: the entry's variants."""
    spec = OPS[op]
    function(op, " ".join(spec.tensor_inputs), " ".join(spec.outputs), {"scale": "float"},
             doc=spec.doc or op, builtin=False, replace=True)(_member_body(spec.delta.gate))
    _MADE.add(op)
    return {"variants": (op,), "variant": _own_name}


def forget_members(members: frozenset) -> None:
    """Drop the functions of ops that left the family (a user's op whose `scope()` ended)."""
    for op in _MADE - members:
        FUNCTIONS.pop(op, None)
        _MADE.discard(op)


def _own_name(node) -> str:
    return node.op


@builtin_family("onnx", FAMILY, kind="fn", floats=BODY_FLOATS, per_op=member_function, forget=forget_members)
def _lower_member(lx, node, **inputs):
    """Any delta-family op: one node of the k3c domain, the function of its own name."""
    _call(lx, node, node.op, inputs, scale=float(lx.attrs(node)["scale"]))
