"""The collectives' references, run for every rank in the simulator, against their naive
one-process definitions (sums, concatenations, rows by destination, a whole MoE)."""

from __future__ import annotations

import pytest
import torch

from k3c.distributed.comm import Exchange, SimComm
from k3c.distributed.simulate import RankError, run_ranks
from k3c.ir.ops import OPS
from k3c.kernels.collectives import using


def _ref(op, *args, **attrs):
    return OPS[op].ref(*args, **attrs)


@pytest.mark.parametrize("M", [2, 3])
def test_reduce_gather_scatter(M):
    g = torch.Generator().manual_seed(M)
    xs = [torch.randn(2, 3 * M, generator=g) for _ in range(M)]
    group = list(range(M))
    out, comms = run_ranks(lambda r: (_ref("all_reduce", xs[r], group=group),
                                      _ref("all_gather", xs[r], group=group, dim=1),
                                      _ref("reduce_scatter", xs[r], group=group, dim=1)), M)
    total = sum(xs[1:], xs[0])
    for r, (ar, ag, rs) in enumerate(out):
        torch.testing.assert_close(ar, total)
        torch.testing.assert_close(ag, torch.cat(xs, 1))
        torch.testing.assert_close(rs, total[:, 3 * r:3 * (r + 1)])
        nbytes = xs[r].nbytes
        assert comms[r].sent["all_reduce"] == 2 * (M - 1) * nbytes / M
        assert comms[r].sent["all_gather"] == (M - 1) * nbytes


def test_all_to_all_uneven():
    M, group = 3, [0, 1, 2]
    counts = torch.tensor([[1, 0, 2], [3, 1, 0], [0, 2, 2]])
    xs = [torch.arange(int(c.sum()) * 2, dtype=torch.float32).view(-1, 2) + 100 * r for r, c in enumerate(counts)]
    out, comms = run_ranks(lambda r: _ref("all_to_all", xs[r], counts[r], group=group, rows="R"), M)
    for r, (y, got) in enumerate(out):
        want = [torch.split(xs[s], counts[s].tolist())[r] for s in range(M)]
        torch.testing.assert_close(y, torch.cat(want))
        assert got.tolist() == counts[:, r].tolist()
        away = sum(int(c) for j, c in enumerate(counts[r]) if j != r)
        assert comms[r].sent["all_to_all"] == away * 2 * 4 + 8 * (M - 1)


def test_moe_dispatch_combine_is_the_moe():
    """Tokens to their experts' owners and back: the same as every expert in one process."""
    M, E, N, k, D = 2, 4, 5, 2, 3
    g = torch.Generator().manual_seed(0)
    h, W = torch.randn(N, D, generator=g), torch.randn(E, D, D, generator=g)
    idx = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(N)])
    w = torch.rand(N, k, generator=g)
    want = sum(w[:, j:j + 1] * torch.einsum("nd,nde->ne", h, W[idx[:, j]]) for j in range(k))
    group, per = [0, 1], E // M

    def rank(r):
        x, ids, route = _ref("moe_dispatch", h, idx, group=group, experts=per, rows="R")
        y = torch.einsum("rd,rde->re", x, W[r * per:(r + 1) * per][ids[:, 0]])
        return _ref("moe_combine", y, route, w, group=group)
    out, _ = run_ranks(rank, M)
    for y in out:
        torch.testing.assert_close(y, want)


def test_a_failing_or_missing_rank_is_reported():
    with pytest.raises(RankError, match="rank 1 failed: ValueError: boom"):
        run_ranks(lambda r: (_ for _ in ()).throw(ValueError("boom")) if r == 1
                  else _ref("all_reduce", torch.ones(2), group=[0, 1]), 2)
    ex = Exchange(timeout_s=0.5)  # rank 1 never comes
    with using(SimComm(0, ex)), pytest.raises(TimeoutError, match=r"rank\(s\) \[1\] did not reach"):
        _ref("all_reduce", torch.ones(2), group=[0, 1])
