"""Graphviz output of a graph: one box per node, an edge per value, weights left out."""

from __future__ import annotations

from pathlib import Path

from .graph import Graph


def to_dot(graph: Graph) -> str:
    lines = [f'digraph "{graph.name}" {{', "  rankdir=TB;", '  node [shape=box, fontname="monospace"];']
    producer = {}
    for i in graph.inputs:
        lines.append(f'  "in:{i}" [label="{i}\\n{graph.types[i]}", shape=ellipse];')
        producer[i] = f"in:{i}"
    for k, n in enumerate(graph.nodes):
        label = n.op + (f"\\n{n.loc}" if n.loc else "")
        lines.append(f'  "n{k}" [label="{label}"];')
        for i in n.inputs:
            if i in producer:
                lines.append(f'  "{producer[i]}" -> "n{k}" [label="{graph.types[i]}", fontsize=8];')
        for o in n.outputs:
            producer[o] = f"n{k}"
    for name, v in graph.outputs:
        lines.append(f'  "out:{name}" [label="{name}", shape=ellipse];')
        lines.append(f'  "{producer.get(v, v)}" -> "out:{name}";')
    lines.append("}")
    return "\n".join(lines) + "\n"


def write_dot(graph: Graph, path: str | Path) -> None:
    Path(path).write_text(to_dot(graph))
