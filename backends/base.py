"""What every backend is: a lowering table that can say why it cannot take a node, a
`lower` that writes an artifact to disk, and a `load` that returns a runner.

    backend.supports(node, graph) -> (ok, reason)
    backend.lower(graphs, out_dir)  -> Path        graphs: {"prefill": g, "decode": g} or {"forward": g}
    backend.load(out_dir)           -> Runner      runner.run("prefill", *inputs) -> outputs

Inputs and outputs of a runner follow the order of the graph's `inputs` and `outputs`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import torch

from ..errors import UnsupportedNodeError
from ..ir import Graph, Node


class Runner(Protocol):
    entries: dict[str, Graph]

    def run(self, entry: str, *inputs: torch.Tensor) -> list[torch.Tensor]: ...


class Backend(Protocol):
    name: str

    def is_available(self) -> tuple[bool, str]: ...

    def supports(self, node: Node, graph: Graph) -> tuple[bool, str]: ...

    def lower(self, graphs: dict[str, Graph], out_dir: Path, **options) -> Path: ...

    def load(self, out_dir: Path, **options) -> Runner: ...


def check_supported(backend: Backend, graph: Graph) -> None:
    """Raise UnsupportedNodeError listing every node of `graph` that `backend` cannot lower."""
    problems = []
    for node in graph.nodes:
        ok, reason = backend.supports(node, graph)
        if not ok:
            problems.append((node, reason))
    if problems:
        raise UnsupportedNodeError(backend.name, problems)


def table_supports(table: dict[str, Callable], node: Node, backend: str,
                   reasons: dict[str, str] | None = None) -> tuple[bool, str]:
    """The common `supports`: an op is lowerable when the table has it; else say why."""
    if node.op in table:
        return True, ""
    why = (reasons or {}).get(node.op, f"no {backend} lowering for op {node.op!r}")
    return False, why
