"""Dataclass configs of the zoo and the named presets `build` knows.

Full-size presets (`gpt2`, `kimi-linear`, `k3`) are the published shapes; tiny ones keep
every feature on at a size that runs in seconds on a CPU; `k3-small` is the benchmark size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from ..kernels.situ.naive import BETA, LINEAR_BETA


@dataclass(frozen=True)
class GPT2Config:
    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    layer_norm_eps: float = 1e-5
    family: str = "gpt2"


@dataclass(frozen=True)
class LinearConfig:
    """A pre-norm decoder whose token mixer is a linear-attention variant, SiLU-GLU MLP."""

    mixer: str = "deltanet"  # linear_attention | deltanet | gated_deltanet
    vocab_size: int = 1024
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    head_k_dim: int = 32
    head_v_dim: int = 32
    conv_size: int = 4  # deltanet and gated_deltanet: short convs on q, k, v
    intermediate_size: int = 256
    rms_norm_eps: float = 1e-5
    family: str = "linear"


@dataclass(frozen=True)
class KimiConfig:
    """Kimi Linear and K3 (K3-SPEC.md section 7). Layer indices in `mla_layers` are 1-based."""

    vocab_size: int = 163840
    hidden_size: int = 7168
    num_layers: int = 93
    mla_layers: tuple[int, ...] = tuple(range(4, 93, 4)) + (93,)
    # KDA
    kda_heads: int = 96
    kda_head_dim: int = 128
    conv_size: int = 4
    kda_gate: str = "sigmoid"  # "softplus" (kimi-linear) | "sigmoid" (k3, lower-bounded)
    gate_lower_bound: float = -5.0
    kda_out_gate_rank: int | None = None  # None: full-rank g_proj; int: g_a_proj/g_b_proj
    # MLA
    mla_heads: int = 96
    q_lora_rank: int | None = 1536
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    mla_output_gate: bool = True
    # MoE
    num_experts: int = 896
    top_k: int = 16
    num_shared_experts: int = 2
    moe_intermediate_size: int = 3072
    routed_scaling_factor: float = 1.0
    moe_renormalize: bool = True
    routed_expert_hidden_size: int | None = 3584  # latent experts; None: experts on d
    latent_moe_use_norm: bool = True
    first_k_dense: int = 1
    dense_intermediate_size: int = 33792
    activation: str = "situ"  # "situ" | "silu"
    situ_beta: float = BETA
    situ_linear_beta: float | None = LINEAR_BETA
    # AttnRes and norms
    attn_res_block_size: int | None = 12
    attn_res_eps: float = 1e-5
    rms_norm_eps: float = 1e-5
    mla_norm_eps: float = 1e-6
    family: str = "kimi"


K3 = KimiConfig()

KIMI_LINEAR = KimiConfig(
    hidden_size=2304, num_layers=27, mla_layers=(4, 8, 12, 16, 20, 24, 27),
    kda_heads=32, kda_head_dim=128, kda_gate="softplus", kda_out_gate_rank=128,
    mla_heads=32, q_lora_rank=None, mla_output_gate=False,
    num_experts=256, top_k=8, num_shared_experts=1, moe_intermediate_size=1024,
    routed_scaling_factor=2.446, routed_expert_hidden_size=None, latent_moe_use_norm=False,
    dense_intermediate_size=9216, activation="silu", attn_res_block_size=None,
)

K3_TINY = KimiConfig(
    vocab_size=1024, hidden_size=256, num_layers=9, mla_layers=(4, 8, 9),
    kda_heads=4, kda_head_dim=32,
    mla_heads=4, q_lora_rank=64, kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16,
    v_head_dim=32, num_experts=8, top_k=2, num_shared_experts=2, moe_intermediate_size=64,
    routed_expert_hidden_size=128, dense_intermediate_size=512, attn_res_block_size=3,
)

K3_SMALL = KimiConfig(
    vocab_size=32768, hidden_size=512, num_layers=13, mla_layers=(4, 8, 12, 13),
    kda_heads=8, kda_head_dim=64,
    mla_heads=8, q_lora_rank=256, kv_lora_rank=128, qk_nope_head_dim=64, qk_rope_head_dim=32,
    v_head_dim=64, num_experts=32, top_k=4, num_shared_experts=2, moe_intermediate_size=256,
    routed_expert_hidden_size=256, dense_intermediate_size=2048, attn_res_block_size=4,
)

KIMI_LINEAR_TINY = replace(
    KIMI_LINEAR, vocab_size=1024, hidden_size=256, num_layers=6, mla_layers=(4, 6),
    kda_heads=4, kda_head_dim=32, kda_out_gate_rank=32, mla_heads=4, kv_lora_rank=32,
    qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, num_experts=8, top_k=2,
    moe_intermediate_size=64, dense_intermediate_size=512,
)

PRESETS: dict[str, object] = {
    "gpt2": GPT2Config(),
    "gpt2-tiny": GPT2Config(vocab_size=1024, n_positions=512, n_embd=128, n_layer=2, n_head=4),
    "linear-attn-tiny": LinearConfig(mixer="linear_attention"),
    "deltanet-tiny": LinearConfig(mixer="deltanet", num_heads=4, head_k_dim=24, head_v_dim=40),
    "gated-deltanet-tiny": LinearConfig(mixer="gated_deltanet", num_heads=2, head_k_dim=48,
                                        head_v_dim=64),
    "kimi-linear": KIMI_LINEAR,
    "kimi-linear-tiny": KIMI_LINEAR_TINY,
    "k3": K3,
    "k3-small": K3_SMALL,
    "k3-tiny": K3_TINY,
}

# Full-size configs: built on the meta device by default (no weights exist here).
FULL_SIZE = frozenset({"gpt2", "kimi-linear", "k3"})


def kimi_model_type(cfg: KimiConfig) -> str:
    """"kimi_k3" for a config with any K3 feature (AttnRes, SiTU, latent experts), else "kimi_linear"."""
    k3 = cfg.attn_res_block_size or cfg.activation == "situ" or cfg.routed_expert_hidden_size
    return "kimi_k3" if k3 else "kimi_linear"


def config_for(name: str, **overrides) -> object:
    """The preset `name` with `overrides` applied (field names of its config class)."""
    if name not in PRESETS:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(PRESETS)}")
    cfg = PRESETS[name]
    known = {f.name for f in fields(cfg)}
    bad = sorted(set(overrides) - known)
    if bad:
        raise TypeError(f"{name}: unknown config field(s) {bad}; fields: {sorted(known)}")
    cfg = replace(cfg, **overrides)
    problems = config_problems(cfg, layer_lists=False)
    if problems:
        from ..errors import UsageError

        field, what = problems[0]
        raise UsageError(f"{name}: {field} {what}")
    return cfg


# --- what k3c's models implement: each field's type and range ---------------------------

MAX_DIM = 2**31 - 1  # a size past int32 indexing is never a real model's
_COUNTS_FROM_ZERO = {"num_shared_experts", "first_k_dense"}
_CHOICES = {"kda_gate": ("softplus", "sigmoid"), "activation": ("silu", "situ"),
            "mixer": ("linear_attention", "deltanet", "gated_deltanet"), "family": ("gpt2", "linear", "kimi")}
_ANY_SIGN = {"gate_lower_bound"}  # a finite float of either sign; every other float is > 0


def kind_problem(value: object, ann: str) -> str | None:
    base = ann.removesuffix(" | None")
    if value is None:
        return None if ann.endswith(" | None") else f"is null, needs {base}"
    if base == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif base == "float":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif base == "bool":
        ok = isinstance(value, bool)
    elif base == "str":
        ok = isinstance(value, str)
    elif base == "tuple[int, ...]":
        ok = isinstance(value, tuple) and all(isinstance(i, int) and not isinstance(i, bool) for i in value)
        base = "a list of integers"
    else:
        return None
    return None if ok else f"= {_short(value)} is not {base}"


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _range_problem(name: str, value: object) -> str | None:
    if value is None or isinstance(value, (bool, tuple)):
        return None
    if isinstance(value, str):
        allowed = _CHOICES.get(name)
        return None if allowed is None or value in allowed else f"= {value!r} is not one of {', '.join(allowed)}"
    if isinstance(value, int) and not isinstance(value, bool) and name not in _ANY_SIGN:
        lo = 0 if name in _COUNTS_FROM_ZERO else 1
        return None if lo <= value <= MAX_DIM else f"= {value} is outside [{lo}, {MAX_DIM}]"
    if not math.isfinite(value):
        return f"= {value} is not a finite number"
    return None if name in _ANY_SIGN or value > 0 else f"= {value} must be > 0"


def config_problems(cfg: object, layer_lists: bool = True) -> list[tuple[str, str]]:
    """(field, what is wrong) for each value of `cfg` that is not of its field's type, outside
    its range, or at odds with another field; [] for a config k3c's models can build.
    `layer_lists` False lets `mla_layers` name layers past `num_layers` (a preset cut short
    by `build(..., num_layers=2)` keeps its list; the model has no such layers)."""
    problems = []
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        what = kind_problem(value, str(f.type)) or _range_problem(f.name, value)
        if what:
            problems.append((f.name, what))
    if problems:
        return problems  # the relations below assume each value is of its kind
    if isinstance(cfg, GPT2Config) and cfg.n_embd % cfg.n_head:
        problems.append(("n_head", f"= {cfg.n_head} does not divide n_embd = {cfg.n_embd}"))
    if isinstance(cfg, KimiConfig):
        if cfg.top_k > cfg.num_experts:
            problems.append(("top_k", f"= {cfg.top_k} exceeds num_experts = {cfg.num_experts}"))
        if cfg.first_k_dense > cfg.num_layers:
            problems.append(("first_k_dense", f"= {cfg.first_k_dense} exceeds num_layers = {cfg.num_layers}"))
        bad = [i for i in cfg.mla_layers if not 1 <= i <= (cfg.num_layers if layer_lists else MAX_DIM)]
        if bad or len(set(cfg.mla_layers)) != len(cfg.mla_layers):
            problems.append(("mla_layers", f"= {list(cfg.mla_layers)[:8]} must be distinct layer numbers in "
                                           f"1..{cfg.num_layers} (1-based)"))
    return problems


def weight_bytes_floor(cfg: object) -> int:
    """A lower bound of the bytes a model of `cfg` holds, from the config alone (its large
    matrices only, at 2 bytes a weight, routed experts at MXFP4's half byte): what a check of
    the memory needs before anything is built."""
    if isinstance(cfg, GPT2Config):
        D = cfg.n_embd
        return 2 * ((cfg.vocab_size + cfg.n_positions) * D + cfg.n_layer * 12 * D * D)
    if isinstance(cfg, LinearConfig):
        D, H = cfg.hidden_size, cfg.num_heads
        mixer = D * H * (2 * cfg.head_k_dim + 2 * cfg.head_v_dim)
        return 2 * (2 * cfg.vocab_size * D + cfg.num_layers * (mixer + 3 * D * cfg.intermediate_size))
    D, L = cfg.hidden_size, cfg.num_layers
    mla, kda = len(cfg.mla_layers), L - len(cfg.mla_layers)
    kda_params = 4 * D * cfg.kda_heads * cfg.kda_head_dim
    mla_params = D * cfg.kv_lora_rank + cfg.mla_heads * cfg.v_head_dim * D
    experts = cfg.num_experts * 3 * (cfg.routed_expert_hidden_size or D) * cfg.moe_intermediate_size
    dense = 3 * D * cfg.dense_intermediate_size
    k, sparse = cfg.first_k_dense, L - cfg.first_k_dense
    return 2 * (2 * cfg.vocab_size * D + kda * kda_params + mla * mla_params + k * dense) + sparse * experts // 2

__all__ = ["GPT2Config", "LinearConfig", "KimiConfig", "PRESETS", "FULL_SIZE", "config_for", "kimi_model_type",
           "config_problems", "weight_bytes_floor", "MAX_DIM"]
