"""A user's module captured with the dynamic dims the user means: a 2-D `[N, 512]` activation
and a KDA call taking `(q, k, v, g, beta, state)`, by default, by name (`dims=`) and as
torch.export takes them (`dynamic_shapes=`), each run on the reference, onnx and tvm backends
against eager at two values of every dynamic dim; a wrong naming is one clear InputError."""

from __future__ import annotations

import json

import pytest
import torch
from torch.export import Dim

import k3c
from k3c.errors import InputError, UsageError
from k3c.numerics import assert_close

H, K = 2, 8


class Proj(torch.nn.Module):
    """One linear on `[N, 512]`: dim 1 is a feature dim, never a sequence."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(512, 24)

    def forward(self, x):
        return torch.tanh(self.proj(x))


class KDACall(torch.nn.Module):
    """The recurrent op alone; its state `[B, H, K, V]` has H at dim 1, not T."""

    def forward(self, q, k, v, g, beta, state):
        return k3c.kernels.ops.kda(q, k, v, g, beta, state, K**-0.5)


def kda_inputs(B: int, T: int, seed: int = 0) -> tuple:
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    q, k = torch.nn.functional.normalize(r(B, T, H, K), dim=-1), torch.nn.functional.normalize(r(B, T, H, K), dim=-1)
    g = -torch.nn.functional.softplus(r(B, T, H, K))  # log-decays, <= 0
    return q, k, r(B, T, H, K), g, torch.sigmoid(r(B, T, H)), r(B, H, K, K) * 0.1


@pytest.fixture(scope="module")
def proj():
    return k3c.models.common.init_weights(Proj(), seed=1).eval()


@pytest.fixture(scope="module")
def compiled(proj, tmp_path_factory):
    """Each module compiled once per backend: the default dims for KDACall, named N for Proj."""
    out = {}
    for backend in ("reference", "onnx", "tvm"):
        root = tmp_path_factory.mktemp(f"user-{backend}")
        out[backend, "proj"] = k3c.compile(proj, backend, (torch.randn(6, 512),), out_dir=root / "proj",
                                           dims={"x": "N _"})
        out[backend, "kda"] = k3c.compile(KDACall(), backend, kda_inputs(1, 16), out_dir=root / "kda")
    return out


@pytest.mark.parametrize("backend", ["reference", "onnx", "tvm"])
def test_a_2d_module_runs_at_two_values_of_its_named_dim(compiled, proj, backend):
    run = compiled[backend, "proj"]
    assert run.graphs["forward"].meta["dynamic"] == {"x": "N _"}
    for n in (3, 41):
        x = torch.randn(n, 512, generator=torch.Generator().manual_seed(n))
        with torch.no_grad():
            assert_close(run(x), proj(x), torch.float32)


@pytest.mark.parametrize("backend", ["reference", "onnx", "tvm"])
def test_a_kda_call_with_its_state_runs_at_two_lengths_and_batches(compiled, backend):
    run = compiled[backend, "kda"]
    g = run.graphs["forward"]
    assert g.meta["dims_from"] == "the default"
    assert g.meta["dynamic"]["q"] == "B T _ _" and g.meta["dynamic"]["state"] == "B _ _ _"
    for B, T in ((1, 16), (2, 37)):
        inputs = kda_inputs(B, T, seed=T)
        o, S = run(*inputs)
        want_o, want_S = k3c.kernels.kda(*inputs[:5], scale=K**-0.5, initial_state=inputs[5])  # the recurrence
        assert_close(o, want_o, torch.float32)
        assert_close(S, want_S, torch.float32)


def test_the_manifests_record_the_dims_taken(compiled):
    onnx_entry = json.loads((compiled["onnx", "proj"].out_dir / "manifest.json").read_text())["entries"]["forward"]
    tvm_entry = json.loads((compiled["tvm", "kda"].out_dir / "manifest.json").read_text())["entries"]["forward"]
    assert onnx_entry["dynamic"] == {"x": "N _"}
    assert tvm_entry["dynamic"]["beta"] == "B T _" and tvm_entry["dynamic"]["state"] == "B _ _ _"


def test_torch_exports_own_spec_and_the_named_forms_agree(proj):
    x = torch.randn(6, 512)
    by_torch = k3c.capture(proj, (x,), dynamic_shapes={"x": {0: Dim("N")}})
    by_axis = k3c.capture(proj, (x,), dims={"x": {0: "N"}})
    assert by_torch.meta["dynamic"] == by_axis.meta["dynamic"] == {"x": "N _"}
    assert by_torch.meta["dims_from"] == "dynamic_shapes=" and str(by_axis.types["x"]) == "f32[N, 512]"
    static = k3c.capture(proj, (x,), dynamic=False)
    assert static.meta["dynamic"] == {} and not static.dims


def test_named_dims_shared_across_inputs_and_all_else_static():
    names = {"q": "B T _ _", "k": "B T _ _", "v": "B T _ _", "g": "B T _ _", "beta": "B T _", "state": "B _ _ _"}
    g = k3c.capture(KDACall(), kda_inputs(2, 16), dims=names)
    assert set(g.dims) == {"B", "T"} and str(g.types["state"]) == f"f32[B, {H}, {K}, {K}]"
    only_b = k3c.capture(KDACall(), kda_inputs(2, 16), dims={n: "B" + " _" * (len(f.split()) - 1)
                                                               for n, f in names.items()})
    assert set(only_b.dims) == {"B"} and str(only_b.types["q"]) == f"f32[B, 16, {H}, {K}]"


@pytest.mark.parametrize("dims, words", [
    ({"state": {1: "T"}}, ["'state'", "dim 1", "size 2", "fixes T at 2", "dims={"]),
    ({"x": "N _"}, ["no input named 'x'", "q, k, v, g, beta, state"]),
    ({"q": "B T _"}, ["3 tokens", "'q'", "rank 4"]),
    ({"q": "B T 5 _"}, ["'q' dim 2 is 2", "not 5"]),
    ({"q": {7: "B"}}, ["'q'", "no axis 7"]),
], ids=["state-dim-as-T", "unknown-input", "token-count", "wrong-static-size", "no-such-axis"])
def test_a_wrong_naming_is_one_clear_line(dims, words):
    with pytest.raises(InputError) as e:
        k3c.capture(KDACall(), kda_inputs(1, 16), dims=dims)
    msg = str(e.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, (w, msg)


def test_a_size_that_equals_t_by_chance_does_not_fix_t():
    """At T == H the default's first guess takes the state's dim 1 for T too, which the module
    fixes at H; the second puts T on the first `[B, T, ...]` input only, and says so."""
    g = k3c.capture(KDACall(), kda_inputs(1, H))
    assert g.meta["dynamic"] == {"q": "B T _ _", "k": "B T _ _", "v": "B T _ _", "g": "B T _ _",
                                 "beta": "B T _", "state": "B _ _ _"}
    x = kda_inputs(2, 5, seed=3)
    want = KDACall()(*x)
    for got, ref in zip(k3c.ir.interpret(g, *x), want):
        assert_close(got, ref, "fp32")


class FixedLength(torch.nn.Module):
    """Flattens T into the features: T is fixed by the module, whatever is guessed."""

    def forward(self, x):
        return x.reshape(x.shape[0], 32).sum(-1)


def test_a_default_guess_torch_refuses_says_which_dim_and_what_to_write():
    with pytest.raises(InputError) as e:
        k3c.capture(FixedLength(), (torch.randn(2, 4, 8),))
    msg = str(e.value)
    assert "\n" not in msg and "the default took T = dim 1 (size 4) of input 'x'" in msg
    assert "dims={'x': 'B _ _'}" in msg


def test_a_zoo_model_refuses_dims():
    model = k3c.models.build("gpt2-tiny")
    with pytest.raises(UsageError, match="zoo model"):
        k3c.compile(model, "reference", (torch.zeros(1, 4, dtype=torch.long),), dims={"input_ids": "B T"})


class PublicKernels(torch.nn.Module):
    """The public kernels as a user calls them, no state given to two of them."""

    def forward(self, q, k, v, g, beta, state):
        o, S = k3c.kernels.kda(q, k, v, g, beta, initial_state=state)
        o2, S2 = k3c.kernels.gated_delta_rule(q, k, v, g[..., 0], beta)
        o3, S3 = k3c.kernels.delta_rule(q, k, v, beta, scale=0.3)
        return o + o2 + o3, S, S2, S3


def test_the_public_kernels_capture_as_one_node_each_with_a_dynamic_length():
    graph = k3c.capture(PublicKernels(), kda_inputs(1, 16))
    counts = graph.op_counts()
    assert counts["kda"] == counts["gated_delta_rule"] == counts["delta_rule"] == 1
    assert graph.meta["dynamic"]["q"] == "B T _ _"
    for B, T in ((1, 16), (2, 29)):
        inputs = kda_inputs(B, T, seed=T)
        with torch.no_grad():
            want = PublicKernels()(*inputs)  # eager: the Python recurrences
        for got, ref in zip(k3c.ir.interpret(graph, *inputs), want):
            assert_close(got, ref, torch.float32)
