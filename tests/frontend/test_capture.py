"""Capture every model of the zoo, then run the graph at other lengths and batch sizes."""

from __future__ import annotations

import time

import pytest
import torch
from factories import TINY, example_ids

import k3c
from k3c.frontend import UnsupportedOpError
from k3c.ir import interpret, parse, print_graph
from k3c.numerics import scaled_max_abs_err as max_abs_err

# The bar for interpreter vs eager in fp32: max |a - b| below 1e-5, relative to the
# reference's magnitude where that exceeds 1 (states grow with T).
MAX_ABS = 1e-5


@pytest.mark.parametrize("T", [37, 70], ids=lambda t: f"T{t}")
@pytest.mark.parametrize("name", TINY)
def test_prefill_graph_equals_eager_at_other_lengths(zoo, name, T):
    model, graph, _ = zoo(name)
    ids = example_ids(model, 2, T, seed=T)
    outs = interpret(graph, ids)
    with torch.no_grad():
        logits, state = model.prefill(ids)
    names = [k for k, _ in graph.outputs]
    assert names == ["logits"] + list(state)
    assert max_abs_err(outs[0], logits) < MAX_ABS
    for n, got in zip(names[1:], outs[1:]):
        assert got.shape == state[n].shape, n
        assert max_abs_err(got, state[n]) < MAX_ABS, n


@pytest.mark.parametrize("name", TINY)
def test_decode_graph_equals_eager_decode(zoo, name):
    model, _, graph = zoo(name)
    ids = example_ids(model, 3, 21, seed=1)
    with torch.no_grad():
        _, state = model.prefill(ids[:, :20])
        logits, new_state = model.decode(ids[:, 20:], state)
    assert graph.inputs[0] == "input_ids" and set(graph.inputs[1:]) == set(state)
    outs = interpret(graph, ids[:, 20:], *[state[n] for n in graph.inputs[1:]])
    assert max_abs_err(outs[0], logits) < MAX_ABS
    for (n, _), got in zip(graph.outputs[1:], outs[1:]):
        assert max_abs_err(got, new_state[n]) < MAX_ABS, n


@pytest.mark.parametrize("name", TINY)
def test_recurrent_ops_are_single_nodes(zoo, name):
    model, graph, decode = zoo(name)
    counts = graph.op_counts()
    recurrent = {"kda", "gated_delta_rule", "delta_rule", "linear_attention"}
    n_mixers = sum(counts.get(op, 0) for op in recurrent | {"causal_attention", "mla_attention"})
    layers = model.config.n_layer if hasattr(model.config, "n_layer") else model.config.num_layers
    assert n_mixers == layers
    assert decode.op_counts() .get("kda", 0) == counts.get("kda", 0)


@pytest.mark.parametrize("entry", ["prefill", "decode"])
@pytest.mark.parametrize("name", TINY)
def test_text_round_trip(zoo, name, entry):
    _, prefill, decode = zoo(name)
    graph = prefill if entry == "prefill" else decode
    text = print_graph(graph)
    again = parse(text)
    assert again.structurally_equal(graph)
    assert print_graph(again) == text


def test_dims_are_named_and_dynamic(zoo):
    _, prefill, decode = zoo("k3-tiny")
    assert set(prefill.dims) == {"B", "T"}
    assert set(decode.dims) == {"B", "P"}
    assert str(prefill.types["input_ids"]) == "i64[B, T]"
    assert str(decode.types["layers.3.ckv"]) == "f32[B, P, 32]"
    assert str(decode.types[dict(decode.outputs)["layers.3.ckv"]]) == "f32[B, P + 1, 32]"


class _Unsupported(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x):
        spec = torch.fft.rfft(self.proj(x), dim=-1).abs()
        return spec.sum(-1) + torch.erf(x).sum(-1)


def test_unsupported_ops_are_all_named_with_their_lines():
    with pytest.raises(UnsupportedOpError) as e:
        k3c.capture(_Unsupported(), (torch.randn(2, 8, 16),))
    msg = str(e.value)
    assert "_fft_r2c" in msg and "erf" in msg
    assert "test_capture.py" in msg and "torch.fft.rfft(self.proj(x)" in msg
    assert len(e.value.unknown) == 2


def test_capture_of_a_plain_module_with_dynamic_dims():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = k3c.models.common.RMSNorm(32)
            self.mlp = k3c.models.common.GatedMLP(32, 64, act="situ")

        def forward(self, x):
            return x + self.mlp(self.norm(x))

    block = k3c.models.common.init_weights(Block(), seed=3)
    graph = k3c.capture(block, (torch.randn(2, 8, 32),))
    x = torch.randn(3, 11, 32)
    assert max_abs_err(interpret(graph, x)[0], block(x)) < MAX_ABS
    assert "tanh" in graph.op_counts()


def test_node_count_grows_linearly_with_layers():
    """Full-size K3 layers on the meta device: the capture stays one node set per layer."""
    counts = {}
    for layers in (4, 8, 12):
        model = k3c.models.build("k3", num_layers=layers, mla_layers=(4, 8, 12))
        ids = torch.zeros(1, 16, dtype=torch.long, device="meta")
        t0 = time.perf_counter()
        counts[layers] = len(k3c.capture(model, (ids,)).nodes)
        assert time.perf_counter() - t0 < 120
    assert counts[12] - counts[8] == counts[8] - counts[4]


def test_concat_of_only_empty_parts_is_an_empty_tensor():
    """An MLA cache whose rope part has width 0 concatenates two empty tensors."""

    class Cat(torch.nn.Module):
        def forward(self, x):
            empty = x[..., :0]
            return torch.cat([empty, empty], dim=1), x

    x = torch.randn(2, 5, 3)
    g = k3c.capture(Cat(), (x,))
    y, _ = k3c.ir.interpret(g, torch.randn(2, 7, 3))
    assert tuple(y.shape) == (2, 14, 0)
