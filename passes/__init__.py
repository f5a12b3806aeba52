"""k3c.passes: the pass manager and one file per pass.

    k3c.passes.run(graph, "default")          # or a list of pass names, or "none"
"""

from __future__ import annotations

from ..ir import Graph, verify

PIPELINES: dict[str, list[str]] = {"none": [], "default": []}


def run(graph: Graph, pipeline: str | list[str] = "default", *, verify_each: bool = True,
        stop_after: str | None = None, dump_after: str | None = None, report: list | None = None) -> Graph:
    """Run a pipeline (a name in PIPELINES or a list of pass names) on a copy of `graph`.

    stop_after: return the graph as it is after that pass; dump_after: print the IR after it;
    report: a list that receives one entry per pass (what it changed, node count, time).
    """
    names = PIPELINES[pipeline] if isinstance(pipeline, str) else list(pipeline)
    if names:
        raise NotImplementedError("passes land with the pass manager")
    return verify(graph.copy()) if verify_each else graph.copy()
