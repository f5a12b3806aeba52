"""Small models of the tests' own, built from the zoo's layers, for what the zoo never does:
a layer called twice (tied weights), slices along the sequence axis."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from k3c.models.common import CausalLM, RMSNorm, init_weights
from k3c.models.kda_layer import KDAMixer


@dataclass
class SmallConfig:
    vocab_size: int = 64
    hidden_size: int = 32


class TiedKDA(CausalLM):
    """One KDA layer applied twice (its weights tied), each use with its own state."""

    name = "tied-kda"

    def __init__(self):
        super().__init__()
        self.config = SmallConfig()
        d = self.config.hidden_size
        self.embed, self.mixer = nn.Embedding(64, d), KDAMixer(d, 2, 16)
        self.norm, self.head = RMSNorm(d), nn.Linear(d, 64, bias=False)

    def step(self, ids, state):
        h, new = self.embed(ids), {}
        for i in range(2):
            st = None if state is None else {k.split(".", 1)[1]: v for k, v in state.items() if k.startswith(f"l{i}.")}
            a, st = self.mixer(h, st)
            h = h + a
            new.update({f"l{i}.{k}": v for k, v in st.items()})
        return self.head(self.norm(h)), new


class TokenShift(CausalLM):
    """h + shift(h): each position also sees the previous token's embedding (h[:, :-1])."""

    name = "token-shift"

    def __init__(self):
        super().__init__()
        self.config = SmallConfig()
        self.embed, self.head = nn.Embedding(64, 32), nn.Linear(32, 64, bias=False)

    def step(self, ids, state):
        h = self.embed(ids)
        prev = torch.zeros_like(h[:, :1]) if state is None else state["last"]
        return self.head(h + torch.cat([prev, h[:, :-1]], dim=1)), {"last": h[:, -1:]}


class PairSums(CausalLM):
    """Sums tokens in pairs (a view [B, T // 2, 2, d]): only even lengths work."""

    name = "pair-sums"

    def __init__(self):
        super().__init__()
        self.config = SmallConfig()
        self.embed, self.head = nn.Embedding(64, 32), nn.Linear(32, 64, bias=False)

    def step(self, ids, state):
        h = self.embed(ids)
        B, T, d = h.shape
        return self.head(h.view(B, T // 2, 2, d).sum(2).repeat_interleave(2, dim=1)), {}


def build(cls) -> CausalLM:
    return init_weights(cls()).eval()
