"""Helpers of the pass tests: IR text in, IR text out, and the interpreter as the judge."""

from __future__ import annotations

import textwrap

import torch

from k3c import ir, passes
from k3c.numerics import assert_close


def graph_of(text: str, seed: int = 0) -> ir.Graph:
    """Parse IR text and give its weights seeded random data (the text form carries none)."""
    g = ir.parse(textwrap.dedent(text))
    gen = torch.Generator().manual_seed(seed)
    for name in g.weights:
        t = g.types[name]
        shape = [int(d) for d in t.shape]
        fan_in = shape[-1] if shape else 1
        g.weights[name] = (torch.randn(shape, generator=gen) / fan_in**0.5).to(t.torch_dtype)
    return ir.verify(g)


def text(graph: ir.Graph) -> str:
    return str(graph)


def expected(text_: str) -> str:
    return textwrap.dedent(text_).strip() + "\n"


def inputs_for(graph: ir.Graph, env: dict[str, int], seed: int = 0, **given: torch.Tensor) -> list[torch.Tensor]:
    """Seeded inputs of the declared types at the dim binding `env`: integers in [0, 8),
    floats in (0, 1) (positive, so a linear-attention normaliser never crosses zero)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for name in graph.inputs:
        if name in given:
            out.append(given[name])
            continue
        t = graph.types[name]
        shape = [ir.dims.evaluate(d, env) for d in t.shape]
        if t.dtype in ("i64", "i32"):
            out.append(torch.randint(0, 8, shape, generator=gen).to(t.torch_dtype))
        else:
            out.append(torch.rand(shape, generator=gen).to(t.torch_dtype))
    return out


def assert_same_outputs(before: ir.Graph, after: ir.Graph, inputs: list[torch.Tensor], what: str = "") -> None:
    """The interpreter on both graphs, every output compared under the fp32 row of the table."""
    a, b = ir.interpret(before, *inputs), ir.interpret(after, *inputs)
    for (name, _), x, y in zip(before.outputs, a, b):
        if x.is_floating_point():
            assert_close(y.float(), x.float(), dtype=x.dtype, what=f"{what} output {name}")
        else:
            assert torch.equal(x, y), f"{what} output {name} differs"


def run_pass(graph: ir.Graph, *pipeline: str) -> tuple[ir.Graph, dict[str, int]]:
    """Run the passes (verifying after each); returns the new graph and the sites per rule."""
    report: list = []
    out = passes.run(graph, list(pipeline), report=report)
    sites: dict[str, int] = {}
    for entry in report:
        for k, v in entry.sites.items():
            sites[k] = sites.get(k, 0) + v
    return out, sites
