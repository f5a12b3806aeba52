"""Triton lowerings of the fixed-capacity cache ops (ir/ops/cache.py), entered in the triton
table when the backend's package is imported:

- `cache_write` writes the new rows into the buffer it is given (kernels/cache/triton), so a
  decode step moves one row a sequence, not the cache. In place only where nothing else can
  see the old cache: this node is its last reader, it is no output, and it is an entry's
  input or a buffer the module made for it (a `full`, an earlier write); otherwise the
  kernel writes into a copy.
- `causal_attention_cached` and `mla_attention_absorbed_cached` attend over each sequence's
  written rows only, split over the keys (flash-decoding) with a second kernel merging the
  splits (kernels/attention/triton/decoding.py, kernels/mla/triton/cached.py).

The positions the kernels index with are checked against the capacity once per call, by the
runner, before the entry runs (backends/contract.py); the write kernel also masks any row
outside the cache. `mla_attention_cached` (the expanded form) runs its decomposition.
"""

from __future__ import annotations

from ...ir import Graph, Node, named_inputs
from ..tables import builtin

CACHE = "k3c.kernels.cache.triton"
FRESH = frozenset({"full", "cache_write"})  # ops whose output is a buffer of its own in the module
MAX_WIDTH = 512  # the split kernel's fp32 accumulator [BM, DV] and key slices stay in registers


def owns(graph: Graph, node: Node, cache: str) -> bool:
    """Whether `node` may write `cache` in place: no later reader, no output, no weight, and
    not a view of another value (the module's reshapes and expands alias their input)."""
    if cache in graph.weights or cache in graph.output_values:
        return False
    at = graph.nodes.index(node)
    if any(cache in n.inputs for n in graph.nodes[at + 1:]):
        return False
    if cache in graph.inputs:
        return True
    producer = next((n for n in graph.nodes if cache in n.outputs), None)
    return producer is not None and producer.op in FRESH


def _cache_write(cg, node: Node, cache, new, positions) -> str:
    fn = cg.use(CACHE, "cache_write")
    inplace = owns(cg.graph, node, cache)
    # check=False: the runner checked the entry's positions against the capacity before it ran
    return (f"{cg.lhs(node)} = {fn}({cg.val(cache)}, {cg.val(new)}, {cg.val(positions)}, inplace={inplace}, "
            "check=False)")


def _width_fits(node: Node, graph: Graph) -> tuple[bool, str]:
    dv = graph.types[node.outputs[0]].shape[-1]
    keys = named_inputs(node)
    keys = keys["k"] if "k" in keys else keys["ckv"]  # causal attention's keys, or MLA's latent cache
    widths = [graph.types[keys].shape[-1], dv]
    if not all(isinstance(d, int) and d <= MAX_WIDTH for d in widths):
        return False, f"key/value widths {widths}: the Triton split-K kernel takes static widths up to {MAX_WIDTH}"
    return True, ""


builtin("triton", "cache_write", kind="kernel", floats=None)(_cache_write)
builtin("triton", "causal_attention_cached", kind="kernel", supports=_width_fits, floats=None)(
    lambda cg, node, q, k, v, positions: (
        f"{cg.lhs(node)} = {cg.use('k3c.kernels.attention.triton', 'causal_attention_cached')}("
        f"{cg.val(q)}, {cg.val(k)}, {cg.val(v)}, {cg.val(positions)}, {cg.attr(node, 'scale')})"))
builtin("triton", "mla_attention_absorbed_cached", kind="kernel", supports=_width_fits, floats=None)(
    lambda cg, node, q, ckv, krope, w_uk, w_uv, positions: (
        f"{cg.lhs(node)} = {cg.use('k3c.kernels.mla.triton', 'mla_attention_absorbed_cached')}("
        f"{', '.join(cg.val(x) for x in (q, ckv, krope, w_uk, w_uv, positions))}, {cg.attr(node, 'scale')})"))
