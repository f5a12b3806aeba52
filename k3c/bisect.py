"""Naming the first IR node a backend gets wrong.

A node is wrong when its output is off *given correct inputs*. Comparing the outputs of
growing prefixes of the graph names the first node whose output is off, which may be a node
downstream of the real culprit: a sigmoid that is off by 1e-4 relative on tiny values passes a
relative-RMS check, and the division that renormalises those values is where it shows.

So every node is run on the reference's own inputs: `isolate` turns a graph into a probe in
which each node reads its inputs from probe inputs (fed with the interpreter's values) and
writes an output of its own; one compile and one run of the probe check every node at once,
each against the tolerance of its kind (k3c.numerics): an elementwise op element by element in
relative terms, any other op against the row of its dtype. When no node is off on its own (the
error comes from how a backend joins nodes, e.g. a fusion), or the probe cannot be lowered,
the prefix bisection names the first prefix whose values are off.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .ir import FAMILIES, Graph, Node, interpret
from .ir.extract import extract
from .numerics import TOLERANCES, Tolerance, compare, elementwise_off

SOURCES = ("const", "full", "arange")  # nodes without inputs stay as they are in the probe
PROBE = "__probe"


def _is_float(graph: Graph, v: str) -> bool:
    return graph.types[v].dtype.startswith(("f", "bf"))


def isolate(graph: Graph) -> tuple[Graph, list[tuple[int, str, str]]]:
    """The probe of `graph` and what it checks: (node index, value, probe output) per output
    of every node (integer ones too: topk's indices decide the routing). Probe inputs: the
    graph's inputs, then every value a node reads that another node (not a constant) computes."""
    producers = graph.producers()
    g = graph.copy()
    g.name = f"{graph.name}.probe"
    inputs = list(graph.inputs)
    checks: list[tuple[int, str, str]] = []
    nodes: list[Node] = []
    for i, node in enumerate(g.nodes):
        if node.op in SOURCES:
            nodes.append(node)
            continue
        for v in node.inputs:
            if v and v in producers and producers[v].op not in SOURCES and v not in inputs:
                inputs.append(v)
        outs = []
        for v in node.outputs:
            p = g.fresh(v + PROBE)
            g.types[p] = g.types[v]
            outs.append(p)
            checks.append((i, v, p))
        node.outputs = outs
        nodes.append(node)
    g.nodes, g.inputs = nodes, inputs
    g.outputs = [(p, p) for _, _, p in checks]
    g.prune_types()
    return g, checks


def node_off(op: str, actual: torch.Tensor, expected: torch.Tensor,
             tolerance: dict[torch.dtype, Tolerance] | None = None) -> tuple[bool, str]:
    """(off, how) for one node's output computed from the reference's inputs."""
    if not expected.is_floating_point():  # indices, masks: exactly the reference's
        same = actual.shape == expected.shape and bool((actual == expected).all())
        n = 0 if same or actual.shape != expected.shape else int((actual != expected).sum())
        return not same, f"{n} of {expected.numel()} integer values differ"
    if op in FAMILIES.get("elementwise", ()):
        off, worst = elementwise_off(actual, expected)
        return off, f"worst element {worst:.1e} relative"
    tol = (tolerance or TOLERANCES).get(expected.dtype)
    if tol is None:
        return False, ""
    c = compare(actual, expected, tolerance=tol)
    return not c.ok, f"rel_rms_err {c.rel_rms_err:.1e}, max_abs_err {c.max_abs_err:.1e}"


def _reference(graph: Graph, inputs: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    values: dict[str, torch.Tensor] = dict(zip(graph.inputs, inputs))

    def observe(node: Node, outs):
        values.update(zip(node.outputs, outs))

    interpret(graph, *inputs, observe=observe)
    return values


def _describe(graph: Graph, index: int, how: str) -> dict:
    node = graph.nodes[index]
    return {"index": index, "op": node.op, "value": node.outputs[0], "loc": node.loc or "?", "how": how}


def first_divergent_node(backend, graph: Graph, inputs: list[torch.Tensor], workdir: Path,
                         tolerance: dict[torch.dtype, Tolerance] | None = None) -> dict | None:
    """The first node (in graph order) whose output, computed by `backend` from the
    reference's inputs, is off; else the first prefix whose outputs are off; None when all agree.
    The dict has the node's index, op, first output value, model line, and `how` it was found."""
    reference = _reference(graph, inputs)
    probe, checks = isolate(graph)
    try:
        backend.lower({"probe": probe}, Path(workdir) / "nodes")
        outs = backend.load(Path(workdir) / "nodes").run("probe", *[reference[v] for v in probe.inputs])
    except Exception as e:  # a backend that cannot take a node alone still has the prefix search
        failed = f"{type(e).__name__}: {' '.join(str(e).split())[:120]}"
    else:
        failed = None
        for (i, v, _), actual in zip(checks, outs):
            off, how = node_off(graph.nodes[i].op, actual, reference[v], tolerance)
            if off:
                return _describe(graph, i, f"off on the reference's inputs: {how}")
    found = first_divergent_prefix(backend, graph, inputs, Path(workdir) / "prefix", tolerance, reference)
    if found is not None:
        why = f"the node probe failed ({failed})" if failed else "no node is off on the reference's inputs"
        found["how"] = f"first prefix whose outputs are off ({why}: the error is in how nodes are joined)"
    return found


def first_divergent_prefix(backend, graph: Graph, inputs: list[torch.Tensor], workdir: Path,
                           tolerance: dict[torch.dtype, Tolerance] | None = None,
                           reference: dict[str, torch.Tensor] | None = None) -> dict | None:
    """The first node (in graph order) whose outputs, computed by `backend` on a prefix of the
    graph, differ from the interpreter's beyond tolerance; None when all agree.

    Binary search over node positions: the probe for position i is the prefix of the graph
    up to node i with every floating-point value it computes as an output, so "some node up to
    i is off" is monotone in i even when the graph branches.
    """
    tolerance = tolerance or TOLERANCES
    reference = reference if reference is not None else _reference(graph, inputs)
    floats = [i for i, n in enumerate(graph.nodes) if n.op not in SOURCES and _is_float(graph, n.outputs[0])]

    def off(value: str, actual: torch.Tensor) -> bool:
        tol = tolerance.get(actual.dtype)
        c = compare(actual, reference[value])
        return tol is not None and not (c.finite and c.rel_rms_err <= tol.rel_rms)

    def first_bad_in_prefix(i: int) -> str | None:
        values = [o for n in graph.nodes[: i + 1] for o in n.outputs if o in reference and _is_float(graph, o)]
        d = Path(workdir) / f"upto{i}"
        backend.lower({"probe": extract(graph, values, name="probe")}, d)
        outs = backend.load(d).run("probe", *inputs)
        return next((v for v, o in zip(values, outs) if off(v, o)), None)

    if not floats or first_bad_in_prefix(floats[-1]) is None:
        return None
    lo, hi = 0, len(floats) - 1  # invariant: the prefix up to floats[hi] has an off value
    while lo < hi:
        mid = (lo + hi) // 2
        if first_bad_in_prefix(floats[mid]) is not None:
            hi = mid
        else:
            lo = mid + 1
    return _describe(graph, floats[hi], "first prefix whose outputs are off")
