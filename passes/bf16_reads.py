"""bf16-reads: BF16 weights read as stored where the backend's runtime takes BF16, instead of
through a float32 copy.

compute-dtype casts each BF16 weight to float32 where it is read (`cast(w, f32)`); a runtime
that folds that cast at load (onnxruntime does) then holds a float32 copy. Two reads need no
copy:

- an `embedding` of a BF16 table gathers its rows as stored and widens them:
  `embedding(cast(w, f32), ids) -> cast(embedding(w, ids), f32)`, exact (widening commutes
  with gathering). Any policy; onnxruntime's Gather takes BF16 on the CPU and CUDA providers.
- under the BF16 policy (`gemm="bf16"`: each GEMM's operands are BF16 values held in float32,
  `cast(cast(x, bf16), f32)` and `cast(w, f32)`), with option `gemms` (a runtime whose BF16
  GEMM returns a BF16 product: onnxruntime's CUDA MatMul, cuBLAS with float32 accumulation),
  a plain GEMM multiplies the BF16 values themselves:

      linear(cast(cast(x, bf16), f32), cast(w, f32), b)  ->  cast(linear(cast(x, bf16), w, b'), f32)

  for `linear` and `matmul` whose operands are all BF16 that way (a bias, if any, a BF16
  weight too). The product is rounded to BF16 once and widened, so what follows computes in
  float32 as before; every backend and the reference then compute what that runtime does.
  GEMMs inside fused ops (`gated_mlp`, the routed experts) keep their float32 product, held
  inside the op as the policy keeps the experts' hidden. The eager definition of this form:
  models.precision.bf16_policy with `bf16_outputs=True`.

The casts left unread go in the pipeline's final dce. `passes.for_backend` places the pass
right after compute-dtype for a backend that reads BF16 (`reads_bf16`: the ONNX backend; with
`gemm_io = "bf16"`, built for the CUDA provider, with `gemms`). Options: gemms (default true).
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


@register_pass("bf16-reads", gemms=True)
def bf16_reads(graph: Graph, gemms: bool = True) -> dict:
    """An embedding of a BF16 table -> its rows gathered as stored, then widened; with `gemms`
    under the BF16 policy, linear / matmul on BF16-valued float32 operands -> the GEMM on the
    BF16 values, its BF16 product widened."""
    gemms = gemms and graph.meta.get("compute") == "bf16"
    producers = graph.producers()
    nodes: list[Node] = []
    sites = {"gathers": 0, "gemms": 0}
    for node in graph.nodes:
        if node.op in PLAIN_GEMMS and gemms:
            srcs = [_bf16_source(graph, producers, v) for v in node.inputs]
        elif node.op == "embedding":
            w = _bf16_source(graph, producers, node.inputs[0])
            srcs = [w if w in graph.weights else None, *node.inputs[1:]]
        else:
            srcs = [None]
        if any(s is None for s in srcs):
            nodes.append(node)
            continue
        (out,) = node.outputs
        narrow = graph.fresh(f"{out}.bf16")
        spec = OPS[node.op]
        (graph.types[narrow],) = spec.infer(*[graph.types[i] for i in srcs], **spec.full_attrs(node.attrs))
        nodes.append(Node(node.op, srcs, [narrow], dict(node.attrs), dict(node.meta)))
        nodes.append(Node("cast", [narrow], [out], {"dtype": graph.types[out].dtype}, dict(node.meta)))
        sites["gathers" if node.op == "embedding" else "gemms"] += 1
    graph.nodes = nodes
    return {k: n for k, n in sites.items() if n}
