"""A NaN at one token of one sequence propagates through the chunked delta rule on every
backend as it does in the eager recurrence (the reference): the same NaN masks of output and
final state, so never to earlier tokens of its chunk (the masked products 0 * NaN of a
lower-triangular matmul did that, in ONNX's chunk_prepare and chunk_output and in the blocked
inverse of (I + L)) nor to the other sequence. T = 40 in chunks of 16: the NaN sits at token
23, inside the second chunk. A NaN in the start state's one entry is checked too."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import sympy
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/edge_decays.py, shared by the backends' tests
from edge_decays import SCALE, edge_case  # noqa: E402

from k3c import backends  # noqa: E402
from k3c.backend_spec import parse_backend  # noqa: E402
from k3c.compiler import prepare  # noqa: E402
from k3c.ir import Graph, Node, TensorType, verify  # noqa: E402
from k3c.ir.ops import OPS  # noqa: E402
from k3c.kernels import kda  # noqa: E402

BACKENDS = ["reference", "onnx", "onnx:ort", "tvm", "triton"]
WHERE = ["k", "v", "g", "beta", "S"]
T_NAN = 23


def kda_graph(B: int, T: int, H: int, K: int, V: int) -> Graph:
    g = Graph("case.kda", dims={"B": (1, None), "T": (1, None)})
    b, t = (sympy.Symbol(n, integer=True, positive=True) for n in "BT")
    shapes = {"q": (b, t, H, K), "k": (b, t, H, K), "v": (b, t, H, V), "g": (b, t, H, K), "beta": (b, t, H),
              "S": (b, H, K, V)}
    for name, shape in shapes.items():
        g.inputs.append(name)
        g.types[name] = TensorType("f32", shape)
    outs = ["o", "S_out"]
    attrs = {"scale": SCALE}
    g.types.update(zip(outs, OPS["kda"].infer(*[g.types[n] for n in shapes], **OPS["kda"].full_attrs(attrs))))
    g.nodes.append(Node("kda", list(shapes), outs, attrs))
    g.outputs = [(o, o) for o in outs]
    return verify(g)


@pytest.fixture(scope="module")
def runners(tmp_path_factory):
    x = edge_case("one-step", "channel", B=2, T=40)
    graph = kda_graph(*x.q.shape, x.v.shape[-1])
    cache = {}

    def get(name: str):
        if name not in cache:
            spec = parse_backend(name)
            be = backends.get(spec.name, **spec.options())
            out = tmp_path_factory.mktemp(name.replace(":", "-"))
            be.lower(prepare({"forward": graph}, be, ["chunk-delta-rule{chunk_size=16}"]), out)
            cache[name] = be.load(out)
        return cache[name]

    return x, get


def _with_nan(x, where: str) -> list[torch.Tensor]:
    args = [a.clone() for a in x.args()]
    if where == "S":
        args[5][0, 0, 1, 2] = float("nan")
    else:
        args["q k v g beta".split().index(where)][0, T_NAN, 0] = float("nan")  # sequence 0, head 0
    return args


# Triton runs in its interpreter here (seconds a call): the NaN in k (through the inverse of
# I + L, as g and beta) and in v (the products alone)
CASES = [(b, w) for b in BACKENDS for w in WHERE if b != "triton" or w in ("k", "v")]


@pytest.mark.parametrize("backend, where", CASES)
def test_a_nan_propagates_as_in_the_recurrence(runners, backend, where):
    x, get = runners
    args = _with_nan(x, where)
    o_ref, S_ref = kda(*args[:5], scale=SCALE, initial_state=args[5])  # the recurrence
    o, S = get(backend).run("forward", *args)[:2]
    assert torch.isnan(o_ref).any() and torch.isfinite(o_ref[1]).all()  # the case bites, and stays in its row
    assert torch.equal(torch.isnan(o), torch.isnan(o_ref)), \
        f"{backend}: NaN at {int(torch.isnan(o).sum())} outputs, the recurrence at {int(torch.isnan(o_ref).sum())}"
    assert torch.equal(torch.isnan(S), torch.isnan(S_ref)), f"{backend}: the final state's NaNs differ"
