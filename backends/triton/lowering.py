"""The Triton backend's lowering table: IR op -> one statement of the generated module.

The fused and recurrent ops call kernel templates from k3c.kernels.*.triton; GEMMs, shape
ops, indexing and reductions call torch, where a template would not win (cuBLAS GEMMs,
views that move no data, small routing reductions). Elementwise ops that fusion.py could
not put in a group (integer or boolean values, or an exponent that is not a small constant)
call torch too. An op missing here is unsupported, with the reason in REASONS.
"""

from __future__ import annotations

from collections.abc import Callable

from ...ir import Node

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


def _elementwise(n: Node, cg) -> str:
    a, b, c = ([cg.val(i) for i in n.inputs] + [None] * 3)[:3]
    if n.op == "softplus":
        return f"{cg.lhs(n)} = F.softplus({a}, {n.attrs.get('beta', 1.0)!r}, {n.attrs.get('threshold', 20.0)!r})"
    if n.op == "elu":
        return f"{cg.lhs(n)} = F.elu({a}, {n.attrs.get('alpha', 1.0)!r})"
    if n.op == "gelu":
        return f"{cg.lhs(n)} = F.gelu({a}, approximate={n.attrs.get('approximate', 'none')!r})"
    return f"{cg.lhs(n)} = {TORCH_ELEMENTWISE[n.op].format(a=a, b=b, c=c)}"


def _const(n: Node, cg) -> str:
    return f"{cg.lhs(n)} = torch.tensor({n.attrs['value']!r}, dtype={cg.torch_dtype(n.attrs['dtype'])}, device=dev)"


def _cast(n: Node, cg) -> str:
    return f"{cg.lhs(n)} = {cg.val(n.inputs[0])}.to({cg.torch_dtype(n.attrs['dtype'])})"


def _full(n: Node, cg) -> str:
    a = n.attrs
    return (f"{cg.lhs(n)} = torch.full({cg.shape(a['shape'])}, {a['value']!r}, "
            f"dtype={cg.torch_dtype(a['dtype'])}, device=dev)")


def _arange(n: Node, cg) -> str:
    a = n.attrs
    return (f"{cg.lhs(n)} = torch.arange({cg.dim(a.get('start', 0))}, {cg.dim(a['end'])}, "
            f"dtype={cg.torch_dtype(a.get('dtype', 'i64'))}, device=dev)")


def _reduce(method: str) -> Callable:
    def lower(n: Node, cg) -> str:
        return (f"{cg.lhs(n)} = {cg.val(n.inputs[0])}.{method}(dim={tuple(n.attrs['dims'])!r}, "
                f"keepdim={bool(n.attrs.get('keepdim', False))})")
    return lower


def _slice(n: Node, cg) -> str:
    a = n.attrs
    rank = cg.rank(n.inputs[0])
    d = a["dim"] % rank
    end = a["end"]
    end_s = "" if isinstance(end, int) and end >= 2**62 else cg.dim(end)
    start_s = "" if a.get("start", 0) == 0 else cg.dim(a["start"])
    step_s = "" if a.get("step", 1) == 1 else f":{a['step']}"
    index = ", ".join([":"] * d + [f"{start_s}:{end_s}{step_s}"])
    return f"{cg.lhs(n)} = {cg.val(n.inputs[0])}[{index}].contiguous()"


def _call(fn: str, module: str | None = None, attrs: tuple[str, ...] = (), kw: tuple[str, ...] = ()) -> Callable:
    """`lhs = fn(inputs..., attr values..., key=attr...)`; fn from `module` when given."""
    def lower(n: Node, cg) -> str:
        name = cg.use(module, fn) if module else fn
        args = [cg.val(i) for i in n.inputs] + [cg.attr(n, a) for a in attrs]
        args += [f"{k}={cg.attr(n, k)}" for k in kw]
        return f"{cg.lhs(n)} = {name}({', '.join(args)})"
    return lower


def _layer_norm(n: Node, cg) -> str:
    x, *params = [cg.val(i) for i in n.inputs]
    w, b = (params + ["None", "None"])[:2]
    return f"{cg.lhs(n)} = F.layer_norm({x}, ({cg.dim(cg.last_dim(n))},), {w}, {b}, {cg.attr(n, 'eps')})"


def _gated_mlp(n: Node, cg) -> str:
    fn = cg.use("k3c.kernels.situ.triton", "gated_mlp")
    x, w = (cg.val(i) for i in n.inputs)
    return (f"{cg.lhs(n)} = {fn}({x}, {w}, {cg.attr(n, 'act')}, {cg.attr(n, 'beta')}, "
            f"{cg.attr(n, 'linear_beta')})  # the gate/up GEMM with its activation epilogue")


def _chunk_prepare(n: Node, cg) -> str:
    fn = cg.use(KDA, "chunk_prepare")
    args = [cg.val(i) for i in n.inputs] + ["None"] * (5 - len(n.inputs))
    return f"{cg.lhs(n)} = {fn}({', '.join(args)}, {cg.attr(n, 'chunk_size')}, {cg.attr(n, 'gate')})  # (a)"


def _chunk_output(n: Node, cg) -> str:
    fn = cg.use(KDA, "chunk_output")
    args = ", ".join(cg.val(i) for i in n.inputs)
    return f"{cg.lhs(n)} = {fn}({args}, {cg.attr(n, 'scale')}, {cg.attr(n, 'T')})  # (c)"


def _chunk_state_scan(n: Node, cg) -> str:
    return _call("chunk_state_scan", KDA)(n, cg) + "  # (b)"


LOWERINGS: dict[str, Callable] = {
    **{op: _elementwise for op in TORCH_ELEMENTWISE},
    "softplus": _elementwise, "elu": _elementwise, "gelu": _elementwise,
    "const": _const, "cast": _cast, "full": _full, "arange": _arange,
    "linear": _call("F.linear"),
    "matmul": _call("torch.matmul"),
    "embedding": lambda n, cg: f"{cg.lhs(n)} = F.embedding({cg.val(n.inputs[1])}, {cg.val(n.inputs[0])})",
    "reshape": lambda n, cg: f"{cg.lhs(n)} = {cg.val(n.inputs[0])}.reshape({cg.shape(n.attrs['shape'])})",
    "permute": lambda n, cg: f"{cg.lhs(n)} = {cg.val(n.inputs[0])}.permute{tuple(n.attrs['perm'])!r}.contiguous()",
    "expand": lambda n, cg: f"{cg.lhs(n)} = {cg.val(n.inputs[0])}.expand({cg.shape(n.attrs['shape'])})",
    "slice": _slice,
    "concat": lambda n, cg: f"{cg.lhs(n)} = torch.cat([{', '.join(map(cg.val, n.inputs))}], dim={n.attrs['dim']})",
    "stack": lambda n, cg: f"{cg.lhs(n)} = torch.stack([{', '.join(map(cg.val, n.inputs))}], dim={n.attrs['dim']})",
    "split": lambda n, cg: (f"{cg.lhs(n)} = torch.split({cg.val(n.inputs[0])}, "
                            f"[{', '.join(cg.dim(s) for s in n.attrs['sizes'])}], dim={n.attrs['dim']})"),
    "reduce_sum": _reduce("sum"), "reduce_mean": _reduce("mean"), "reduce_max": _reduce("amax"),
    "softmax": lambda n, cg: f"{cg.lhs(n)} = torch.softmax({cg.val(n.inputs[0])}, dim={n.attrs['dim']})",
    "topk": lambda n, cg: (f"{cg.lhs(n)} = torch.topk({cg.val(n.inputs[0])}, {n.attrs['k']}, "
                           f"dim={n.attrs.get('dim', -1)})"),
    "gather": lambda n, cg: (f"{cg.lhs(n)} = torch.gather({cg.val(n.inputs[0])}, {n.attrs['dim']}, "
                             f"{cg.val(n.inputs[1])})"),
    "layer_norm": _layer_norm,
    # Triton templates
    "rms_norm": lambda n, cg: (f"{cg.lhs(n)} = {cg.use('k3c.kernels.gated_rmsnorm.triton', 'rms_norm')}("
                               f"{cg.val(n.inputs[0])}, {cg.val(n.inputs[1]) if len(n.inputs) > 1 else 'None'}, "
                               f"{cg.attr(n, 'eps')})"),
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
    "moe_gate_up": _call("moe_gate_up", "k3c.kernels.moe.triton"),
    "moe_down": _call("moe_down", "k3c.kernels.moe.triton"),
    "moe_experts": _call("moe_experts", "k3c.kernels.moe.triton", attrs=("act", "beta", "linear_beta")),
}

# Ops whose statement calls a Triton kernel template (the rest call torch or join a fused group).
KERNEL_OPS = frozenset({"rms_norm", "short_conv", "kda", "gated_delta_rule", "delta_rule", "linear_attention",
                        "chunk_prepare", "chunk_state_scan", "chunk_output", "causal_attention", "mla_attention",
                        "mla_attention_absorbed", "attn_res_mix", "situ", "gated_mlp", "moe_gate_up", "moe_down",
                        "moe_experts"})

# Ops of the op table the Triton backend does not lower, with the reason a user sees.
REASONS: dict[str, str] = {}
