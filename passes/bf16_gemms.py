"""bf16-gemms: the BF16 policy's plain GEMMs as BF16 GEMMs, for runtimes whose BF16 GEMM
returns BF16.

compute-dtype with `gemm="bf16"` gives each GEMM BF16-valued operands held in float32
(`cast(cast(x, bf16), f32)`, and `cast(w, f32)` of a BF16 weight) and a float32 output. A
runtime that multiplies BF16 tensors directly (onnxruntime's CUDA MatMul, cuBLAS underneath:
BF16 operands, float32 accumulation, a BF16 result) reads the stored weight as it is, with no
float32 copy of it, but rounds the product to BF16. This pass states that form in the IR,
so every backend and the reference compute what such a runtime computes:

    linear(cast(cast(x, bf16), f32), cast(w, f32), b)  ->  cast(linear(cast(x, bf16), w, b'), f32)

for `linear` and `matmul` whose operands are all BF16 that way (a bias, if any, a BF16
weight too). The product is rounded to BF16 once and widened, so what follows computes in
float32 as before. An `embedding` of a BF16 table gathers its rows as stored and widens them
(exact: widening commutes with gathering), so the table has no float32 copy either. GEMMs inside fused ops (`gated_mlp`, the routed experts) keep their
float32 product: the op holds it inside, as the policy keeps the experts' hidden. The casts
left unread go in the pipeline's final dce. `passes.for_backend` places the pass right after
compute-dtype for a backend that asks for it (`gemm_io = "bf16"`: the ONNX backend asked to
run on the CUDA provider). The eager definition of this form: models.precision.bf16_policy
with `bf16_outputs=True`.
"""

from __future__ import annotations

from ..ir import OPS, Graph, Node
from .registry import register_pass

PLAIN_GEMMS = frozenset({"linear", "matmul"})  # one MatMul each when lowered


def _bf16_source(graph: Graph, producers: dict, v: str | None) -> str | None:
    """The BF16 value `v` is that value widened to float32: a BF16 weight under `cast(w,
    f32)`, or the `x.bf16` of an activation rounded as `cast(cast(x, bf16), f32)`."""
    if v is None:
        return None
    node = producers.get(v)
    if node is None or node.op != "cast" or node.attrs.get("dtype") != "f32":
        return None
    src = node.inputs[0]
    if graph.types[src].dtype != "bf16":
        return None
    if src in graph.weights:
        return src
    inner = producers.get(src)
    return src if inner is not None and inner.op == "cast" else None


@register_pass("bf16-gemms")
def bf16_gemms(graph: Graph) -> dict:
    """linear / matmul on BF16-valued float32 operands -> the same GEMM on the BF16 values,
    its BF16 product widened to float32; an embedding of a BF16 table -> its rows widened."""
    if graph.meta.get("compute") != "bf16":
        return {}
    producers = {o: n for n in graph.nodes for o in n.outputs}
    nodes: list[Node] = []
    sites = 0
    for node in graph.nodes:
        if node.op in PLAIN_GEMMS:
            srcs = [_bf16_source(graph, producers, v) for v in node.inputs]
        elif node.op == "embedding":  # the table's rows gathered as stored, then widened: exact
            w = _bf16_source(graph, producers, node.inputs[0])
            srcs = [w if w in graph.weights else None, *node.inputs[1:]]
        else:
            srcs = [None]
        if any(s is None for s in srcs):
            nodes.append(node)
            continue
        (out,) = node.outputs
        narrow = graph.fresh(f"{out}.bf16")
        ins = srcs
        spec = OPS[node.op]
        (graph.types[narrow],) = spec.infer(*[graph.types[i] for i in ins], **spec.full_attrs(node.attrs))
        nodes.append(Node(node.op, ins, [narrow], dict(node.attrs), dict(node.meta)))
        nodes.append(Node("cast", [narrow], [out], {"dtype": graph.types[out].dtype}, dict(node.meta)))
        sites += 1
    graph.nodes = nodes
    return {"bf16-reads": sites} if sites else {}
