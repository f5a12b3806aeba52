"""decompose: rewrite every node of the named ops into its op's decomposition.

    decompose{ops=["moe_gate_up_mxfp4", "moe_down_mxfp4"]}

The default pipeline uses it to put the MXFP4 experts the eager model calls (one node each
under torch.export) into the IR's canonical form, an explicit exact `mxfp4_decode` feeding the
dense expert op, so that the fusions see one form; fold-mxfp4 folds the decode back into the
fused op they make. Option: ops (default none).
"""

from __future__ import annotations

from collections import Counter

from ..ir import OPS, Graph
from .legalize import decompose_node
from .registry import register_pass


@register_pass("decompose", ops=[])
def decompose(graph: Graph, ops=()) -> Counter:
    """Nodes of `ops` -> their decompositions."""
    bad = [op for op in ops if op not in OPS or OPS[op].decompose is None]
    if bad:
        raise ValueError(f"decompose: {bad} are no ops with a decomposition")
    sites: Counter = Counter()
    for node in [n for n in graph.nodes if n.op in set(ops)]:
        decompose_node(graph, node)
        sites[node.op] += 1
    return sites
