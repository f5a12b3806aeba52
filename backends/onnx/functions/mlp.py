"""Bodies of the MLP ops: `situ`, `gated_mlp_*` and the routed experts (`moe_gate_up`,
`moe_down`, `moe_experts_*`).

The expert ops pick one of two exact forms at run time (an If on the routed slot count):
  few slots (decode), N * k <= E: gather each slot's expert weights, one batched matmul;
  many slots, balanced routing (padding at most doubles the work): the slots grouped by
  expert and padded to the busiest expert's count, one batched MatMul per projection over
  [E, cap, D], each slot's row gathered back and a token's k rows summed: no Loop, no
  per-expert copies, no ScatterND(add) over duplicate indices;
  many slots, skewed routing: a Loop over the E experts, each taking the slots routed to it
  (NonZero), one GEMM each, ScatterND(add) into the result.
"""

from __future__ import annotations

from ..builder import Builder, loop_counter, subgraph
from . import function, op_function

# The activations here use the runtime's own Sigmoid, not the relative-accuracy form of
# stable.py (ten nodes, each a pass over the [tokens, I] activations): what they feed is a
# GEMM (the down projection) that sums O(1) terms, so an error of u |gate| per element is what
# counts, as for gelu (tests/numerics/test_elementwise.py checks the `sigmoid` and `silu` ops
# themselves in relative terms; the router's sigmoid, renormalised, keeps the stable form).


def situ(b: Builder, gate: str, up: str, beta, linear_beta) -> str:
    """beta tanh(gate / beta) sigmoid(gate) * linear_beta tanh(up / linear_beta)."""
    bt = b.param(beta)
    a = b.Mul(b.Mul(bt, b.Tanh(b.Div(gate, bt))), b.Sigmoid(gate))
    if linear_beta is not None:
        lb = b.param(linear_beta)
        up = b.Mul(lb, b.Tanh(b.Div(up, lb)))
    return b.Mul(a, up)


def activation(b: Builder, gu: str, act: str, beta=None, linear_beta=None) -> str:
    """act(gate, up) of gu = [gate | up] on the last axis."""
    gate, up = b.op("Split", [gu], 2, axis=-1, num_outputs=2)
    if act == "silu":
        return b.Mul(b.Mul(gate, b.Sigmoid(gate)), up)
    return situ(b, gate, up, beta, linear_beta)


_SITU = {"beta": "float", "linear_beta": "float"}


@function("situ", "gate up", "y", _SITU)
def _situ(b, gate, up, beta, linear_beta):
    """SiTU: beta tanh(gate/beta) sigmoid(gate) * linear_beta tanh(up/linear_beta)."""
    return situ(b, gate, up, beta, linear_beta)


@function("situ_identity_up", "gate up", "y", {"beta": "float"})
def _situ_identity_up(b, gate, up, beta):
    """SiTU without the cap on up (linear_beta None): beta tanh(gate/beta) sigmoid(gate) * up."""
    return situ(b, gate, up, beta, None)


def gated_mlp(b: Builder, x: str, w: str, act: str, beta=None, linear_beta=None) -> str:
    return activation(b, b.MatMul(x, b.Transpose(w, perm=[1, 0])), act, beta, linear_beta)


@function("gated_mlp_situ", "x w", "y", _SITU)
def _gated_mlp_situ(b, x, w, beta, linear_beta):
    """SiTU(x W_gate^T, x W_up^T) with w = [W_gate; W_up] [2I, D]."""
    return gated_mlp(b, x, w, "situ", beta, linear_beta)


@function("gated_mlp_situ_identity_up", "x w", "y", {"beta": "float"})
def _gated_mlp_situ_identity_up(b, x, w, beta):
    """gated_mlp_situ with linear_beta None."""
    return gated_mlp(b, x, w, "situ", beta, None)


@function("gated_mlp_silu", "x w", "y")
def _gated_mlp_silu(b, x, w):
    """silu(x W_gate^T) * x W_up^T with w = [W_gate; W_up] [2I, D]."""
    return gated_mlp(b, x, w, "silu")


# ---- routed experts ------------------------------------------------------------------------

def _expert_ranks(b: Builder, idx: str, experts: str) -> tuple[str, str, str]:
    """flat [N k] (the expert of every slot of idx [N, k]), counts [E] (slots per expert) and
    rank [N k] (a slot's 1-based place among its expert's slots, in slot order); `experts`
    holds the expert ids, broadcast against [N k, 1]."""
    flat = b.Reshape(idx, b.ints([-1]))
    onehot = b.Cast(b.Equal(b.unsqueeze(flat, 1), experts), to=7)  # [N k, E] int64
    counts = b.ReduceSum(onehot, b.ints([0]), keepdims=0)
    rank = b.ReduceSum(b.Mul(b.CumSum(onehot, b.const(0, "i64")), onehot), b.ints([1]), keepdims=0)
    return flat, counts, rank


def _inverse(b: Builder, fill: str, dest: str, n_slots: str) -> str:
    """fill with slot s written at position dest[s], for the n_slots ([1]) slots."""
    return b.ScatterElements(fill, dest, b.Range(b.const(0, "i64"), b.squeeze(n_slots, 0), b.const(1, "i64")))


def _slot_batches(b: Builder, idx: str, E: str) -> tuple[str, str, str]:
    """The routed slots grouped by expert, padded to the busiest expert's count `cap`:
    slots [E * cap] holds, for each expert in turn, the flat slot ids n * k + j routed to it
    (in slot order) and then N * k (a padding slot); dest [N * k] is the inverse, each slot's
    row in that layout. No Loop, no data-dependent shapes but `cap`; the padding costs
    (cap * E - N * k) rows of work."""
    experts = b.Range(b.const(0, "i64"), b.squeeze(E, 0), b.const(1, "i64"))
    flat, counts, rank = _expert_ranks(b, idx, b.unsqueeze(experts, 0))
    n_slots = b.Shape(flat)
    cap = b.ReduceMax(counts, keepdims=1)  # [1]
    dest = b.Add(b.Mul(flat, cap), b.Sub(rank, b.ints([1])))
    slots = _inverse(b, b.Expand(n_slots, b.Mul(E, cap)), dest, n_slots)
    return slots, cap, dest


def sorted_slots(b: Builder, idx: str, E: int) -> tuple[str, str, str]:
    """The routed slots sorted by expert, unpadded (a counting sort, stable in slot order), for
    a static expert count E: counts [E] of each expert, dest [N k] each slot's position in
    that order, perm [N k] the inverse (the slot at each position)."""
    flat, counts, rank = _expert_ranks(b, idx, b.const(list(range(E)), "i64"))
    start = b.Sub(b.CumSum(counts, b.const(0, "i64")), counts)
    dest = b.Sub(b.Add(b.Gather(start, flat, axis=0), rank), b.const(1, "i64"))
    n_slots = b.Shape(flat)
    return counts, dest, _inverse(b, b.Expand(b.const(0, "i64"), n_slots), dest, n_slots)


def _rows(b: Builder, x: str, slots: str, E: str, cap: str) -> str:
    """x [M, D] rows at `slots` (the padding slot M reads a zero row) as [E, cap, D]."""
    padded = b.Concat(x, b.Mul(b.Slice(x, b.ints([0]), b.ints([1]), b.ints([0])), b.const(0.0)), axis=0)
    return b.Reshape(b.Gather(padded, slots, axis=0), b.Concat(E, cap, b.ints([-1]), axis=0))


def _by_expert(b: Builder, rows: str, w: str) -> str:
    """rows [E, cap, D] through each expert's w [E, O, D]: [E, cap, O], one batched MatMul."""
    return b.MatMul(rows, b.Transpose(w, perm=[0, 2, 1]))


def _combine(b: Builder, out: str, dest: str, w: str, k: str, N: str) -> str:
    """y[n] = sum over n's slots of w[slot] * out[slot]: out [E, cap, D] -> y [N, D].

    Each slot's row is gathered back (dest) and a token's k rows summed with ReduceSum: no
    ScatterND(add), whose duplicate indices onnxruntime may apply from several threads."""
    D = b.shape_of(out, -1)
    flat = b.Reshape(out, b.Concat(b.ints([-1]), D, axis=0))  # [E cap, D]
    per_slot = b.Mul(b.Gather(flat, dest, axis=0), b.unsqueeze(b.Reshape(w, b.ints([-1])), 1))  # [N k, D]
    return b.ReduceSum(b.Reshape(per_slot, b.Concat(N, k, D, axis=0)), b.ints([1]), keepdims=0)


def _per_expert(b: Builder, idx: str, E: str, acc0: str, rank: int, step) -> str:
    """Loop e over the E experts: acc = step(s, e, pos) with pos [M, 2] the (token, slot)
    pairs routed to e (M varies with e)."""
    s = Builder("expert")
    it, cnd = loop_counter(s)
    e, cond, acc = it[0], cnd[0], s.fresh("acc")
    pos = s.Transpose(s.NonZero(s.Equal(idx, e)), perm=[1, 0])  # [M, 2]
    acc_next = step(s, e, pos, acc)
    cond_out = s.Identity(cond)
    body = subgraph(s, "per_expert", [it, cnd, (acc, "f32", rank)], [(cond_out, "bool", []), (acc_next, "f32", rank)])
    return b.op("Loop", [b.squeeze(E, 0), b.const(True, "bool"), acc0], 1, body=body)


def _few_slots(b: Builder, idx: str, E: str) -> str:
    """bool: N * k <= E, where gathering each slot's weights reads less than every expert."""
    slots = b.ReduceProd(b.Shape(idx), keepdims=1)
    return b.squeeze(b.Not(b.Greater(slots, E)), 0)


def _balanced(b: Builder, idx: str, E: str) -> str:
    """bool: padding every expert to the busiest one's count at most doubles the work."""
    _, cap, _ = _slot_batches(b, idx, E)
    slots = b.ReduceProd(b.Shape(idx), keepdims=1)
    return b.squeeze(b.Not(b.Greater(b.Mul(E, cap), b.Mul(slots, b.ints([2])))), 0)


def _choose(b: Builder, idx: str, E: str, gathered, batched, loop, rank: int) -> str:
    """gathered when N * k <= E (decode), else batched when routing is balanced, else the Loop."""
    def many(s: Builder) -> str:
        return s.op("If", [_balanced(s, idx, E)], 1, then_branch=_branch("batched", batched, rank),
                    else_branch=_branch("loop", loop, rank))
    return b.op("If", [_few_slots(b, idx, E)], 1, then_branch=_branch("gather", gathered, rank),
                else_branch=_branch("many", many, rank))


def _zeros(b: Builder, shape: str) -> str:
    return b.Expand(b.const(0.0), shape)


def _branch(name: str, build, rank: int) -> object:
    s = Builder(name)
    out = build(s)
    return subgraph(s, name, [], [(out, "f32", rank)])


def gate_up_gathered(s: Builder, h: str, w13: str, idx: str) -> str:
    W = s.Gather(w13, idx, axis=0)  # [N, k, 2I, D]
    return s.squeeze(s.MatMul(W, s.unsqueeze(h, 1, 3)), -1)  # [N, k, 2I]


def down_gathered(s: Builder, a: str, w2: str, idx: str, w: str) -> str:
    W = s.Gather(w2, idx, axis=0)  # [N, k, D_out, I]
    o = s.squeeze(s.MatMul(W, s.unsqueeze(a, -1)), -1)  # [N, k, D_out]
    return s.ReduceSum(s.Mul(o, s.unsqueeze(w, -1)), s.ints([1]), keepdims=0)


@op_function("moe_gate_up")
def moe_gate_up(b: Builder, h, w13, idx):
    """gu[n, j] = w13[idx[n, j]] @ h[n]: h [N, D], w13 [E, 2I, D], idx [N, k] -> [N, k, 2I]."""
    E = b.shape_of(w13, 0)

    def batched(s: Builder) -> str:
        slots, cap, _ = _slot_batches(s, idx, E)
        k = s.shape_of(idx, 1)
        gu = _by_expert(s, _rows(s, h, s.Div(slots, k), E, cap), w13)  # [E, cap, 2I]
        width = s.shape_of(w13, 1)
        n_slots = s.ReduceProd(s.Shape(idx), keepdims=1)
        # each slot is filled once; the padding slot (N k) is an extra row, dropped
        out = s.ScatterND(s.Expand(s.const(0.0), s.Concat(s.Add(n_slots, s.ints([1])), width, axis=0)),
                          s.unsqueeze(slots, 1), s.Reshape(gu, s.Concat(s.ints([-1]), width, axis=0)))
        return s.Reshape(s.Slice(out, s.ints([0]), n_slots, s.ints([0])), s.Concat(s.Shape(idx), width, axis=0))

    def loop(s: Builder) -> str:
        def step(t: Builder, e, pos, acc):
            hs = t.Gather(h, t.Gather(pos, t.const(0, "i64"), axis=1), axis=0)  # [M, D]
            return t.ScatterND(acc, pos, t.Gemm(hs, t.Gather(w13, e, axis=0), transB=1))
        shape = s.Concat(s.Shape(idx), s.shape_of(w13, 1), axis=0)
        return _per_expert(s, idx, E, _zeros(s, shape), 3, step)

    return _choose(b, idx, E, lambda s: gate_up_gathered(s, h, w13, idx), batched, loop, 3)


@op_function("moe_down")
def moe_down(b: Builder, a, w2, idx, w):
    """y[n] = sum_j w[n, j] * w2[idx[n, j]] @ a[n, j]: a [N, k, I], w2 [E, D, I] -> [N, D]."""
    E = b.shape_of(w2, 0)

    def batched(s: Builder) -> str:
        slots, cap, dest = _slot_batches(s, idx, E)
        flat = s.Reshape(a, s.Concat(s.ints([-1]), s.shape_of(a, 2), axis=0))  # [N k, I]
        out = _by_expert(s, _rows(s, flat, slots, E, cap), w2)
        return _combine(s, out, dest, w, s.shape_of(idx, 1), s.shape_of(a, 0))

    def loop(s: Builder) -> str:
        def step(t: Builder, e, pos, acc):
            o = t.Gemm(t.GatherND(a, pos), t.Gather(w2, e, axis=0), transB=1)  # [M, D]
            o = t.Mul(o, t.unsqueeze(t.GatherND(w, pos), -1))
            rows = t.Gather(pos, t.ints([0]), axis=1)  # [M, 1]
            return t.ScatterND(acc, rows, o, reduction="add")
        shape = s.Concat(s.shape_of(a, 0), s.shape_of(w2, 1), axis=0)
        return _per_expert(s, idx, E, _zeros(s, shape), 2, step)

    return _choose(b, idx, E, lambda s: down_gathered(s, a, w2, idx, w), batched, loop, 2)


def moe_experts(b: Builder, h, w13, w2, idx, w, act: str, beta=None, linear_beta=None) -> str:
    """y[n] = sum_j w[n, j] * w2[e] act(w13[e] h[n]), e = idx[n, j]."""
    E = b.shape_of(w13, 0)
    # attributes become values here, outside the subgraphs that read them
    beta = b.param(beta) if beta is not None else None
    linear_beta = b.param(linear_beta) if linear_beta is not None else None

    def gathered(s: Builder) -> str:
        gu = gate_up_gathered(s, h, w13, idx)
        return down_gathered(s, activation(s, gu, act, beta, linear_beta), w2, idx, w)

    def batched(s: Builder) -> str:
        slots, cap, dest = _slot_batches(s, idx, E)
        k = s.shape_of(idx, 1)
        gu = _by_expert(s, _rows(s, h, s.Div(slots, k), E, cap), w13)  # [E, cap, 2I]
        out = _by_expert(s, activation(s, gu, act, beta, linear_beta), w2)  # [E, cap, D_out]
        return _combine(s, out, dest, w, k, s.shape_of(h, 0))

    def loop(s: Builder) -> str:
        def step(t: Builder, e, pos, acc):
            rows = t.Gather(pos, t.ints([0]), axis=1)  # [M, 1]
            hs = t.Gather(h, t.squeeze(rows, 1), axis=0)
            gu = t.Gemm(hs, t.Gather(w13, e, axis=0), transB=1)  # [M, 2I]
            o = t.Gemm(activation(t, gu, act, beta, linear_beta), t.Gather(w2, e, axis=0), transB=1)
            o = t.Mul(o, t.unsqueeze(t.GatherND(w, pos), -1))
            return t.ScatterND(acc, rows, o, reduction="add")
        shape = s.Concat(s.shape_of(h, 0), s.shape_of(w2, 1), axis=0)
        return _per_expert(s, idx, E, _zeros(s, shape), 2, step)

    return _choose(b, idx, E, gathered, batched, loop, 2)


_EXPERTS = "h w13 w2 idx w"


@function("moe_experts_situ", _EXPERTS, "y", _SITU)
def _moe_experts_situ(b, h, w13, w2, idx, w, beta, linear_beta):
    """Routed experts with SiTU: h [N, D], w13 [E, 2I, D], w2 [E, D_out, I], idx, w [N, k]."""
    return moe_experts(b, h, w13, w2, idx, w, "situ", beta, linear_beta)


@function("moe_experts_situ_identity_up", _EXPERTS, "y", {"beta": "float"})
def _moe_experts_situ_identity_up(b, h, w13, w2, idx, w, beta):
    """moe_experts_situ with linear_beta None."""
    return moe_experts(b, h, w13, w2, idx, w, "situ", beta, None)


@function("moe_experts_silu", _EXPERTS, "y")
def _moe_experts_silu(b, h, w13, w2, idx, w):
    """Routed experts with SiLU-GLU (Kimi Linear)."""
    return moe_experts(b, h, w13, w2, idx, w, "silu")
