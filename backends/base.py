"""What every backend is: a lowering table that can say why it cannot take a node, a
`lower` that writes an artifact to disk, and a `load` that returns a runner. A backend is
configured when it is made (`k3c.backends.get("onnx", flavour="ort")`), so lower and load
take no options.

    backend.supports(node, graph) -> (ok, reason)   read from its table in k3c.backends.tables
    backend.takes_whole             -> set of ops   recurrent ops it runs whole (not chunked)
    backend.chunk_by                -> str | None  "flops": the cost model picks the prefill form
    backend.chunk_size              -> int | None  the chunk length its chunked pieces run fastest at
    backend.lower(graphs, out_dir)  -> Path        graphs: {"prefill": g, "decode": g} or {"forward": g}
    backend.load(out_dir)           -> Runner      runner.run("prefill", *inputs) -> outputs

Inputs and outputs of a runner follow the order of the graph's `inputs` and `outputs`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch

from ..errors import UnsupportedNodeError
from ..ir import OPS, Graph, Node


class Runner(Protocol):
    entries: dict[str, Graph]

    def run(self, entry: str, *inputs: torch.Tensor) -> list[torch.Tensor]: ...


class Backend(Protocol):
    name: str

    def is_available(self) -> tuple[bool, str]: ...

    def supports(self, node: Node, graph: Graph) -> tuple[bool, str]: ...

    def lower(self, graphs: dict[str, Graph], out_dir: Path) -> Path: ...

    def load(self, out_dir: Path) -> Runner: ...


def legalized(backend: Backend, graphs: dict[str, Graph]) -> dict[str, Graph]:
    """`graphs` with every node `backend` has no lowering for rewritten into its op's
    decomposition (a copy where anything changes; k3c.passes.legalize). `k3c.compile` has
    done it already; a direct `backend.lower(graphs, dir)` gets the same graphs this way."""
    from ..passes import legalize

    out = {}
    for entry, g in graphs.items():
        if any(OPS[n.op].decompose is not None and not backend.supports(n, g)[0] for n in g.nodes):
            g = g.copy()
            legalize(g, backend.supports)
        out[entry] = g
    return out


def check_supported(backend: Backend, graph: Graph) -> None:
    """Raise UnsupportedNodeError listing every node of `graph` that `backend` cannot lower."""
    problems = []
    for node in graph.nodes:
        ok, reason = backend.supports(node, graph)
        if not ok:
            problems.append((node, reason))
    if problems:
        raise UnsupportedNodeError(backend.name, problems)
