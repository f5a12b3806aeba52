"""last-token-logits: a prefill that returns only each sequence's last logits, [B, 1, vocab].

Generation reads one row of a prefill's logits; the lm_head GEMM over every position is a
large share of a prefill (a fifth of k3-small's). This pass moves the selection before the
lm_head: the `linear` that makes the graph's first output (`logits`) takes the hidden row of
each sequence's last real token, row `lengths[b] - 1` when the graph takes right-padded
prompts (an input named `lengths`, the serving prefill), else row T - 1.
"""

from __future__ import annotations

from collections import Counter

from ..ir import Graph
from ..ir import dims as D
from .builder import Builder
from .dce import dce
from .registry import register_pass


def _last_rows(b: Builder, x: str, lengths: str | None) -> str:
    B, T, d = b.type(x).shape
    if lengths is None:
        return b.op("slice", [x], dim=1, start=D.normalize(T - 1), end=T)
    row = b.op("sub", [b.cast(lengths, "i64"), b.const(1, "i64")])
    idx = b.op("expand", [b.op("reshape", [row], shape=[B, 1, 1])], shape=[B, 1, d])
    return b.op("gather", [x, idx], dim=1)


@register_pass("last-token-logits")
def last_token_logits(graph: Graph) -> Counter:
    """Compute the logits of each sequence's last real token only (the lm_head on one row)."""
    logits = graph.output_values[0]
    head = next((n for n in graph.nodes if logits in n.outputs), None)
    if head is None or head.op != "linear" or graph.types[head.inputs[0]].rank != 3:
        return Counter()
    x = graph.types[head.inputs[0]]
    if x.shape[1] == 1:  # one position already
        return Counter()
    b = Builder(graph, anchor=head)
    head.inputs = [_last_rows(b, head.inputs[0], "lengths" if "lengths" in graph.inputs else None),
                   *head.inputs[1:]]
    b.commit()
    graph.types[logits] = graph.types[logits].with_shape((x.shape[0], 1, graph.types[logits].shape[2]))
    return Counter({"last-row": 1}) + dce(graph)
