"""`torch.compile(model, backend="k3c")` against the eager module: a zoo model, a user module
on TVM, a graph with an op k3c does not know (eager, reason recorded), a weight changed in
place after compilation (eager from then on), and the recompile count against dynamo's."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.backends.registry import lookup_backend

import k3c
from k3c.errors import UsageError
from k3c.integrations import torch_compile as tc
from k3c.numerics import assert_close


@pytest.fixture(autouse=True)
def fresh():
    torch._dynamo.reset()
    tc.stats.reset()
    yield
    torch._dynamo.reset()


class Block(torch.nn.Module):
    """A user's module: linear, layer norm, GELU, a residual."""

    def __init__(self, d: int = 24):
        super().__init__()
        self.up, self.down, self.norm = torch.nn.Linear(d, 2 * d), torch.nn.Linear(2 * d, d), torch.nn.LayerNorm(d)

    def forward(self, x):
        return self.norm(x + self.down(torch.nn.functional.gelu(self.up(x))))


def test_k3c_is_a_torch_compile_backend_by_name():
    """Found through the torch_dynamo_backends entry point (pip install -e . registers it)."""
    assert lookup_backend("k3c") is tc.k3c_backend


def test_zoo_model_through_torch_compile_matches_eager():
    model = k3c.models.build("gpt2-tiny", seed=0).eval()
    compiled = torch.compile(model, backend="k3c")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for T in (9, 13, 21):  # a static graph, dynamo's recompile with T dynamic, then no recompile
            ids = torch.randint(0, model.config.vocab_size, (2, T), generator=gen)
            assert_close(compiled(ids), model(ids), what=f"gpt2-tiny logits at T={T}")
    assert not tc.stats.fallbacks, tc.stats.fallbacks
    assert tc.stats.compiles == 2 and tc.stats.recompiles == 1
    frames = {cid.split("/")[0] for cid in tc.stats.compile_ids}
    assert len(frames) == 1 and sorted(cid.split("/")[1] for cid in tc.stats.compile_ids) == ["0", "1"]


def test_user_module_on_tvm_matches_eager():
    module = Block().eval()
    compiled = torch.compile(module, backend="k3c", options={"backend": "tvm"}, dynamic=True)
    with torch.no_grad():
        for shape in ((3, 5, 24), (2, 11, 24)):
            x = torch.randn(*shape, generator=torch.Generator().manual_seed(shape[1]))
            assert_close(compiled(x), module(x), what=f"Block at {shape}")
    assert tc.stats.compiles == 1 and not tc.stats.fallbacks, tc.stats


def test_unknown_op_falls_back_to_eager_with_the_reason():
    class Bessel(torch.nn.Module):
        def forward(self, x):
            return torch.special.bessel_j0(x) * 2

    x = torch.randn(3, 4)
    got = torch.compile(Bessel(), backend="k3c")(x)
    torch.testing.assert_close(got, Bessel()(x), rtol=0, atol=0)  # eager itself: bit for bit
    assert tc.stats.compiles == 0 and len(tc.stats.fallbacks) == 1
    graph, reason = tc.stats.fallbacks[0]
    assert "bessel_j0" in reason and "\n" not in reason, reason


def test_weight_changed_in_place_runs_eagerly_from_then_on():
    module = Block().eval()
    compiled = torch.compile(module, backend="k3c")
    x = torch.randn(2, 5, 24)
    with torch.no_grad():
        assert_close(compiled(x), module(x))
        module.up.weight.mul_(-1.5)
        assert_close(compiled(x), module(x), what="after the weight changed")
    assert [reason for _, reason in tc.stats.fallbacks] == ["a weight changed after k3c compiled the graph"]


def test_a_call_autograd_records_runs_eagerly_with_its_gradients():
    module = Block().eval()
    compiled = torch.compile(module, backend="k3c")
    compiled(torch.randn(2, 5, 24)).sum().backward()
    assert module.up.weight.grad is not None and module.up.weight.grad.abs().sum() > 0
    assert tc.stats.compiles == 0 and [r for _, r in tc.stats.fallbacks] == [tc.GRAD_REASON]


def test_unknown_option_is_a_usage_error():
    with pytest.raises(Exception) as info:
        torch.compile(Block(), backend="k3c", options={"backnd": "tvm"})(torch.randn(2, 3, 24))
    err = info.value
    while err is not None and not isinstance(err, UsageError):
        err = err.__cause__ or err.__context__
    assert isinstance(err, UsageError) and "backnd" in str(err)
