"""The frontend's table: one small builder per aten overload or k3c custom op.

A builder takes the Translator and the fx node's arguments and returns the IR value (or
values) the node produces. Ops kept whole on purpose (not decomposed): linear, rms_norm,
layer_norm, silu, gelu, softplus, elu, softmax, embedding, and every `torch.ops.k3c` op,
so that backends can map them onto fused kernels or standard ONNX ops.
"""

from __future__ import annotations

import torch

from ..ir.ops import OPS, torch_ops
from ..ir.types import dtype_name
from .translate import CaptureError, Translator

aten = torch.ops.aten
TABLE: dict = {}


def builds(*targets):
    def register(fn):
        for t in targets:
            TABLE[t] = fn
        return fn
    return register


# ---- identities and metadata-only nodes -------------------------------------------------
@builds(aten.contiguous.default, aten.clone.default, aten.alias.default, aten.detach.default,
        aten.lift_fresh_copy.default)
def _identity(tr: Translator, x, *args, **kwargs):
    return tr.value(x)


@builds(aten._assert_tensor_metadata.default, aten._assert_scalar.default,
        aten.sym_constrain_range_for_size.default)
def _drop(tr: Translator, *args, **kwargs):
    return None


# ---- elementwise ------------------------------------------------------------------------
def _operand(tr: Translator, x, dtype: str) -> str:
    if isinstance(x, torch.fx.Node):
        return tr.cast(tr.value(x), dtype)
    return tr.const(float(x) if dtype.startswith(("f", "bf")) else int(x), dtype)


def _binary(op: str, swap: bool = False):
    def build(tr: Translator, a, b, *, alpha=1, rounding_mode=None):
        if rounding_mode is not None:
            raise CaptureError(f"div with rounding_mode={rounding_mode!r} is not supported at {tr.where()}")
        dt = tr.out_type().dtype
        x, y = _operand(tr, a, dt), _operand(tr, b, dt)
        if alpha != 1:
            y = tr.emit1("mul", [y, tr.const(float(alpha), dt)])
        return tr.emit1(op, [y, x] if swap else [x, y])
    return build


for _t, _op in {aten.add.Tensor: "add", aten.sub.Tensor: "sub", aten.mul.Tensor: "mul",
                aten.div.Tensor: "div", aten.add.Scalar: "add", aten.sub.Scalar: "sub",
                aten.mul.Scalar: "mul", aten.div.Scalar: "div", aten.pow.Tensor_Scalar: "pow",
                aten.pow.Tensor_Tensor: "pow", aten.maximum.default: "maximum",
                aten.minimum.default: "minimum"}.items():
    TABLE[_t] = _binary(_op)
TABLE[aten.rsub.Scalar] = _binary("sub", swap=True)
TABLE[aten.div.Tensor_mode] = _binary("div")


def _compare(op: str):
    def build(tr: Translator, a, b):
        dts = [tr.type_of(tr.value(v)).dtype for v in (a, b) if isinstance(v, torch.fx.Node)]
        dt = dts[0]
        return tr.emit1(op, [_operand(tr, a, dt), _operand(tr, b, dt)])
    return build


TABLE[aten.lt.Tensor] = TABLE[aten.lt.Scalar] = _compare("less")
TABLE[aten.gt.Tensor] = TABLE[aten.gt.Scalar] = _compare("greater")


def _unary(op: str):
    def build(tr: Translator, x):
        return tr.emit1(op, [tr.value(x)])
    return build


for _t, _op in {aten.neg.default: "neg", aten.exp.default: "exp", aten.log.default: "log",
                aten.sqrt.default: "sqrt", aten.rsqrt.default: "rsqrt", aten.abs.default: "abs",
                aten.reciprocal.default: "reciprocal", aten.sigmoid.default: "sigmoid",
                aten.tanh.default: "tanh", aten.relu.default: "relu", aten.silu.default: "silu"}.items():
    TABLE[_t] = _unary(_op)


@builds(aten.softplus.default)
def _softplus(tr: Translator, x, beta=1.0, threshold=20.0):
    return tr.emit1("softplus", [tr.value(x)], {"beta": float(beta), "threshold": float(threshold)})


@builds(aten.elu.default)
def _elu(tr: Translator, x, alpha=1.0, scale=1.0, input_scale=1.0):
    if scale != 1 or input_scale != 1:
        raise CaptureError(f"elu with scale/input_scale is not supported at {tr.where()}")
    return tr.emit1("elu", [tr.value(x)], {"alpha": float(alpha)})


@builds(aten.gelu.default)
def _gelu(tr: Translator, x, *, approximate="none"):
    return tr.emit1("gelu", [tr.value(x)], {"approximate": approximate})


@builds(aten.where.self)
def _where(tr: Translator, c, a, b):
    dt = tr.out_type().dtype
    return tr.emit1("where", [tr.value(c), _operand(tr, a, dt), _operand(tr, b, dt)])


@builds(aten.masked_fill.Scalar)
def _masked_fill(tr: Translator, x, mask, value):
    dt = tr.out_type().dtype
    return tr.emit1("where", [tr.value(mask), tr.const(float(value), dt), tr.value(x)])


@builds(aten.to.dtype, aten._to_copy.default, aten.to.dtype_layout, aten.type_as.default,
        aten.to.device)
def _to(tr: Translator, x, *args, **kwargs):
    return tr.cast(tr.value(x), tr.out_type().dtype)


# ---- constants --------------------------------------------------------------------------
@builds(aten.full.default, aten.zeros.default, aten.ones.default, aten.new_zeros.default,
        aten.new_ones.default, aten.new_full.default, aten.zeros_like.default,
        aten.ones_like.default, aten.full_like.default, aten.empty.memory_format,
        aten.new_empty.default)
def _full(tr: Translator, *args, **kwargs):
    target = tr.fx_node.target
    t = tr.out_type()
    if target in (aten.full.default, aten.new_full.default, aten.full_like.default):
        value = args[-1] if target is not aten.full.default else args[1]
    elif target in (aten.ones.default, aten.new_ones.default, aten.ones_like.default):
        value = 1
    else:
        value = 0
    value = float(value) if t.dtype.startswith(("f", "bf")) else int(value)
    return tr.emit1("full", [], {"shape": list(t.shape), "value": value, "dtype": t.dtype})


@builds(aten.arange.start, aten.arange.default, aten.arange.start_step)
def _arange(tr: Translator, *args, **kwargs):
    if tr.fx_node.target is aten.arange.default:
        start, end = 0, args[0]
    else:
        start, end = args[0], args[1]
        if tr.fx_node.target is aten.arange.start_step and args[2] != 1:
            raise CaptureError(f"arange with a step is not supported at {tr.where()}")
    return tr.emit1("arange", [], {"start": tr.dim(start), "end": tr.dim(end), "dtype": tr.out_type().dtype})


# ---- shapes -----------------------------------------------------------------------------
@builds(aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.unsqueeze.default,
        aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.flatten.using_ints,
        aten.unflatten.int)
def _reshape(tr: Translator, x, *args, **kwargs):
    src, t = tr.value(x), tr.out_type()
    if tr.type_of(src).same_as(t):
        return src
    return tr.emit1("reshape", [src], {"shape": list(t.shape)})


@builds(aten.permute.default)
def _permute(tr: Translator, x, perm):
    rank = tr.type_of(tr.value(x)).rank
    return tr.emit1("permute", [tr.value(x)], {"perm": [p % rank for p in perm]})


@builds(aten.transpose.int)
def _transpose(tr: Translator, x, a, b):
    rank = tr.type_of(tr.value(x)).rank
    perm = list(range(rank))
    perm[a % rank], perm[b % rank] = perm[b % rank], perm[a % rank]
    return tr.emit1("permute", [tr.value(x)], {"perm": perm})


@builds(aten.t.default)
def _t(tr: Translator, x):
    return _transpose(tr, x, 0, 1)


@builds(aten.expand.default)
def _expand(tr: Translator, x, shape, *args, **kwargs):
    src, t = tr.value(x), tr.out_type()
    if tr.type_of(src).same_as(t):
        return src
    return tr.emit1("expand", [src], {"shape": list(t.shape)})


@builds(aten.slice.Tensor)
def _slice(tr: Translator, x, dim=0, start=None, end=None, step=1):
    src = tr.value(x)
    ty = tr.type_of(src)
    d = dim % ty.rank
    n = ty.shape[d]
    start = 0 if start is None else tr.dim(start)
    if end is None or (isinstance(end, int) and end >= 2**62):
        end = n
    else:
        end = tr.dim(end)
    if isinstance(start, int) and start < 0:
        start = n + start
    if isinstance(end, int) and end < 0:
        end = n + end
    if isinstance(end, int) and isinstance(n, int):
        end = min(end, n)
    if start == 0 and step == 1 and (end is n or end == n):
        return src
    return tr.emit1("slice", [src], {"dim": d, "start": start, "end": end, "step": int(step)})


@builds(aten.select.int)
def _select(tr: Translator, x, dim, index):
    src = tr.value(x)
    ty = tr.type_of(src)
    d = dim % ty.rank
    i = index if index >= 0 else ty.shape[d] + index
    s = tr.emit1("slice", [src], {"dim": d, "start": i, "end": i + 1, "step": 1}, name=f"{tr.fx_node.name}_slice")
    return tr.emit1("reshape", [s], {"shape": list(tr.out_type().shape)})


@builds(aten.split.Tensor, aten.split_with_sizes.default)
def _split(tr: Translator, x, sizes, dim=0):
    vals = tr.fx_node.meta["val"]
    d = dim % tr.type_of(tr.value(x)).rank
    return tr.emit("split", [tr.value(x)], {"dim": d, "sizes": [tr.dim(v.shape[d]) for v in vals]})


@builds(aten.cat.default)
def _cat(tr: Translator, xs, dim=0):
    vals = [tr.value(v) for v in xs]
    vals = [v for v in vals if 0 not in tr.type_of(v).shape]  # empty caches
    if not vals:  # every part empty (say a zero-width rope part of an MLA cache): an empty result
        t = tr.out_type()
        return tr.emit1("full", [], {"shape": list(t.shape), "value": 0.0 if t.dtype[0] in "fb" else 0,
                                     "dtype": t.dtype})
    if len(vals) == 1:
        return vals[0]
    return tr.emit1("concat", vals, {"dim": dim % tr.type_of(vals[0]).rank})


@builds(aten.stack.default)
def _stack(tr: Translator, xs, dim=0):
    return tr.emit1("stack", [tr.value(v) for v in xs], {"dim": dim})


# ---- reductions, linear algebra, norms ----------------------------------------------------
def _reduce(op: str):
    def build(tr: Translator, x, dims=None, keepdim=False, *, dtype=None):
        src = tr.value(x)
        rank = tr.type_of(src).rank
        dims = list(range(rank)) if not dims else [d % rank for d in dims]
        if dtype is not None:
            src = tr.cast(src, dtype_name(dtype))
        return tr.emit1(op, [src], {"dims": dims, "keepdim": bool(keepdim)})
    return build


TABLE[aten.sum.dim_IntList] = _reduce("reduce_sum")
TABLE[aten.mean.dim] = _reduce("reduce_mean")
TABLE[aten.amax.default] = _reduce("reduce_max")


@builds(aten.softmax.int, aten._softmax.default)
def _softmax(tr: Translator, x, dim, *args, **kwargs):
    src = tr.value(x)
    return tr.emit1("softmax", [src], {"dim": dim % tr.type_of(src).rank})


@builds(aten.linear.default)
def _linear(tr: Translator, x, w, b=None):
    ins = [tr.value(x), tr.value(w)] + ([tr.value(b)] if b is not None else [])
    return tr.emit1("linear", ins)


@builds(aten.matmul.default, aten.mm.default, aten.bmm.default)
def _matmul(tr: Translator, a, b):
    return tr.emit1("matmul", [tr.value(a), tr.value(b)])


@builds(aten.embedding.default)
def _embedding(tr: Translator, w, ids, *args):
    return tr.emit1("embedding", [tr.value(w), tr.value(ids)])


@builds(aten.rms_norm.default)
def _rms_norm(tr: Translator, x, shape, w=None, eps=None):
    src = tr.value(x)
    if len(shape) != 1:
        raise CaptureError(f"rms_norm over {len(shape)} dims is not supported (last dim only) at {tr.where()}")
    if eps is None:
        eps = torch.finfo(tr.type_of(src).torch_dtype).eps
    return tr.emit1("rms_norm", [src] + ([tr.value(w)] if w is not None else []), {"eps": float(eps)})


@builds(aten.layer_norm.default)
def _layer_norm(tr: Translator, x, shape, w=None, b=None, eps=1e-5, *args):
    if len(shape) != 1:
        raise CaptureError(f"layer_norm over {len(shape)} dims is not supported (last dim only) at {tr.where()}")
    if w is None and b is not None:
        raise CaptureError(f"layer_norm with a bias but no weight is not supported at {tr.where()}")
    ins = [tr.value(x)] + [tr.value(p) for p in (w, b) if p is not None]
    return tr.emit1("layer_norm", ins, {"eps": float(eps)})


@builds(aten.topk.default)
def _topk(tr: Translator, x, k, dim=-1, largest=True, sorted=True):
    if not largest:
        raise CaptureError(f"topk(largest=False) is not supported at {tr.where()}")
    src = tr.value(x)
    return tr.emit("topk", [src], {"k": int(k), "dim": dim % tr.type_of(src).rank})


@builds(aten.gather.default)
def _gather(tr: Translator, x, dim, idx, *, sparse_grad=False):
    src = tr.value(x)
    return tr.emit1("gather", [src, tr.value(idx)], {"dim": dim % tr.type_of(src).rank})


# ---- k3c custom ops: same name in the IR, scalar arguments become attributes ----------
def _custom(name: str):
    """The builder of op `name` with an eager torch op: its arguments are read by the names of
    the op's schema, which ir/ops/torch_ops.py made from the spec (nothing here restates them).
    The spec is looked up when the builder runs, so a re-declared op builds as declared now."""

    def build(tr: Translator, *args, **kwargs):
        spec = OPS[name]
        schema = tr.fx_node.target._schema
        named = dict(zip([a.name for a in schema.arguments], args)) | kwargs
        ins = [tr.value(named[n]) for n in spec.tensor_inputs if named.get(n) is not None]
        attrs = {n: named[n] for n in spec.attr_specs if n in named}
        attrs.update({n: tr.data_dim() for n in spec.attr_specs if spec.attr_specs[n].kind == "rows"})
        out = tr.emit(spec.name, ins, attrs)
        return out if len(out) > 1 else out[0]
    return build


_CUSTOM: dict = {}  # torch op -> IR op name, for the builders builders() added


def builders() -> dict:
    """TABLE as it stands now: with a builder for every op declared with an eager torch op,
    including ops declared after `import k3c` (a user's `defop(..., eager=...)`), and without
    those whose declaration is gone (a `k3c.registry.scope()` ended; torch keeps the op)."""
    ops = torch_ops()
    for target, name in list(_CUSTOM.items()):
        if name not in OPS or ops.get(name) is not target:
            del TABLE[target], _CUSTOM[target]
    for name, target in ops.items():
        if name in OPS and target not in TABLE:
            TABLE[target], _CUSTOM[target] = _custom(name), name
    return TABLE


builders()
