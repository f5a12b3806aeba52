"""The reference backend: the IR interpreter. Always available; the definition of correct.

Its artifact is the graph itself (`DIR/{entry}/graph.k3c` + weights), so a reference
compile also shows what every other backend starts from.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..ir import OPS, Graph, Node, interpret, load, save


class ReferenceRunner:
    def __init__(self, entries: dict[str, Graph]):
        self.entries = entries

    def run(self, entry: str, *inputs: torch.Tensor) -> list[torch.Tensor]:
        return interpret(self.entries[entry], *inputs)


class ReferenceBackend:
    name = "reference"

    def is_available(self) -> tuple[bool, str]:
        return True, ""

    def supports(self, node: Node, graph: Graph) -> tuple[bool, str]:
        return (True, "") if node.op in OPS else (False, f"op {node.op!r} has no declaration")

    def lower(self, graphs: dict[str, Graph], out_dir: Path) -> Path:
        for entry, g in graphs.items():
            save(g, Path(out_dir) / entry)
        return Path(out_dir)

    def load(self, out_dir: Path) -> ReferenceRunner:
        out_dir = Path(out_dir)
        return ReferenceRunner({d.name: load(d) for d in sorted(out_dir.iterdir()) if (d / "graph.k3c").exists()})

    def runner(self, graphs: dict[str, Graph]) -> ReferenceRunner:
        """Run graphs in memory, without writing them."""
        return ReferenceRunner(graphs)
