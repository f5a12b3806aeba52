"""Bodies of the MLP ops: `situ`, `gated_mlp_*` and the routed experts (`moe_gate_up`,
`moe_down`, `moe_experts_*`).

The expert ops pick one of two exact forms at run time (an If on the routed slot count):
  few slots (decode), N * k <= E: gather each slot's expert weights, one batched matmul;
  many slots (prefill): a Loop over the E experts, each taking the tokens routed to it
  (NonZero), one GEMM, and ScatterND(add) into the result: work grows with N * k, not N * E.
"""

from __future__ import annotations

from ..builder import Builder, loop_counter, subgraph
from . import function


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
    """bool: N * k <= E, where gathering each slot's weights beats a Loop over experts."""
    slots = b.ReduceProd(b.Shape(idx), keepdims=1)
    return b.squeeze(b.Not(b.Greater(slots, E)), 0)


def _branch(name: str, build, rank: int) -> object:
    s = Builder(name)
    out = build(s)
    return subgraph(s, name, [], [(out, "f32", rank)])


def _zeros(b: Builder, shape: str) -> str:
    return b.Expand(b.const(0.0), shape)


def gate_up_gathered(s: Builder, h: str, w13: str, idx: str) -> str:
    W = s.Gather(w13, idx, axis=0)  # [N, k, 2I, D]
    return s.squeeze(s.MatMul(W, s.unsqueeze(h, 1, 3)), -1)  # [N, k, 2I]


def down_gathered(s: Builder, a: str, w2: str, idx: str, w: str) -> str:
    W = s.Gather(w2, idx, axis=0)  # [N, k, D_out, I]
    o = s.squeeze(s.MatMul(W, s.unsqueeze(a, -1)), -1)  # [N, k, D_out]
    return s.ReduceSum(s.Mul(o, s.unsqueeze(w, -1)), s.ints([1]), keepdims=0)


@function("moe_gate_up", "h w13 idx", "gu")
def moe_gate_up(b: Builder, h, w13, idx):
    """gu[n, j] = w13[idx[n, j]] @ h[n]: h [N, D], w13 [E, 2I, D], idx [N, k] -> [N, k, 2I]."""
    E = b.shape_of(w13, 0)

    def loop(s: Builder) -> str:
        def step(t: Builder, e, pos, acc):
            hs = t.Gather(h, t.Gather(pos, t.const(0, "i64"), axis=1), axis=0)  # [M, D]
            return t.ScatterND(acc, pos, t.Gemm(hs, t.Gather(w13, e, axis=0), transB=1))
        shape = s.Concat(s.Shape(idx), s.shape_of(w13, 1), axis=0)
        return _per_expert(s, idx, E, _zeros(s, shape), 3, step)

    return b.op("If", [_few_slots(b, idx, E)], 1,
                then_branch=_branch("gather", lambda s: gate_up_gathered(s, h, w13, idx), 3),
                else_branch=_branch("loop", loop, 3))


@function("moe_down", "a w2 idx w", "y")
def moe_down(b: Builder, a, w2, idx, w):
    """y[n] = sum_j w[n, j] * w2[idx[n, j]] @ a[n, j]: a [N, k, I], w2 [E, D, I] -> [N, D]."""
    E = b.shape_of(w2, 0)

    def loop(s: Builder) -> str:
        def step(t: Builder, e, pos, acc):
            o = t.Gemm(t.GatherND(a, pos), t.Gather(w2, e, axis=0), transB=1)  # [M, D]
            o = t.Mul(o, t.unsqueeze(t.GatherND(w, pos), -1))
            rows = t.Gather(pos, t.ints([0]), axis=1)  # [M, 1]
            return t.ScatterND(acc, rows, o, reduction="add")
        shape = s.Concat(s.shape_of(a, 0), s.shape_of(w2, 1), axis=0)
        return _per_expert(s, idx, E, _zeros(s, shape), 2, step)

    return b.op("If", [_few_slots(b, idx, E)], 1,
                then_branch=_branch("gather", lambda s: down_gathered(s, a, w2, idx, w), 2),
                else_branch=_branch("loop", loop, 2))


def moe_experts(b: Builder, h, w13, w2, idx, w, act: str, beta=None, linear_beta=None) -> str:
    """y[n] = sum_j w[n, j] * w2[e] act(w13[e] h[n]), e = idx[n, j]."""
    E = b.shape_of(w13, 0)
    # attributes become values here, outside the subgraphs that read them
    beta = b.param(beta) if beta is not None else None
    linear_beta = b.param(linear_beta) if linear_beta is not None else None

    def gathered(s: Builder) -> str:
        gu = gate_up_gathered(s, h, w13, idx)
        return down_gathered(s, activation(s, gu, act, beta, linear_beta), w2, idx, w)

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

    return b.op("If", [_few_slots(b, idx, E)], 1, then_branch=_branch("gather", gathered, 2),
                else_branch=_branch("loop", loop, 2))


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
