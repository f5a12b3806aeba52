"""The zoo's models with heads on tp=2 (k3c/distributed/partition_zoo.py): GPT-2 and the linear-attention
family, each rank's artifact on the reference backend against the one-process eager model
(prefill, two decode steps, the state joined from the shards) under the fp32 tolerance, and
the mesh errors a model without experts gives."""

from __future__ import annotations

import pytest
import torch

from k3c import models
from k3c.cli import main
from k3c.distributed.diff import diff_mesh
from k3c.distributed.mesh import Mesh
from k3c.distributed.partition import partition
from k3c.distributed.simulate import run_ranks
from k3c.distributed.state import join_state
from k3c.numerics import assert_close

ZOO = ("gated-deltanet-tiny", "deltanet-tiny", "linear-attn-tiny", "gpt2-tiny")


@pytest.mark.parametrize("name", ZOO)
def test_tp2_reference_matches_eager(name):
    model = models.build(name).eval()
    r = diff_mesh(model, ["reference"], "tp=2", seq_len=9, batch=2, decode_steps=2, simulate=True, timeout_s=120)
    rows = r["backends"]["reference"]
    assert r["ok"], rows
    # each rank sent its all-reduces: one per mixer and one per MLP a layer
    assert all(s.get("all_reduce", 0) > 0 for s in rows["sent"])


@pytest.mark.parametrize("name", ZOO)
def test_tp2_eager_parts_match_the_whole_model(name):
    """The two ranks' eager parts (threads over one exchange) against the one-process model
    under the fp32 tolerance row: prefill logits, one decode step, the joined state."""
    model, mesh = models.build(name).eval(), Mesh.parse("tp=2")
    ids = torch.randint(0, model.config.vocab_size, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits, state = model.prefill(ids[:, :9])
        step, after = model.decode(ids[:, 9:], state)
    parts = [partition(model, mesh, r) for r in range(mesh.world)]

    def rank(r: int):
        with torch.no_grad():
            lo, s = parts[r].prefill(ids[:, :9])
            return (lo, *parts[r].decode(ids[:, 9:], s))
    results, comms = run_ranks(rank, mesh.world)
    for lo, st, _ in results:
        assert_close(lo, logits, what=f"{name} prefill logits")
        assert_close(st, step, what=f"{name} decode logits")
    joined = join_state([r[2] for r in results], mesh)
    for k in after:
        assert_close(joined[k], after[k], what=f"{name} state {k}")
    assert all(c.calls["all_reduce"] > 0 for c in comms)


def test_shards_hold_half_the_heads():
    """What a rank holds: half the heads' projections (by the config), the norms whole."""
    model = models.build("gated-deltanet-tiny")
    c = model.config
    part = partition(model, "tp=2", 1)
    mix = part.model.layers[0].attn
    assert mix.H == c.num_heads // 2
    assert tuple(mix.q_proj.weight.shape) == (c.num_heads // 2 * c.head_k_dim, c.hidden_size)
    assert tuple(mix.o_proj.weight.shape) == (c.hidden_size, c.num_heads // 2 * c.head_v_dim)
    assert tuple(mix.A_log.shape) == (c.num_heads // 2,) and tuple(mix.o_norm.weight.shape) == (c.head_v_dim,)
    gpt = partition(models.build("gpt2-tiny"), "tp=2", 1).transformer.h[0]
    # the output projection's bias is added once, by tp index 0: index 1 holds zeros
    assert float(gpt.attn.c_proj.bias.abs().sum()) == 0.0 and gpt.attn.c_attn.out_features == 3 * 128 // 2


def test_cli_diff_tp2_in_processes(capsys):
    assert main(["diff", "--model", "gated-deltanet-tiny", "--backends", "reference", "--mesh", "tp=2"]) == 0
    assert "gated-deltanet-tiny on tp=2, ep=1 (2 ranks)" in capsys.readouterr().out


@pytest.mark.parametrize("mesh, says", [
    ("tp=3", "tp=3 does not divide the 4 heads (num_heads)"),
    ("ep=2", "ep=2: a LinearConfig has no routed experts to split"),
    ("tp=2,vocab", "vocabulary is not split"),
])
def test_zoo_mesh_errors_are_one_line(capsys, mesh, says):
    assert main(["diff", "--model", "deltanet-tiny", "--backends", "reference", "--mesh", mesh]) == 2
    err = capsys.readouterr().err
    assert says in err and err.strip().count("\n") == 0, err
