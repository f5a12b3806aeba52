"""Differential testing of your own model, built from the zoo's layers, across backends.

    python examples/diff_my_model.py [--backends reference,onnx,tvm,triton] [--json FILE]

The model is not one of the zoo: two KDA layers, then an MLA layer, each followed by a
latent MoE with a shared expert, a plain pre-norm residual stack, no AttnRes. What k3c needs
of it is what every zoo model has: a `config` with `vocab_size` and a `step(input_ids,
state) -> (logits, state)` whose state is a flat dict of named tensors (`CausalLM` turns
that into `forward`, `prefill` and `decode`).

`k3c.diff.diff` captures prefill and decode, runs the default passes, lowers to each backend,
and compares every output and state tensor with the eager model: a prefill several chunks
longer than the one captured, then decode steps fed with the backend's own state. When a
backend is off it names the first IR node that differs. The exit status is 1 then.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import torch.nn as nn

from k3c.diff import diff, write_json
from k3c.models.common import CausalLM, RMSNorm, add_prefix, init_weights, sub_state
from k3c.models.kda_layer import KDAMixer
from k3c.models.mla_layer import MLAMixer
from k3c.models.moe_layer import MoE


@dataclass
class MyConfig:
    vocab_size: int = 512
    hidden_size: int = 64
    layers: tuple[str, ...] = ("kda", "kda", "mla")
    heads: int = 2
    head_dim: int = 32
    experts: int = 8
    top_k: int = 2
    expert_hidden: int = 32
    latent: int = 32


class MyBlock(nn.Module):
    def __init__(self, cfg: MyConfig, kind: str):
        super().__init__()
        d = cfg.hidden_size
        self.norm1, self.norm2 = RMSNorm(d), RMSNorm(d)
        if kind == "kda":
            self.mixer = KDAMixer(d, cfg.heads, cfg.head_dim)  # k3's gate: lower-bounded sigmoid
        else:
            self.mixer = MLAMixer(d, cfg.heads, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16,
                                  qk_rope_head_dim=8, v_head_dim=16, output_gate=True)
        self.moe = MoE(d, cfg.experts, cfg.top_k, cfg.expert_hidden, num_shared=1, routed_scaling_factor=2.5,
                       latent_dim=cfg.latent, latent_norm=True)

    def forward(self, h, state):
        a, state = self.mixer(self.norm1(h), state)
        h = h + a
        return h + self.moe(self.norm2(h)), state


class MyModel(CausalLM):
    name = "my-hybrid"

    def __init__(self, cfg: MyConfig):
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.blocks = nn.ModuleList(MyBlock(cfg, kind) for kind in cfg.layers)
        self.norm = RMSNorm(cfg.hidden_size)
        self.head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def step(self, input_ids, state):
        h, new_state = self.embed(input_ids), {}
        for i, block in enumerate(self.blocks):
            h, st = block(h, sub_state(state, f"blocks.{i}."))
            new_state.update(add_prefix(st, f"blocks.{i}."))
        return self.head(self.norm(h)), new_state


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backends", default="reference,onnx,tvm,triton")
    p.add_argument("--seq-len", type=int, default=130, help="prefill length (captured at 16)")
    p.add_argument("--decode-steps", type=int, default=4)
    p.add_argument("--json", help="write the report here")
    args = p.parse_args(argv)

    model = init_weights(MyModel(MyConfig()), seed=0).eval()
    report = diff(model, args.backends.split(","), seq_len=args.seq_len,
                           decode_steps=args.decode_steps, progress=lambda msg: print(f"... {msg}", flush=True))
    print(report.table(per_tensor=False))
    if args.json:
        write_json(report, args.json)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
