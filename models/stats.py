"""Size, compute and memory of a model of the zoo, from its shapes alone (`k3c stats`).

    stats = model_stats("k3", seq_len=4096)      # full-size configs build on the meta device
    print(format_stats(stats))

Parameters are counted on the module (tied weights once). Per token:
  active params  every parameter except the routed experts, plus top_k / num_experts of
                 them; embedding and lm_head are included (also reported without them).
  FLOPs          2 x the active matmul parameters (lm_head included, the embedding lookup
                 not), plus what grows with the context T, averaged over a prefill of
                 length T (position t attends to t keys, mean (T + 1) / 2):
                   MLA (expanded form)   2 H (Dqk + Dv) t     scores and values
                   GPT-2 attention       4 d t
                 plus the recurrences, per layer and token (the recurrent definition):
                   KDA / gated delta     7 H K V   decay, read k^T S, write, read q^T S
                   delta rule            6 H K V
                   linear attention      4 H K V + 4 H K
                 and the small rest: short convs 2 C W, AttnRes mixes ~7 n d for n candidates.
  decode state   per sequence after T tokens: recurrent S in fp32; conv tails, the MLA
                 latent cache ((kv_lora + rope) x T) and GPT-2's KV cache in `dtype`.
  bytes          the weights as released (`weight_bytes`): for a name, the model built on the
                 meta device in its family's release precision (K3: BF16 + F32 + MXFP4
                 experts), on disk and read per token; for a module, as it holds them.
"""

from __future__ import annotations

import functools

import torch
import torch.nn as nn

from .common import CausalLM
from .configs import GPT2Config, KimiConfig, LinearConfig
from .moe_layer import MoE, MXFP4Experts

GPT2_SMALL = "gpt2"


def _build_meta(name: str, **precision) -> CausalLM:
    from . import build

    return build(name, device="meta", **precision)


def _build_released(name: str) -> tuple[CausalLM, dict]:
    """The model `name` on the meta device in its family's release precision, and its bytes."""
    from .configs import config_for
    from .precision import release_precision
    from .weight_bytes import weight_bytes

    precision = release_precision(config_for(name))
    model = _build_meta(name, **precision)
    out = weight_bytes(model)
    out["precision"] = {"dtype": str(precision["dtype"]).removeprefix("torch."), "experts": precision["experts"]}
    return model, out


@functools.lru_cache(maxsize=1)
def gpt2_small_params() -> int:
    """Parameters of GPT-2 small (124M), counted on the zoo's `gpt2` (lm_head tied)."""
    return sum(p.numel() for p in _build_meta(GPT2_SMALL).parameters())


def _param_counts(model: nn.Module) -> dict[str, int]:
    # MXFP4 experts hold codes and scales: count the weights they stand for
    total = sum(p.numel() for n, p in model.named_parameters() if not n.endswith(("_packed", "_scale")))
    total += sum(mod.experts.num_weights() for mod in model.modules()
                 if isinstance(mod, MoE) and isinstance(mod.experts, MXFP4Experts))
    emb_params = [p for mod in model.modules() if isinstance(mod, nn.Embedding) for p in mod.parameters()]
    embedding = sum(p.numel() for p in emb_params)
    head = model.lm_head.weight
    tied = any(head is p for p in emb_params)
    routed = routed_active = 0
    for mod in model.modules():
        if isinstance(mod, MoE):
            n = mod.experts.num_weights()
            E = mod.gate.weight.shape[0]
            routed += n
            routed_active += n * mod.top_k // E
    active = total - routed + routed_active
    lm_head = 0 if tied else head.numel()
    return {"total": total, "embedding": embedding, "lm_head": lm_head, "lm_head_tied": tied,
            "routed_experts": routed, "routed_experts_active": routed_active, "active": active,
            "active_non_embedding": active - embedding - lm_head}


def _matmul_params(model: nn.Module) -> int:
    """Weights that multiply every token's activations (per token): Linear layers (lm_head
    even when tied), routers, and the active share of the routed experts."""
    n = 0
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear) and not name.endswith("res_proj"):  # AttnRes: a dot, counted below
            n += mod.weight.numel()
        elif isinstance(mod, MoE):
            E = mod.gate.weight.shape[0]
            n += mod.gate.weight.numel()
            n += mod.experts.num_weights() * mod.top_k // E
    return n


def attn_res_candidates(num_layers: int, block: int) -> list[int]:
    """How many candidates each AttnRes mix sees, in order (K3-SPEC.md section 6)."""
    sizes, bank = [], 0
    for i in range(num_layers):
        if bank:
            sizes.append(bank + 1)
        if i % block == 0:
            bank += 1
        sizes.append(bank + 1)
    sizes.append(bank + 1)
    return sizes


def _kimi_rest(cfg: KimiConfig, T: int, nbytes: int) -> tuple[dict, dict, dict]:
    n_mla = sum(1 for i in range(1, cfg.num_layers + 1) if i in cfg.mla_layers)
    n_kda = cfg.num_layers - n_mla
    H, K, W = cfg.kda_heads, cfg.kda_head_dim, cfg.conv_size
    dqk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    flops = {
        "attention": n_mla * cfg.mla_heads * (dqk + cfg.v_head_dim) * (T + 1),
        "recurrent": n_kda * 7 * H * K * K,
        "other": n_kda * 3 * 2 * H * K * W,
    }
    if cfg.attn_res_block_size:
        flops["other"] += sum(7 * n * cfg.hidden_size for n in attn_res_candidates(cfg.num_layers,
                                                                                    cfg.attn_res_block_size))
    state = {
        "kda_S": n_kda * H * K * K * 4,
        "kda_conv": n_kda * 3 * H * K * (W - 1) * nbytes,
        "mla_latent_cache": n_mla * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * T * nbytes,
    }
    moe = f"MoE {cfg.num_experts} experts top-{cfg.top_k} + {cfg.num_shared_experts} shared"
    if cfg.routed_expert_hidden_size:
        moe += f", latent {cfg.routed_expert_hidden_size}"
    layers = {"total": cfg.num_layers, "kda": n_kda, "mla": n_mla,
              "summary": f"{cfg.num_layers} layers: {n_kda} KDA + {n_mla} MLA; {moe}"
                         + (f"; AttnRes block {cfg.attn_res_block_size}" if cfg.attn_res_block_size else "")}
    return flops, state, layers


def _linear_rest(cfg: LinearConfig, T: int, nbytes: int) -> tuple[dict, dict, dict]:
    L, H, K, V, W = cfg.num_layers, cfg.num_heads, cfg.head_k_dim, cfg.head_v_dim, cfg.conv_size
    per_layer = {"linear_attention": 4 * H * K * V + 4 * H * K, "deltanet": 6 * H * K * V,
                 "gated_deltanet": 7 * H * K * V}[cfg.mixer]
    conv = cfg.mixer != "linear_attention"
    flops = {"attention": 0, "recurrent": L * per_layer, "other": L * 2 * H * (2 * K + V) * W if conv else 0}
    state = {"recurrent_S": L * H * K * V * 4 + (L * H * K * 4 if not conv else 0),
             "conv": L * H * (2 * K + V) * (W - 1) * nbytes if conv else 0}
    return flops, state, {"total": L, "summary": f"{L} layers of {cfg.mixer}"}


def _gpt2_rest(cfg: GPT2Config, T: int, nbytes: int) -> tuple[dict, dict, dict]:
    flops = {"attention": cfg.n_layer * 2 * cfg.n_embd * (T + 1), "recurrent": 0, "other": 0}
    state = {"kv_cache": 2 * cfg.n_layer * cfg.n_embd * T * nbytes}
    return flops, state, {"total": cfg.n_layer, "summary": f"{cfg.n_layer} layers of softmax attention"}


def model_stats(name_or_model: str | nn.Module, seq_len: int = 4096, *,
                dtype: torch.dtype = torch.bfloat16) -> dict:
    """Parameters, FLOPs per token at context `seq_len` and decode-state bytes per sequence.

    Nothing runs: the module is built on the meta device (for a name) and read for shapes.
    `dtype` is the element type of caches and conv tails; recurrent states are fp32.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    from .weight_bytes import weight_bytes

    if isinstance(name_or_model, str):
        (model, weights), name = _build_released(name_or_model), name_or_model
    else:
        model, name = name_or_model, getattr(name_or_model, "name", type(name_or_model).__name__)
        weights = weight_bytes(model)
    cfg = model.config
    nbytes = torch.empty((), dtype=dtype).element_size()
    if isinstance(cfg, KimiConfig):
        flops, state, layers = _kimi_rest(cfg, seq_len, nbytes)
    elif isinstance(cfg, LinearConfig):
        flops, state, layers = _linear_rest(cfg, seq_len, nbytes)
    elif isinstance(cfg, GPT2Config):
        flops, state, layers = _gpt2_rest(cfg, seq_len, nbytes)
    else:
        raise TypeError(f"no stats for config {type(cfg).__name__}")
    params = _param_counts(model)
    flops = {"matmul": 2 * _matmul_params(model), **flops}
    flops["total"] = sum(flops.values())
    state["total"] = sum(state.values())
    gpt2 = gpt2_small_params()
    return {
        "model": name,
        "family": cfg.family,
        "layers": layers,
        "seq_len": seq_len,
        "dtype": str(dtype).removeprefix("torch."),
        "params": params,
        "flops_per_token": flops,
        "state_bytes": state,
        "bytes": weights,
        "gpt2_small_params": gpt2,
        "gpt2_ratio": params["total"] / gpt2,
        "gpt2_small_kv_cache_bytes": 2 * 12 * 768 * seq_len * nbytes,
    }


def _si(x: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def _bytes(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


_STATE_LABELS = {
    "kda_S": "KDA state S (fp32)",
    "kda_conv": "KDA conv tails",
    "mla_latent_cache": "MLA latent cache",
    "recurrent_S": "recurrent state (fp32)",
    "conv": "conv tails",
    "kv_cache": "KV cache",
}

_FLOP_LABELS = {
    "matmul": "matmuls (2 x active matmul params)",
    "attention": "attention scores + values",
    "recurrent": "recurrence (definition)",
    "other": "short convs, AttnRes",
}


def format_stats(stats: dict) -> str:
    """A readable table of `model_stats`."""
    p, f, s = stats["params"], stats["flops_per_token"], stats["state_bytes"]
    T = stats["seq_len"]
    head = "tied to the embedding" if p["lm_head_tied"] else "untied"
    rows: list[tuple[str, str, str]] = []

    def row(label: str, value: str, note: str = "") -> None:
        rows.append((label, value, note))

    rows.append(("parameters", "", ""))
    row("  total", _si(p["total"]), f"{p['total']:,}")
    row("  embedding + lm_head", _si(p["embedding"] + p["lm_head"]), f"lm_head {head}")
    if p["routed_experts"]:
        row("  routed experts", _si(p["routed_experts"]), f"{_si(p['routed_experts_active'])} active per token")
    row("  active per token", _si(p["active"]), "embedding and lm_head included")
    row("  active, no embedding/lm_head", _si(p["active_non_embedding"]), "")
    ratio = stats["gpt2_ratio"]
    row("  vs GPT-2 small", f"{ratio:,.0f}x" if ratio >= 10 else f"{ratio:.3g}x",
        f"GPT-2 small = {stats['gpt2_small_params']:,} params")
    b = stats["bytes"]
    how = b.get("precision")
    rows.append(("weight bytes" + (" as released" if how else ""), "",
                 f"{how['dtype']}" + (f", {how['experts']} routed experts" if how["experts"] else "") if how else ""))
    row("  total", _bytes(b["total"]), f"{b['total']:,} B")
    for kind, n in b["by_dtype"].items():
        row(f"  {kind}", _bytes(n), f"{n:,} B")
    row("  read per token", _bytes(b["active_per_token"]), "routed experts top-k, one embedding row")
    rows.append((f"FLOPs per token at T = {T:,}", "", "average over a prefill of length T"))
    for key, label in _FLOP_LABELS.items():
        if f.get(key):
            row("  " + label, _si(f[key]), "")
    row("  total", _si(f["total"]), f"{f['total']:.4g}")
    rows.append((f"decode state per sequence at T = {T:,}", "", f"caches in {stats['dtype']}"))
    for key, label in _STATE_LABELS.items():
        if key in s and s[key]:
            row("  " + label, _bytes(s[key]), f"{s[key]:,} B")
    row("  total", _bytes(s["total"]), f"{s['total']:,} B")
    row("  GPT-2 small KV cache, same T", _bytes(stats["gpt2_small_kv_cache_bytes"]), "for reference")

    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    lines = [f"{stats['model']} ({stats['family']}): {stats['layers']['summary']}"]
    for label, value, note in rows:
        line = f"{label:<{w0}}  {value:>{w1}}" + (f"  {note}" if note else "")
        lines.append(line.rstrip())
    return "\n".join(lines)


__all__ = ["model_stats", "format_stats", "gpt2_small_params", "attn_res_candidates"]
