"""Whether a value of a graph is provably <= 0: the precondition of kernels that assume a
log-decay, for the backends whose chunk kernels need it.

The TVM and Triton chunk kernels factor exp(G_i - G_j) through pivot rows and clamp each
exponent at 0 (every decay <= 1, so nothing overflows and masked lanes stay finite). With a
positive log-decay (g > 0, a growing state) that clamp is wrong (0.4 off), while the reference
and ONNX compute it. So those backends take such a node only when its g is provably <= 0, or
is a graph input (then the runner checks the values), and refuse it otherwise, saying why.

The proof is a sign analysis over the producers: exp, softplus, sigmoid, relu, abs, sqrt are
>= 0; neg flips a sign; a product's sign follows its factors', a sum's its terms' when they
agree, a `where`'s its branches' when they agree; reshapes, slices, concatenations and
casts keep it; a constant or weight has the sign of its values. The zoo's gates are all of
that form: -exp(A_log) * softplus(x) and lb * sigmoid(x) with lb < 0.
"""

from __future__ import annotations

from functools import cache

from ..ir import OPS, Graph, named_inputs

NONNEG_OPS = {"exp", "softplus", "sigmoid", "relu", "abs", "sqrt", "rsqrt"}
SAME_SIGN_OPS = {"reshape", "permute", "expand", "slice", "split", "concat", "stack", "cast"}


def decay_value(node) -> str | None:
    """The log-decay input `g` (which the TVM/Triton kernels assume <= 0) of a delta-family
    op whose gate kind decays (its spec's DeltaForm) or of a gated `chunk_prepare`, else None."""
    form = OPS[node.op].delta
    if node.op != "chunk_prepare" and not (form is not None and form.decays):
        return None
    return named_inputs(node).get("g")


def sign_of(graph: Graph):
    """A function value -> "nonpos" | "nonneg" | "input" (a graph input: checked at run time) | None."""
    producer = {o: n for n in graph.nodes for o in n.outputs}

    @cache
    def sign(v: str):
        if v in graph.inputs:
            return "input"
        if v in graph.weights:
            t = graph.weights[v]
            if t.is_meta or not t.is_floating_point():
                return None
            return "nonpos" if bool((t <= 0).all()) else "nonneg" if bool((t >= 0).all()) else None
        n = producer.get(v)
        if n is None:
            return None
        if n.op in ("const", "full"):
            value = n.attrs.get("value")
            return None if not isinstance(value, (int, float)) else "nonpos" if value <= 0 else "nonneg"
        if n.op in NONNEG_OPS:
            return "nonneg"
        ins = [sign(i) for i in n.inputs if i]
        if n.op == "where":  # either branch: a padded token's zero gate keeps the gate's sign
            x = named_inputs(n)
            branches = [sign(x["a"]), sign(x["b"])]
            return branches[0] if len(branches) == 2 and branches[0] == branches[1] != "input" else None
        if n.op == "neg":
            return {"nonpos": "nonneg", "nonneg": "nonpos"}.get(ins[0])
        if n.op in SAME_SIGN_OPS or n.op in ("add", "maximum", "minimum"):
            if n.op == "minimum" and "nonpos" in ins:
                return "nonpos"
            if n.op == "maximum" and "nonneg" in ins:
                return "nonneg"
            return ins[0] if ins and all(s == ins[0] and s != "input" for s in ins) else None
        if n.op in ("mul", "div") and len(ins) == 2 and None not in ins and "input" not in ins:
            return "nonneg" if ins[0] == ins[1] else "nonpos"
        return None

    return sign


def check_decays(graph: Graph, node, backend: str) -> tuple[bool, str]:
    """(ok, reason) for a node whose kernel on `backend` needs its log-decay <= 0."""
    g = decay_value(node)
    if g is None:
        return True, ""
    s = sign_of(graph)(g)
    if s in ("nonpos", "input"):
        return True, ""
    return False, (f"its log-decay %{g} is not provably <= 0, and the {backend} chunk kernels assume it (they "
                   f"clamp each exponent at 0); the reference and ONNX backends compute a positive one")


def decay_inputs(graph: Graph) -> list[str]:
    """Graph inputs that feed a log-decay directly: a runner checks that they are <= 0."""
    return sorted({decay_value(n) for n in graph.nodes if decay_value(n) in graph.inputs})
