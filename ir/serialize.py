"""Save and load a graph with its weights: `graph.k3c` (text) + `weights.safetensors`."""

from __future__ import annotations

from pathlib import Path

from safetensors.torch import load_file, save_file

from .graph import Graph
from .text import parse, print_graph


def save(graph: Graph, directory: str | Path) -> Path:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / "graph.k3c").write_text(print_graph(graph))
    real = {k: v.contiguous() for k, v in graph.weights.items() if not v.is_meta}
    if real:
        save_file(real, str(d / "weights.safetensors"))
    return d


def load(directory: str | Path) -> Graph:
    d = Path(directory)
    graph = parse((d / "graph.k3c").read_text())
    wfile = d / "weights.safetensors"
    tensors = load_file(str(wfile)) if wfile.exists() else {}
    missing = [w for w in graph.weights if w not in tensors]
    if tensors and missing:
        raise ValueError(f"{wfile}: missing weight(s) {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    unexpected = sorted(set(tensors) - set(graph.weights))
    if unexpected:
        raise ValueError(f"{wfile}: weight(s) not in the graph: {unexpected[:5]}")
    for name, t in tensors.items():
        if tuple(t.shape) != tuple(graph.weights[name].shape) and not graph.weights[name].is_meta:
            raise ValueError(f"{wfile}: weight {name!r} has shape {list(t.shape)}, graph says {graph.types[name]}")
        # a fresh allocation: safetensors' buffers are not 64-byte aligned, and BLAS
        # kernels round differently on unaligned data
        graph.weights[name] = t.clone()
    return graph
