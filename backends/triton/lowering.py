"""The Triton backend's lowerings: IR op -> one statement of the generated module, each
`fn(cg, node) -> str` in the `triton` table of k3c.backends.tables.

The fused and recurrent ops call kernel templates from k3c.kernels.*.triton; GEMMs, shape
ops, indexing and reductions call torch, where a template would not win (cuBLAS GEMMs,
views that move no data, small routing reductions). Elementwise ops that fusion.py could
not put in a group (integer or boolean values, or an exponent that is not a small constant)
call torch too.
"""

from __future__ import annotations

from collections.abc import Callable

from ...ir import Node
from ..signs import check_decays
from ..tables import builtin
from .elementwise import EXPR, FLOATS

KDA = "k3c.kernels.kda.triton"

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


def _elementwise(cg, n: Node) -> str:
    a, b, c = ([cg.val(i) for i in n.inputs] + [None] * 3)[:3]
    if n.op == "softplus":
        return f"{cg.lhs(n)} = F.softplus({a}, {cg.attr(n, 'beta')}, {cg.attr(n, 'threshold')})"
    if n.op == "elu":
        return f"{cg.lhs(n)} = F.elu({a}, {cg.attr(n, 'alpha')})"
    if n.op == "gelu":
        return f"{cg.lhs(n)} = F.gelu({a}, approximate={cg.attr(n, 'approximate')})"
    return f"{cg.lhs(n)} = {TORCH_ELEMENTWISE[n.op].format(a=a, b=b, c=c)}"


def _const(cg, n: Node) -> str:
    return f"{cg.lhs(n)} = torch.tensor({n.attrs['value']!r}, dtype={cg.torch_dtype(n.attrs['dtype'])}, device=dev)"


def _cast(cg, n: Node) -> str:
    return f"{cg.lhs(n)} = {cg.val(n.inputs[0])}.to({cg.torch_dtype(n.attrs['dtype'])})"


def _full(cg, n: Node) -> str:
    a = n.attrs
    return (f"{cg.lhs(n)} = torch.full({cg.shape(a['shape'])}, {a['value']!r}, "
            f"dtype={cg.torch_dtype(a['dtype'])}, device=dev)")


def _arange(cg, n: Node) -> str:
    return (f"{cg.lhs(n)} = torch.arange({cg.attr(n, 'start')}, {cg.attr(n, 'end')}, "
            f"dtype={cg.torch_dtype(cg.attrs(n)['dtype'])}, device=dev)")


def _reduce(method: str) -> Callable:
    def lower(cg, n: Node) -> str:
        a = cg.attrs(n)
        return f"{cg.lhs(n)} = {cg.val(n.inputs[0])}.{method}(dim={tuple(a['dims'])!r}, keepdim={a['keepdim']!r})"
    return lower


def _slice(cg, n: Node) -> str:
    a = cg.attrs(n)
    rank = cg.rank(n.inputs[0])
    d = a["dim"] % rank
    end_s = cg.dim(a["end"])
    start_s = "" if a["start"] == 0 else cg.dim(a["start"])
    step_s = "" if a["step"] == 1 else f":{a['step']}"
    index = ", ".join([":"] * d + [f"{start_s}:{end_s}{step_s}"])
    return f"{cg.lhs(n)} = {cg.val(n.inputs[0])}[{index}].contiguous()"


def _call(fn: str, module: str | None = None, attrs: tuple[str, ...] = (), kw: tuple[str, ...] = ()) -> Callable:
    """`lhs = fn(inputs..., attr values..., key=attr...)`; fn from `module` when given."""
    def lower(cg, n: Node) -> str:
        name = cg.use(module, fn) if module else fn
        args = [cg.val(i) for i in n.inputs] + [cg.attr(n, a) for a in attrs]
        args += [f"{k}={cg.attr(n, k)}" for k in kw]
        return f"{cg.lhs(n)} = {name}({', '.join(args)})"
    return lower


def _layer_norm(cg, n: Node) -> str:
    x, *params = [cg.val(i) for i in n.inputs]
    w, b = (params + ["None", "None"])[:2]
    return f"{cg.lhs(n)} = F.layer_norm({x}, ({cg.dim(cg.last_dim(n))},), {w}, {b}, {cg.attr(n, 'eps')})"


def _gated_mlp(cg, n: Node) -> str:
    fn = cg.use("k3c.kernels.situ.triton", "gated_mlp")
    x, w = (cg.val(i) for i in n.inputs)
    return (f"{cg.lhs(n)} = {fn}({x}, {w}, {cg.attr(n, 'act')}, {cg.attr(n, 'beta')}, "
            f"{cg.attr(n, 'linear_beta')})  # the gate/up GEMM with its activation epilogue")


def _mxfp4_experts(fn: str, attrs: tuple[str, ...] = ()) -> Callable:
    """An MXFP4 expert op: the kernels that decode the codes in registers (kernels/moe/triton/
    mxfp4.py), or, on a target whose MMA multiplies MX operands with their scales (sm_100),
    `tl.dot_scaled` (mxfp4_scaled.py) with the activations the module chose (codegen's
    `expert_activations`: BF16, or MXFP8 for the block-scaled MMA when asked for)."""
    def lower(cg, n: Node) -> str:
        acts = cg.expert_activations(n)
        if acts is None:
            return _call(fn, "k3c.kernels.moe.triton", attrs=attrs)(cg, n)
        line = _call(fn + "_scaled", "k3c.kernels.moe.triton", attrs=attrs)(cg, n)
        return f"{line[:-1]}, activations={acts!r})"  # the call's last argument, by keyword
    return lower


def _chunk_prepare(cg, n: Node) -> str:
    fn = cg.use(KDA, "chunk_prepare")
    args = [cg.val(i) for i in n.inputs] + ["None"] * (5 - len(n.inputs))
    return f"{cg.lhs(n)} = {fn}({', '.join(args)}, {cg.attr(n, 'chunk_size')}, {cg.attr(n, 'gate')})  # (a)"


def _chunk_output(cg, n: Node) -> str:
    fn = cg.use(KDA, "chunk_output")
    args = ", ".join(cg.val(i) for i in n.inputs)
    return f"{cg.lhs(n)} = {fn}({args}, {cg.attr(n, 'scale')}, {cg.attr(n, 'T')})  # (c)"


def _chunk_state_scan(cg, n: Node) -> str:
    return _call("chunk_state_scan", KDA)(cg, n) + "  # (b)"


_RULES: dict[str, Callable] = {
    **{op: _elementwise for op in TORCH_ELEMENTWISE},
    "softplus": _elementwise, "elu": _elementwise, "gelu": _elementwise,
    "const": _const, "cast": _cast, "full": _full, "arange": _arange,
    "linear": _call("F.linear"),
    "matmul": _call("torch.matmul"),
    "embedding": lambda cg, n: f"{cg.lhs(n)} = F.embedding({cg.val(n.inputs[1])}, {cg.val(n.inputs[0])})",
    "reshape": lambda cg, n: f"{cg.lhs(n)} = {cg.val(n.inputs[0])}.reshape({cg.shape(n.attrs['shape'])})",
    "permute": lambda cg, n: f"{cg.lhs(n)} = {cg.val(n.inputs[0])}.permute{tuple(n.attrs['perm'])!r}.contiguous()",
    "expand": lambda cg, n: f"{cg.lhs(n)} = {cg.val(n.inputs[0])}.expand({cg.shape(n.attrs['shape'])})",
    "slice": _slice,
    "concat": lambda cg, n: f"{cg.lhs(n)} = torch.cat([{', '.join(map(cg.val, n.inputs))}], dim={n.attrs['dim']})",
    "stack": lambda cg, n: f"{cg.lhs(n)} = torch.stack([{', '.join(map(cg.val, n.inputs))}], dim={cg.attr(n, 'dim')})",
    "split": lambda cg, n: (f"{cg.lhs(n)} = torch.split({cg.val(n.inputs[0])}, "
                            f"[{', '.join(cg.dim(s) for s in n.attrs['sizes'])}], dim={n.attrs['dim']})"),
    "reduce_sum": _reduce("sum"), "reduce_mean": _reduce("mean"), "reduce_max": _reduce("amax"),
    "softmax": lambda cg, n: f"{cg.lhs(n)} = torch.softmax({cg.val(n.inputs[0])}, dim={n.attrs['dim']})",
    "topk": _call("topk", "k3c.kernels.topk", attrs=("k", "dim")),  # ties: the lower index first
    "gather": lambda cg, n: (f"{cg.lhs(n)} = torch.gather({cg.val(n.inputs[0])}, {n.attrs['dim']}, "
                             f"{cg.val(n.inputs[1])})"),
    "layer_norm": _layer_norm,
    # Triton templates
    "rms_norm": lambda cg, n: (f"{cg.lhs(n)} = {cg.use('k3c.kernels.gated_rmsnorm.triton', 'rms_norm')}("
                               f"{cg.val(n.inputs[0])}, {cg.val(n.inputs[1]) if len(n.inputs) > 1 else 'None'}, "
                               f"{cg.attr(n, 'eps')})"),
    "gated_rms_norm": lambda cg, n: (f"{cg.lhs(n)} = {cg.use('k3c.kernels.gated_rmsnorm.triton', 'gated_rmsnorm')}("
                                     f"{cg.val(n.inputs[0])}, {cg.val(n.inputs[2])}, {cg.val(n.inputs[1])}, "
                                     f"{cg.attr(n, 'eps')})"),
    "l2norm": _call("l2norm", "k3c.kernels.gated_rmsnorm.triton", attrs=("eps",)),
    "short_conv": _call("short_conv", "k3c.kernels.short_conv.triton", attrs=("activation",)),
    "kda": _call("rt.kda", attrs=("scale",)),
    "gated_delta_rule": _call("rt.gated_delta_rule", attrs=("scale",)),
    "delta_rule": _call("rt.delta_rule", attrs=("scale",)),
    "linear_attention": _call("rt.linear_attention", attrs=("scale",)),
    "chunk_prepare": _chunk_prepare,
    "chunk_state_scan": _chunk_state_scan,
    "chunk_output": _chunk_output,
    "causal_attention": _call("causal_attention", "k3c.kernels.attention.triton", attrs=("scale",)),
    "mla_attention": _call("mla_attention", "k3c.kernels.mla.triton", attrs=("v_head_dim", "scale")),
    "mla_attention_absorbed": _call("mla_attention_absorbed", "k3c.kernels.mla.triton", attrs=("scale",)),
    "attn_res_mix": _call("attn_res_mix", "k3c.kernels.attn_res.triton", attrs=("eps",)),
    "situ": _call("situ", "k3c.kernels.situ.triton", attrs=("beta", "linear_beta")),
    "gated_mlp": _gated_mlp,
    "mxfp4_decode": lambda cg, n: (f"{cg.lhs(n)} = {cg.use('k3c.kernels.mxfp4', 'decode', 'mxfp4_decode')}("
                                   f"{cg.val(n.inputs[0])}, {cg.val(n.inputs[1])}, "
                                   f"{cg.torch_dtype(cg.attrs(n)['dtype'])})"),
    "moe_gate_up": _call("moe_gate_up", "k3c.kernels.moe.triton"),
    "moe_down": _call("moe_down", "k3c.kernels.moe.triton"),
    "moe_experts": _call("moe_experts", "k3c.kernels.moe.triton", attrs=("act", "beta", "linear_beta")),
    # MXFP4 experts: decoded in registers, or on sm_100's block-scaled MMA (_mxfp4_experts)
    "moe_gate_up_mxfp4": _mxfp4_experts("moe_gate_up_mxfp4"),
    "moe_down_mxfp4": _mxfp4_experts("moe_down_mxfp4"),
    "moe_experts_mxfp4": _mxfp4_experts("moe_experts_mxfp4", attrs=("act", "beta", "linear_beta")),
}

# Ops whose statement calls a Triton kernel template (the rest call torch or join a fused group).
KERNEL_OPS = frozenset({"rms_norm", "gated_rms_norm", "l2norm", "short_conv", "kda", "gated_delta_rule",
                        "delta_rule", "linear_attention", "chunk_prepare", "chunk_state_scan", "chunk_output",
                        "causal_attention", "mla_attention", "mla_attention_absorbed", "attn_res_mix", "situ",
                        "gated_mlp", "moe_gate_up", "moe_down", "moe_experts", "moe_gate_up_mxfp4", "moe_down_mxfp4",
                        "moe_experts_mxfp4"})
# Recurrent-state ops whose kernels hold a [K, BV] state block in registers.
MAX_HEAD_DIM = 256


def _head_dims(node: Node, graph) -> tuple[bool, str]:
    """The recurrent kernels hold a [K, BV] state block in registers, and the chunk kernels
    clamp exponents at 0 (a log-decay must be provably <= 0)."""
    K = graph.types[node.inputs[0]].shape[-1]
    V = graph.types[node.inputs[2]].shape[-1]
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


_SUPPORTS = {op: _head_dims for op in ("kda", "gated_delta_rule", "delta_rule", "linear_attention")}
_SUPPORTS["chunk_prepare"] = _chunk_prepare_fits

for _op, _fn in _RULES.items():
    _kind = "kernel" if _op in KERNEL_OPS else "fused" if _op in EXPR else "torch"
    builtin("triton", _op, kind=_kind, supports=_SUPPORTS.get(_op))(_fn)
