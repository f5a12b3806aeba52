"""The Triton backend's lowerings: IR op -> one statement of the generated module, each
`fn(cg, node, **inputs) -> str` in the `triton` table of k3c.backends.tables.

The walker (codegen.py) passes a node's inputs as keywords named by the op's spec (IR
values; `cg.val(v)` is one's Python expression, None an absent optional input).

The fused and recurrent ops call kernel templates from k3c.kernels.*.triton; GEMMs, shape
ops, indexing and reductions call torch, where a template would not win (cuBLAS GEMMs,
views that move no data, small routing reductions). Elementwise ops that fusion.py could
not put in a group (integer or boolean values, or an exponent that is not a small constant)
call torch too.
"""

from __future__ import annotations

from collections.abc import Callable

from ...ir import OPS, Node, named_inputs
from ...ir.ops.delta_family import FAMILY
from ..signs import check_decays
from ..tables import builtin, builtin_family
from .elementwise import FLOATS

DELTA = "k3c.kernels.delta.triton"  # the delta family's kernels

# op -> torch expression over the operands (for ops a generated kernel does not take)
TORCH_ELEMENTWISE: dict[str, str] = {
    "neg": "torch.neg({a})", "exp": "torch.exp({a})", "log": "torch.log({a})", "sqrt": "torch.sqrt({a})",
    "rsqrt": "torch.rsqrt({a})", "abs": "torch.abs({a})", "reciprocal": "torch.reciprocal({a})",
    "sigmoid": "torch.sigmoid({a})", "tanh": "torch.tanh({a})", "relu": "torch.relu({a})", "silu": "F.silu({a})",
    "add": "torch.add({a}, {b})", "sub": "torch.sub({a}, {b})", "mul": "torch.mul({a}, {b})",
    "div": "torch.div({a}, {b})", "maximum": "torch.maximum({a}, {b})", "minimum": "torch.minimum({a}, {b})",
    "less": "torch.lt({a}, {b})", "greater": "torch.gt({a}, {b})", "where": "torch.where({a}, {b}, {c})",
    "pow": "torch.pow({a}, {b})",
}


# op -> its Triton expression inside a generated elementwise kernel (elementwise.py), over the
# operands a, b, c (already fp32 blocks) and its float attributes by name: the `expr` of the
# op's table entry, so the support matrix ("fused") and the planner read the same row.
FUSED_EXPR: dict[str, str] = {
    "neg": "-{a}",
    "exp": "tl.exp({a})",
    "log": "tl.log({a})",
    "sqrt": "tl.sqrt({a})",
    "rsqrt": "tl.rsqrt({a})",
    "abs": "tl.abs({a})",
    "reciprocal": "1.0 / {a}",
    "sigmoid": "tl.sigmoid({a})",
    "tanh": "tanh({a})",
    "relu": "tl.maximum({a}, 0.0)",
    "silu": "{a} * tl.sigmoid({a})",
    "softplus": "softplus({a}, {beta}, {threshold})",  # kernels/common/triton/stable.py
    "elu": "tl.where({a} > 0, {a}, {alpha} * (tl.exp({a}) - 1.0))",
    "gelu": "0.5 * {a} * (1.0 + tl.math.erf({a} * 0.7071067811865476))",
    "add": "{a} + {b}",
    "sub": "{a} - {b}",
    "mul": "{a} * {b}",
    "div": "{a} / {b}",
    "maximum": "tl.maximum({a}, {b})",
    "minimum": "tl.minimum({a}, {b})",
    "less": "{a} < {b}",
    "greater": "{a} > {b}",
    "where": "tl.where({a}, {b}, {c})",
}


def _elementwise(cg, node: Node, **inputs) -> str:  # x; a b; or cond a b: in the spec's order
    a, b, c = ([cg.val(v) for v in inputs.values()] + [None] * 3)[:3]
    if node.op == "softplus":
        return f"{cg.lhs(node)} = F.softplus({a}, {cg.attr(node, 'beta')}, {cg.attr(node, 'threshold')})"
    if node.op == "elu":
        return f"{cg.lhs(node)} = F.elu({a}, {cg.attr(node, 'alpha')})"
    if node.op == "gelu":
        return f"{cg.lhs(node)} = F.gelu({a}, approximate={cg.attr(node, 'approximate')})"
    return f"{cg.lhs(node)} = {TORCH_ELEMENTWISE[node.op].format(a=a, b=b, c=c)}"


def _const(cg, node: Node) -> str:
    return (f"{cg.lhs(node)} = torch.tensor({node.attrs['value']!r}, dtype={cg.torch_dtype(node.attrs['dtype'])}, "
            "device=dev)")


def _cast(cg, node: Node, x) -> str:
    return f"{cg.lhs(node)} = {cg.val(x)}.to({cg.torch_dtype(node.attrs['dtype'])})"


def _full(cg, node: Node) -> str:
    a = node.attrs
    return (f"{cg.lhs(node)} = torch.full({cg.shape(a['shape'])}, {a['value']!r}, "
            f"dtype={cg.torch_dtype(a['dtype'])}, device=dev)")


def _arange(cg, node: Node) -> str:
    return (f"{cg.lhs(node)} = torch.arange({cg.attr(node, 'start')}, {cg.attr(node, 'end')}, "
            f"dtype={cg.torch_dtype(cg.attrs(node)['dtype'])}, device=dev)")


def _reduce(method: str) -> Callable:
    def lower(cg, node: Node, x) -> str:
        a = cg.attrs(node)
        return f"{cg.lhs(node)} = {cg.val(x)}.{method}(dim={tuple(a['dims'])!r}, keepdim={a['keepdim']!r})"
    return lower


def _slice(cg, node: Node, x) -> str:
    a = cg.attrs(node)
    rank = cg.rank(x)
    d = a["dim"] % rank
    end_s = cg.dim(a["end"])
    start_s = "" if a["start"] == 0 else cg.dim(a["start"])
    step_s = "" if a["step"] == 1 else f":{a['step']}"
    index = ", ".join([":"] * d + [f"{start_s}:{end_s}{step_s}"])
    return f"{cg.lhs(node)} = {cg.val(x)}[{index}].contiguous()"


def _call(fn: str, module: str | None = None, attrs: tuple[str, ...] = (), kw: tuple[str, ...] = ()) -> Callable:
    """`lhs = fn(inputs..., attr values..., key=attr...)`: the inputs in the spec's order (an
    absent optional one left out); fn from `module` when given."""
    def lower(cg, node: Node, **inputs) -> str:
        name = cg.use(module, fn) if module else fn
        args = [cg.val(v) for v in inputs.values() if v is not None] + [cg.attr(node, a) for a in attrs]
        args += [f"{k}={cg.attr(node, k)}" for k in kw]
        return f"{cg.lhs(node)} = {name}({', '.join(args)})"
    return lower


def _layer_norm(cg, node: Node, x, w, b) -> str:
    w, b = (cg.val(v) if v is not None else "None" for v in (w, b))
    return (f"{cg.lhs(node)} = F.layer_norm({cg.val(x)}, ({cg.dim(cg.graph.types[x].shape[-1])},), {w}, {b}, "
            f"{cg.attr(node, 'eps')})")


def _gated_mlp(cg, node: Node, x, w) -> str:
    fn = cg.use("k3c.kernels.situ.triton", "gated_mlp")
    return (f"{cg.lhs(node)} = {fn}({cg.val(x)}, {cg.val(w)}, {cg.attr(node, 'act')}, {cg.attr(node, 'beta')}, "
            f"{cg.attr(node, 'linear_beta')})  # the gate/up GEMM with its activation epilogue")


def _mxfp4_experts(fn: str, attrs: tuple[str, ...] = ()) -> Callable:
    """An MXFP4 expert op: the kernels that decode the codes in registers (kernels/moe/triton/
    mxfp4.py), or, on a target whose MMA multiplies MX operands with their scales (sm_100),
    `tl.dot_scaled` (mxfp4_scaled.py) with the activations the module chose (codegen's
    `expert_activations`: BF16, or MXFP8 for the block-scaled MMA when asked for)."""
    def lower(cg, node: Node, **inputs) -> str:
        acts = cg.expert_activations(node)
        if acts is None:
            return _call(fn, "k3c.kernels.moe.triton", attrs=attrs)(cg, node, **inputs)
        line = _call(fn + "_scaled", "k3c.kernels.moe.triton", attrs=attrs)(cg, node, **inputs)
        return f"{line[:-1]}, activations={acts!r})"  # the call's last argument, by keyword
    return lower


def _delta_member(cg, node: Node, **inputs) -> str:
    """Any delta-family op token by token: the family's recurrent kernel, told the op's gate
    kind (its spec's, ir/ops/delta_family.py); the inputs by their names."""
    fn = cg.use(DELTA, "recurrent", "delta_recurrent")
    args = [f"{name}={cg.val(x)}" for name, x in inputs.items() if x is not None]
    return f"{cg.lhs(node)} = {fn}({', '.join(args)}, scale={cg.attr(node, 'scale')}, gate={OPS[node.op].delta.gate!r})"


def _chunk_prepare(cg, node: Node, q, k, v, beta, g) -> str:
    fn = cg.use(DELTA, "chunk_prepare")
    args = [cg.val(x) if x is not None else "None" for x in (q, k, v, beta, g)]
    return f"{cg.lhs(node)} = {fn}({', '.join(args)}, {cg.attr(node, 'chunk_size')}, {cg.attr(node, 'gate')})  # (a)"


def _chunk_output(cg, node: Node, q_decayed, aqk, v_new, start_states) -> str:
    fn = cg.use(DELTA, "chunk_output")
    args = ", ".join(cg.val(x) for x in (q_decayed, aqk, v_new, start_states))
    return f"{cg.lhs(node)} = {fn}({args}, {cg.attr(node, 'scale')}, {cg.attr(node, 'T')})  # (c)"


def _chunk_state_scan(cg, node: Node, **inputs) -> str:
    return _call("chunk_state_scan", DELTA)(cg, node, **inputs) + "  # (b)"


_RULES: dict[str, Callable] = {
    **{op: _elementwise for op in TORCH_ELEMENTWISE},
    "softplus": _elementwise, "elu": _elementwise, "gelu": _elementwise,
    "const": _const, "cast": _cast, "full": _full, "arange": _arange,
    "linear": _call("F.linear"),
    "matmul": _call("torch.matmul"),
    "embedding": lambda cg, node, weight, ids: f"{cg.lhs(node)} = F.embedding({cg.val(ids)}, {cg.val(weight)})",
    "reshape": lambda cg, node, x: f"{cg.lhs(node)} = {cg.val(x)}.reshape({cg.shape(node.attrs['shape'])})",
    "permute": lambda cg, node, x: f"{cg.lhs(node)} = {cg.val(x)}.permute{tuple(node.attrs['perm'])!r}.contiguous()",
    "expand": lambda cg, node, x: f"{cg.lhs(node)} = {cg.val(x)}.expand({cg.shape(node.attrs['shape'])})",
    "slice": _slice,
    "concat": lambda cg, node, xs: (f"{cg.lhs(node)} = torch.cat([{', '.join(map(cg.val, xs))}], "
                                    f"dim={node.attrs['dim']})"),
    "stack": lambda cg, node, xs: (f"{cg.lhs(node)} = torch.stack([{', '.join(map(cg.val, xs))}], "
                                   f"dim={cg.attr(node, 'dim')})"),
    "split": lambda cg, node, x: (f"{cg.lhs(node)} = torch.split({cg.val(x)}, "
                               f"[{', '.join(cg.dim(s) for s in node.attrs['sizes'])}], dim={node.attrs['dim']})"),
    "reduce_sum": _reduce("sum"), "reduce_mean": _reduce("mean"), "reduce_max": _reduce("amax"),
    "softmax": lambda cg, node, x: f"{cg.lhs(node)} = torch.softmax({cg.val(x)}, dim={node.attrs['dim']})",
    "topk": _call("topk", "k3c.kernels.topk", attrs=("k", "dim")),  # ties: the lower index first
    "gather": lambda cg, node, x, idx: (f"{cg.lhs(node)} = torch.gather({cg.val(x)}, {node.attrs['dim']}, "
                                        f"{cg.val(idx)})"),
    "layer_norm": _layer_norm,
    # Triton templates
    "rms_norm": lambda cg, node, x, w: (f"{cg.lhs(node)} = {cg.use('k3c.kernels.gated_rmsnorm.triton', 'rms_norm')}("
                                     f"{cg.val(x)}, {cg.val(w) if w is not None else 'None'}, {cg.attr(node, 'eps')})"),
    "gated_rms_norm": _call("gated_rmsnorm", "k3c.kernels.gated_rmsnorm.triton", attrs=("eps",)),
    "l2norm": _call("l2norm", "k3c.kernels.gated_rmsnorm.triton", attrs=("eps",)),
    "short_conv": _call("short_conv", "k3c.kernels.short_conv.triton", attrs=("activation",)),
    "kda_decode_step": _call("kda_decode_step", "k3c.kernels.kda_decode.triton",
                             kw=("scale", "gate", "lower_bound", "activation", "qk_eps", "eps")),
    "chunk_prepare": _chunk_prepare,
    "chunk_state_scan": _chunk_state_scan,
    "chunk_output": _chunk_output,
    "causal_attention": _call("causal_attention", "k3c.kernels.attention.triton", attrs=("scale",)),
    "mla_attention": _call("mla_attention", "k3c.kernels.mla.triton", attrs=("v_head_dim", "scale")),
    "mla_attention_absorbed": _call("mla_attention_absorbed", "k3c.kernels.mla.triton", attrs=("scale",)),
    "attn_res_mix": _call("attn_res_mix", "k3c.kernels.attn_res.triton", attrs=("eps",)),
    "situ": _call("situ", "k3c.kernels.situ.triton", attrs=("beta", "linear_beta")),
    "gated_mlp": _gated_mlp,
    "mxfp4_decode": lambda cg, node, packed, scale: (
        f"{cg.lhs(node)} = {cg.use('k3c.kernels.mxfp4', 'decode', 'mxfp4_decode')}("
        f"{cg.val(packed)}, {cg.val(scale)}, {cg.torch_dtype(cg.attrs(node)['dtype'])})"),
    "moe_gate_up": _call("moe_gate_up", "k3c.kernels.moe.triton"),
    "moe_down": _call("moe_down", "k3c.kernels.moe.triton"),
    "moe_experts": _call("moe_experts", "k3c.kernels.moe.triton", attrs=("act", "beta", "linear_beta")),
    # MXFP4 experts: decoded in registers, or on sm_100's block-scaled MMA (_mxfp4_experts)
    "moe_gate_up_mxfp4": _mxfp4_experts("moe_gate_up_mxfp4"),
    "moe_down_mxfp4": _mxfp4_experts("moe_down_mxfp4"),
    "moe_experts_mxfp4": _mxfp4_experts("moe_experts_mxfp4", attrs=("act", "beta", "linear_beta")),
}

# Ops whose statement calls a Triton kernel template (the rest call torch or join a fused group).
KERNEL_OPS = frozenset({"rms_norm", "gated_rms_norm", "l2norm", "short_conv", "kda_decode_step", "chunk_prepare",
                        "chunk_state_scan", "chunk_output",
                        "causal_attention", "mla_attention", "mla_attention_absorbed", "attn_res_mix", "situ",
                        "gated_mlp", "moe_gate_up", "moe_down", "moe_experts", "moe_gate_up_mxfp4", "moe_down_mxfp4",
                        "moe_experts_mxfp4"})
# Recurrent-state ops whose kernels hold a [K, BV] state block in registers.
MAX_HEAD_DIM = 256


def _head_dims(node: Node, graph) -> tuple[bool, str]:
    """The recurrent kernels hold a [K, BV] state block in registers, and the chunk kernels
    clamp exponents at 0 (a log-decay must be provably <= 0)."""
    x = named_inputs(node)
    K, V = graph.types[x["q"]].shape[-1], graph.types[x["v"]].shape[-1]
    if not all(isinstance(d, int) and d <= MAX_HEAD_DIM for d in (K, V)):
        return False, f"head dims K={K}, V={V}: the Triton kernels take static head dims up to {MAX_HEAD_DIM}"
    if any(graph.types[i].dtype not in FLOATS for i in node.inputs):
        return False, "the Triton kernels take floating-point inputs"
    return check_decays(graph, node, "Triton")


def _chunk_prepare_fits(node: Node, graph) -> tuple[bool, str]:
    ok, why = _head_dims(node, graph)
    C = node.attrs["chunk_size"]
    if ok and (C < 16 or C & (C - 1)):
        return False, f"chunk_size {C}: the Triton chunk kernels need a power of two >= 16"
    return ok, why


def _decode_step_fits(node: Node, graph) -> tuple[bool, str]:
    """KDA's fused decode step holds a [K, V] state block and the whole value row (its norm)
    in one program: static head dims up to MAX_HEAD_DIM."""
    x = named_inputs(node)
    K, V = graph.types[x["f"]].shape[-1], graph.types[x["o_gate"]].shape[-1]
    if not all(isinstance(d, int) and d <= MAX_HEAD_DIM for d in (K, V)):
        return False, f"head dims K={K}, V={V}: the Triton kernels take static head dims up to {MAX_HEAD_DIM}"
    return True, ""


_SUPPORTS = {"chunk_prepare": _chunk_prepare_fits, "kda_decode_step": _decode_step_fits}

for _op, _fn in _RULES.items():
    _kind = "kernel" if _op in KERNEL_OPS else "fused" if _op in FUSED_EXPR else "torch"
    # floats=None: every float dtype (the kernel templates compute in fp32 registers)
    builtin("triton", _op, kind=_kind, supports=_SUPPORTS.get(_op), expr=FUSED_EXPR.get(_op), floats=None)(_fn)
builtin_family("triton", FAMILY, kind="kernel", supports=_head_dims, floats=None)(_delta_member)
