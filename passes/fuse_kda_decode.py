"""fuse-kda-decode: KDA's decode step as one `kda_decode_step` (ir/ops/kda_decode.py).

In a decode step (ir.decode_step: one token per sequence) each KDA layer is, after fuse-norms,

    q = l2norm(reshape(short_conv(q_x, q_w, q_conv)))   k likewise;  v = reshape(short_conv(v_x, ...))
    g = mul(sigmoid(mul(a, add(f, dt_bias))), lb)        (k3)   or   mul(a, softplus(add(f, dt_bias)))
    o, S' = kda(q, k, v, g, sigmoid(b), S);   y = gated_rms_norm(o, o_gate, norm_w)

and becomes `y, S', q_conv', k_conv', v_conv' = kda_decode_step(...)`, one kernel that reads
the state once and writes it once. The site is walked by hand, not matched by a `Rule`: the
convs and `kda` are reached through one output while their state outputs leave the layer,
which a pattern's single-use rule refuses. Prefill and extend (T > 1) are never rewritten;
only float32 sites are (the kernels' dtype): a BF16 model's, after compute-dtype (for_backend).

The pipeline has it where the backend lowers the op (`passes.for_backend` puts it after
fuse-norms for TVM and Triton); elsewhere the layer keeps its ops. A pipeline that names the
pass already keeps it as named: `fuse-kda-decode{enable=false}` compiles the unfused step
on a backend that would fuse it (benchmarks/bench_serving.py's slots row compares the two).
"""

from __future__ import annotations

from ..ir import Graph, Node, decode_step
from ..ir import dims as D
from .builder import Builder
from .driver import remove_dead
from .registry import register_pass

FUSED = ("kda_decode_step",)  # the ops this pass makes: a backend that lowers them gets the pass


class _Walk:
    """Producers and users of a graph, and the nodes one site has claimed."""

    def __init__(self, graph: Graph):
        self.graph, self.prod, self.users = graph, graph.producers(), graph.users()
        self.outs = set(graph.output_values)
        self.nodes: list[Node] = []

    def node(self, value: str, op: str, output: int = 0) -> Node | None:
        """The node of `op` that produces `value` as its output number `output`, when only the
        site reads that value (the node is claimed); None otherwise."""
        n = self.prod.get(value)
        if n is None or n.op != op or n.outputs.index(value) != output or value in self.outs \
                or len(self.users.get(value, ())) != 1:
            return None
        self.nodes.append(n)
        return n

    def op_of(self, value: str) -> str | None:
        return getattr(self.prod.get(value), "op", None)

    def const(self, value: str) -> float | None:
        return float(self.prod[value].attrs["value"]) if self.op_of(value) == "const" else None

    def shaped(self, value: str, shape) -> bool:
        t = self.graph.types[value]
        return t.rank == len(shape) and all(D.equal(p, q) for p, q in zip(t.shape, shape))


def _either(n: Node, test) -> tuple[str, str] | None:
    """A binary node's inputs (x, y) in the order that passes `test(x, y)` (mul and add commute)."""
    x, y = n.inputs
    return (x, y) if test(x, y) else (y, x) if test(y, x) else None


def _conv_norm(w: _Walk, value: str) -> tuple[Node, Node] | None:
    """l2norm(reshape(short_conv(...)[0])) -> (the conv, the l2norm)."""
    norm = w.node(value, "l2norm")
    shaped = norm and w.node(norm.inputs[0], "reshape")
    conv = shaped and w.node(shaped.inputs[0], "short_conv", 0)
    return (conv, norm) if conv else None


def _gate(w: _Walk, g: str, f_shape) -> dict | None:
    """The forget gate's f, a, dt_bias, kind and lower bound; None unless g is one of the two forms."""
    H, K = f_shape[2], f_shape[3]
    outer = w.node(g, "mul")
    sig_lb = outer and _either(outer, lambda s, c: w.const(c) is not None and w.op_of(s) == "sigmoid")
    if sig_lb is not None:  # k3: lb * sigmoid(a * (f + dt_bias))
        kind, lb = "sigmoid", w.const(sig_lb[1])
        sig = w.node(sig_lb[0], "sigmoid")
        inner = sig and w.node(sig.inputs[0], "mul")
        pair = inner and _either(inner, lambda a, x: w.shaped(a, (H, 1)) and w.shaped(x, f_shape))
    elif outer is not None:  # kimi-linear: a * softplus(f + dt_bias), a = -exp(A_log)
        kind, lb = "softplus", -5.0
        pair = _either(outer, lambda a, s: w.shaped(a, (H, 1)) and w.op_of(s) == "softplus")
        sp = pair and w.node(pair[1], "softplus")
        if not sp or sp.attrs.get("beta", 1.0) != 1.0 or sp.attrs.get("threshold", 20.0) != 20.0:
            return None
        pair = (pair[0], sp.inputs[0])
    else:
        return None
    add = pair and w.node(pair[1], "add")
    fx = add and _either(add, lambda f, d: w.shaped(f, f_shape) and w.shaped(d, (H, K)))
    return {"f": fx[0], "a": pair[0], "dt_bias": fx[1], "gate": kind, "lower_bound": lb} if fx else None


def _site(graph: Graph, kda: Node):
    """The decode step around one `kda` node: (claimed nodes, the gated norm, the fused op's
    inputs, its attributes, the three convs); None where it is not the KDA layer's form."""
    w = _Walk(graph)
    q, k, v, g, beta, state = kda.inputs
    f_shape = graph.types[q].shape
    if not decode_step(graph, q) or not D.equal(f_shape[1], 1):
        return None
    users = w.users.get(kda.outputs[0], [])
    norm = users[0] if len(users) == 1 and kda.outputs[0] not in w.outs else None
    if norm is None or norm.op != "gated_rms_norm" or norm.inputs[0] != kda.outputs[0]:
        return None
    qn, kn = _conv_norm(w, q), _conv_norm(w, k)
    v_shaped = w.node(v, "reshape")
    vc = v_shaped and w.node(v_shaped.inputs[0], "short_conv", 0)
    gate = _gate(w, g, f_shape)
    sig = w.node(beta, "sigmoid")
    if not (qn and kn and vc and gate and sig):
        return None
    convs = [qn[0], kn[0], vc]
    acts, eps = {c.attrs.get("activation", "none") for c in convs}, {qn[1].attrs["eps"], kn[1].attrs["eps"]}
    if len(acts) != 1 or len(eps) != 1 or len({graph.types[c.inputs[1]].shape[1] for c in convs}) != 1:
        return None
    inputs = ([c.inputs[0] for c in convs] + [c.inputs[1] for c in convs] + [c.inputs[2] for c in convs]
              + [gate["f"], gate["a"], gate["dt_bias"], sig.inputs[0], state, norm.inputs[1], norm.inputs[2]])
    values = inputs + [o for n in [*w.nodes, kda, norm] for o in n.outputs]
    if any(graph.types[x].dtype in ("f16", "bf16", "f64") for x in values):  # float32 sites only
        return None
    attrs = {"scale": kda.attrs["scale"], "gate": gate["gate"], "lower_bound": gate["lower_bound"],
             "activation": acts.pop(), "qk_eps": eps.pop(), "eps": norm.attrs["eps"]}
    return [*w.nodes, kda, norm], norm, inputs, attrs, convs


@register_pass("fuse-kda-decode", enable=True)
def fuse_kda_decode(graph: Graph, enable: bool = True) -> dict:
    """KDA's decode step (short convs, l2norms, gate, beta, kda, gated norm) -> kda_decode_step."""
    if not enable:  # "fuse-kda-decode{enable=false}" in a pipeline: the unfused step, on purpose
        return {}
    sites = 0
    for kda in [n for n in graph.nodes if n.op == "kda"]:
        found = _site(graph, kda)
        if found is None:
            continue
        claimed, norm, inputs, attrs, convs = found
        b = Builder(graph, norm)
        outs = b.op("kda_decode_step", inputs, name=f"{kda.outputs[0]}.step", **attrs)
        b.commit()
        for old, new in zip([norm.outputs[0], kda.outputs[1], *(c.outputs[1] for c in convs)], outs):
            graph.replace_uses(old, new)
        remove_dead(graph, claimed)
        sites += 1
    return {"kda-decode-step": sites} if sites else {}
