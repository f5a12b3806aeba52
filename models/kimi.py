"""Kimi Linear and Kimi K3: KDA layers 3:1 with MLA, MoE, and (K3) Block AttnRes.

Module names follow the official checkpoint layout (K3-SPEC.md section 8), so that the
state dict is the checkpoint except for the packed routed experts.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..kernels import ops
from .common import CausalLM, GatedMLP, RMSNorm, State, add_prefix, sub_state
from .configs import KimiConfig
from .kda_layer import KDAMixer
from .mla_layer import MLAMixer
from .moe_layer import MoE
from .serving import Seq


def attn_res(bank: list[torch.Tensor], partial: torch.Tensor, norm: RMSNorm,
             proj: nn.Linear) -> torch.Tensor:
    """One use of the AttnRes mixing op: pseudo-query `proj` (Linear d -> 1), key norm `norm`."""
    V = torch.stack(bank + [partial])  # [N+1, B, T, d]
    return ops.attn_res_mix(V, proj.weight.view(-1), norm.weight, norm.eps)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: KimiConfig, i: int):
        super().__init__()
        d = cfg.hidden_size
        self.is_mla = (i + 1) in cfg.mla_layers
        self.input_layernorm = RMSNorm(d, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(d, cfg.rms_norm_eps)
        if self.is_mla:
            self.self_attn = MLAMixer(d, cfg.mla_heads, cfg.q_lora_rank, cfg.kv_lora_rank,
                                      cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim,
                                      cfg.mla_output_gate, cfg.mla_norm_eps)
        else:
            self.self_attn = KDAMixer(d, cfg.kda_heads, cfg.kda_head_dim, cfg.conv_size,
                                      cfg.kda_gate, cfg.gate_lower_bound, cfg.kda_out_gate_rank,
                                      cfg.rms_norm_eps)
        act = (cfg.activation, cfg.situ_beta, cfg.situ_linear_beta)
        if i < cfg.first_k_dense:
            self.mlp = GatedMLP(d, cfg.dense_intermediate_size, *act)
        else:
            self.block_sparse_moe = MoE(
                d, cfg.num_experts, cfg.top_k, cfg.moe_intermediate_size, cfg.num_shared_experts,
                cfg.routed_scaling_factor, cfg.moe_renormalize, cfg.routed_expert_hidden_size,
                cfg.latent_moe_use_norm, *act, norm_eps=cfg.rms_norm_eps)
        if cfg.attn_res_block_size:
            self.self_attention_res_norm = RMSNorm(d, cfg.attn_res_eps)
            self.self_attention_res_proj = nn.Linear(d, 1, bias=False)
            self.mlp_res_norm = RMSNorm(d, cfg.attn_res_eps)
            self.mlp_res_proj = nn.Linear(d, 1, bias=False)

    def ffn(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x) if hasattr(self, "mlp") else self.block_sparse_moe(x)


class KimiModel(CausalLM):
    """Kimi Linear (`attn_res_block_size=None`) and K3 (AttnRes every `block` layers)."""

    def __init__(self, cfg: KimiConfig):
        super().__init__()
        self.config = cfg
        d = cfg.hidden_size
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(cfg.vocab_size, d)
        self.model.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.model.norm = RMSNorm(d, cfg.rms_norm_eps)
        if cfg.attn_res_block_size:
            self.model.output_attn_res_norm = RMSNorm(d, cfg.attn_res_eps)
            self.model.output_attn_res_proj = nn.Linear(d, 1, bias=False)
        self.lm_head = nn.Linear(d, cfg.vocab_size, bias=False)

    def step(self, input_ids: torch.Tensor, state: State | None,
             seq: Seq | None = None) -> tuple[torch.Tensor, State]:
        h = self.model.embed_tokens(input_ids)
        new_state: State = {}
        block = self.config.attn_res_block_size
        if not block:
            for i, layer in enumerate(self.model.layers):
                a, st = layer.self_attn(layer.input_layernorm(h), sub_state(state, f"layers.{i}."), seq)
                new_state.update(add_prefix(st, f"layers.{i}."))
                h = h + a
                h = h + layer.ffn(layer.post_attention_layernorm(h))
        else:
            # Block AttnRes (K3-SPEC.md section 6): `bank` holds committed block sums,
            # `partial` the running sum of the current block.
            bank: list[torch.Tensor] = []
            partial: torch.Tensor | None = h
            for i, layer in enumerate(self.model.layers):
                x = partial if not bank else attn_res(
                    bank, partial, layer.self_attention_res_norm, layer.self_attention_res_proj)
                if i % block == 0:
                    bank.append(partial)
                    partial = None
                a, st = layer.self_attn(layer.input_layernorm(x), sub_state(state, f"layers.{i}."), seq)
                new_state.update(add_prefix(st, f"layers.{i}."))
                partial = a if partial is None else partial + a
                x = attn_res(bank, partial, layer.mlp_res_norm, layer.mlp_res_proj)
                partial = partial + layer.ffn(layer.post_attention_layernorm(x))
            h = attn_res(bank, partial, self.model.output_attn_res_norm, self.model.output_attn_res_proj)
        return self.logits_of(self.model.norm(h), seq), new_state
