"""The public kernel entry points check their inputs once, for both paths: the chunked form
accepts exactly what the recurrent definition accepts, and a misfit is an InputError that
names the argument (it used to reshape a transposed state or a short v without a word)."""

from __future__ import annotations

import pytest
import torch
from kernel_inputs import B, H, K, V, delta_inputs, linear_inputs

from k3c.errors import InputError
from k3c.kernels import delta_rule, gated_delta_rule, kda, linear_attention, short_conv

PATHS = pytest.mark.parametrize("chunk_size", [None, 16], ids=["recurrent", "chunked"])


def _kda_args(T: int = 20):
    x = delta_inputs(T, gate="channel", with_state=True)
    return dict(q=x.q, k=x.k, v=x.v, g=x.g, beta=x.beta, initial_state=x.state)


def _call(args: dict, chunk_size):
    a = dict(args)
    return kda(a.pop("q"), a.pop("k"), a.pop("v"), a.pop("g"), a.pop("beta"), chunk_size=chunk_size, **a)


BAD_KDA = {
    "state-transposed": (lambda a: {**a, "initial_state": a["initial_state"].transpose(-1, -2)}, "initial_state"),
    "v-one-token-short": (lambda a: {**a, "v": a["v"][:, :-1]}, "v must be"),
    "g-per-head": (lambda a: {**a, "g": a["g"][..., 0]}, "g must be"),
    "integer-q": (lambda a: {**a, "q": a["q"].long()}, "q must be floating point"),
    "k-other-heads": (lambda a: {**a, "k": a["k"][:, :, :1]}, "k must be"),
    "beta-per-channel": (lambda a: {**a, "beta": a["beta"][..., None].expand(-1, -1, -1, K)}, "beta must be"),
}


@PATHS
@pytest.mark.parametrize("case", list(BAD_KDA))
def test_kda_paths_refuse_the_same_bad_input(case, chunk_size):
    edit, words = BAD_KDA[case]
    with pytest.raises(InputError, match=words):
        _call(edit(_kda_args()), chunk_size)


@pytest.mark.parametrize("chunk_size", [0, -4, True, 2.5], ids=["zero", "negative", "bool", "float"])
def test_chunk_size_must_be_a_positive_int(chunk_size):
    with pytest.raises(InputError, match="chunk_size"):
        _call(_kda_args(), chunk_size)


@pytest.mark.parametrize("shape", ["T0", "B0"])
def test_empty_inputs_agree_on_both_paths(shape):
    args = _kda_args()
    if shape == "T0":
        args = {k: (v[:, :0] if k != "initial_state" else v) for k, v in args.items()}
    else:
        args = {k: v[:0] for k, v in args.items()}
    o_r, s_r = _call(args, None)
    o_c, s_c = _call(args, 16)
    assert o_r.shape == o_c.shape == (*args["q"].shape[:3], V)
    assert torch.equal(o_r, o_c) and torch.equal(s_r, s_c)
    if shape == "T0":  # no step: the state is the initial one
        assert torch.equal(s_c, args["initial_state"])


@PATHS
def test_gated_delta_rule_takes_one_gate_per_head(chunk_size):
    x = delta_inputs(12, gate="channel")
    with pytest.raises(InputError, match=r"g must be \[B, T, H\]"):
        gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, chunk_size=chunk_size)


@PATHS
def test_delta_rule_names_a_misshapen_state(chunk_size):
    x = delta_inputs(12, gate=None)
    with pytest.raises(InputError, match="initial_state"):
        delta_rule(x.q, x.k, x.v, x.beta, initial_state=torch.zeros(B, H, V, K), chunk_size=chunk_size)


@PATHS
def test_linear_attention_names_a_misshapen_normaliser(chunk_size):
    q, k, v, (S, z) = linear_inputs(12, with_state=True)
    with pytest.raises(InputError, match=r"initial_state\[1\] \(z\)"):
        linear_attention(q, k, v, initial_state=(S, z[..., :-1]), chunk_size=chunk_size)


def test_short_conv_names_a_state_of_the_wrong_width():
    x, w = torch.randn(2, 5, 6), torch.randn(6, 4)
    with pytest.raises(InputError, match=r"state must be \[B, C, W - 1\]"):
        short_conv(x, w, torch.zeros(2, 6, 4))
    y, s = short_conv(x, w, torch.zeros(2, 6, 3))
    assert y.shape == (2, 5, 6) and s.shape == (2, 6, 3)
