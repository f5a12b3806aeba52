"""Checkpoints on disk: `config.json` beside safetensors weights (K3-SPEC.md section 8).

    model = from_pretrained("dir")                 # detects the weight layout from the names
    save_pretrained(model, "dir")                  # official layout + config.json

Kimi models (Kimi Linear, K3) read two weight layouts:
  official  the release layout: per-expert `experts.E.{w1,w2,w3}.weight`, separate q/k/v
            depthwise convs `[C, 1, W]`, `A_log` as `[H]` or `(1, 1, H, 1)`.
  hf        HF transformers' `kimi_linear`: packed q|k|v `conv1d`, `forget_gate.{f_a_proj,
            f_b_proj,dt_bias,A_log}`, `mlp.` instead of `block_sparse_moe.`, packed experts
            `experts.gate_up_proj [E, 2I, d]` (gate rows first) and `experts.down_proj`.
`save_pretrained` writes the official layout. GPT-2 and the linear-attention ancestors are
stored in k3c's own names, with a config.json of their dataclass fields and `k3c_family`.

Loading is all-or-nothing: every missing, unexpected or misshaped tensor is collected into
one `CheckpointError` before any weight is read, and the module is filled by one strict
`load_state_dict`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .common import CausalLM
from .configs import GPT2Config, KimiConfig, LinearConfig

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
_SHARD_RE = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")

Tensor = torch.Tensor


class CheckpointError(ValueError):
    """A checkpoint that does not fit the model its config describes; names the keys."""


# --------------------------------------------------------------------------------------
# config.json <-> dataclass configs
# --------------------------------------------------------------------------------------

REQUIRED = object()  # marks a config.json key without a default

# KimiConfig field <-> official config.json key (Kimi Linear release / K3), and the value to
# use when the key is absent. `linear_attn_config` and a few coupled fields are handled below.
KIMI_KEYS: tuple[tuple[str, str, object], ...] = (
    ("vocab_size", "vocab_size", REQUIRED),
    ("hidden_size", "hidden_size", REQUIRED),
    ("num_layers", "num_hidden_layers", REQUIRED),
    ("rms_norm_eps", "rms_norm_eps", REQUIRED),
    ("dense_intermediate_size", "intermediate_size", REQUIRED),
    ("activation", "hidden_act", REQUIRED),
    # MLA
    ("mla_heads", "num_attention_heads", REQUIRED),
    ("q_lora_rank", "q_lora_rank", None),
    ("kv_lora_rank", "kv_lora_rank", REQUIRED),
    ("qk_nope_head_dim", "qk_nope_head_dim", REQUIRED),
    ("qk_rope_head_dim", "qk_rope_head_dim", REQUIRED),
    ("v_head_dim", "v_head_dim", REQUIRED),
    ("mla_output_gate", "mla_use_output_gate", False),
    # MoE
    ("num_experts", "num_experts", REQUIRED),
    ("top_k", "num_experts_per_token", REQUIRED),
    ("num_shared_experts", "num_shared_experts", REQUIRED),
    ("moe_intermediate_size", "moe_intermediate_size", REQUIRED),
    ("routed_scaling_factor", "routed_scaling_factor", REQUIRED),
    ("moe_renormalize", "moe_renormalize", True),
    ("routed_expert_hidden_size", "routed_expert_hidden_size", None),
    ("latent_moe_use_norm", "latent_moe_use_norm", False),
    ("first_k_dense", "first_k_dense_replace", REQUIRED),
    # K3
    ("attn_res_block_size", "attn_res_block_size", None),
    ("situ_beta", "activation_situ_beta", KimiConfig.situ_beta),
    ("situ_linear_beta", "activation_situ_linear_beta", KimiConfig.situ_linear_beta),
)

# KimiConfig field <-> key of the `linear_attn_config` dict (the KDA layers).
KDA_KEYS: tuple[tuple[str, str, object], ...] = (
    ("kda_heads", "num_heads", REQUIRED),
    ("kda_head_dim", "head_dim", REQUIRED),
    ("conv_size", "short_conv_kernel_size", REQUIRED),
)

# Fields the official config cannot say; written under "k3c_extra" only when they differ
# from the defaults the official code hard-wires.
KIMI_EXTRA = ("mla_norm_eps", "attn_res_eps", "kda_out_gate_rank")

# Aliases HF transformers writes or accepts for the same quantity (read only).
_ALIASES = {
    "num_experts": ("num_local_experts", "n_routed_experts"),
    "num_experts_per_token": ("num_experts_per_tok",),
    "num_shared_experts": ("n_shared_experts",),
    "moe_renormalize": ("norm_topk_prob",),
}

# Keys whose value must be what the eager reference implements.
_MUST_BE = {
    "mla_use_nope": (True,),
    "moe_router_activation_func": ("sigmoid",),
    "num_expert_group": (1,),
    "n_group": (1,),
    "moe_layer_freq": (1,),
    "tie_word_embeddings": (False,),
}

KIMI_MODEL_TYPES = ("kimi_linear", "kimi_k3")


def _get(d: dict, key: str, default: object, where: str = "config.json") -> object:
    for k in (key, *_ALIASES.get(key, ())):
        if k in d:
            return d[k]
    if default is REQUIRED:
        raise CheckpointError(f"{where}: missing required field {key!r}")
    return default


def _kimi_model_type(cfg: KimiConfig) -> str:
    k3 = cfg.attn_res_block_size or cfg.activation == "situ" or cfg.routed_expert_hidden_size
    return "kimi_k3" if k3 else "kimi_linear"


def kimi_config_to_json(cfg: KimiConfig) -> dict:
    """The official config.json of a KimiConfig (1-based layer lists)."""
    out: dict = {"model_type": _kimi_model_type(cfg)}
    if out["model_type"] == "kimi_linear":
        out["architectures"] = ["KimiLinearForCausalLM"]
    for ours, theirs, _ in KIMI_KEYS:
        out[theirs] = getattr(cfg, ours)
    mla = sorted(cfg.mla_layers)
    lac = {ours_key: getattr(cfg, ours) for ours, ours_key, _ in KDA_KEYS}
    lac["kda_layers"] = [i for i in range(1, cfg.num_layers + 1) if i not in mla]
    lac["full_attn_layers"] = mla
    lac["use_full_rank_gate"] = cfg.kda_out_gate_rank is None
    if cfg.kda_gate == "sigmoid":
        lac["gate_lower_bound"] = cfg.gate_lower_bound
    out["linear_attn_config"] = lac
    # HF's KimiLinear needs num_key_value_heads == heads; MLA itself has no KV-head count, so
    # the loader ignores the field.
    out.update(num_key_value_heads=cfg.mla_heads, mla_use_nope=True, moe_router_activation_func="sigmoid",
               num_expert_group=1, topk_group=1, moe_layer_freq=1, tie_word_embeddings=False,
               pad_token_id=None, bos_token_id=None, eos_token_id=None)  # no tokenizer here
    extra = {f: getattr(cfg, f) for f in ("mla_norm_eps", "attn_res_eps")
             if getattr(cfg, f) != getattr(KimiConfig, f)}
    if cfg.kda_out_gate_rank not in (None, cfg.kda_head_dim):  # the release ties it to head_dim
        extra["kda_out_gate_rank"] = cfg.kda_out_gate_rank
    if extra:
        out["k3c_extra"] = extra
    return out


def kimi_config_from_json(d: dict) -> KimiConfig:
    """A KimiConfig from an official (or HF transformers) Kimi Linear / K3 config.json."""
    for key, allowed in _MUST_BE.items():
        if key in d and d[key] not in allowed:
            raise CheckpointError(f"config.json: {key}={d[key]!r} is not supported (expected {allowed[0]!r})")
    d = dict(d)
    if "first_k_dense_replace" not in d and "mlp_layer_types" in d:  # written by HF transformers
        kinds = list(d["mlp_layer_types"])
        k = next((i for i, t in enumerate(kinds) if t != "dense"), len(kinds))
        if any(t != "sparse" for t in kinds[k:]):
            raise CheckpointError(f"config.json: mlp_layer_types {kinds} is not 'dense' layers then 'sparse' ones")
        d["first_k_dense_replace"] = k
    kw = {ours: _get(d, theirs, default) for ours, theirs, default in KIMI_KEYS}
    if kw["activation"] not in ("silu", "situ"):
        raise CheckpointError(f"config.json: hidden_act={kw['activation']!r} is not supported ('silu' or 'situ')")
    if kw["activation"] == "situ":  # the SiTU constants change the math: no silent default
        kw["situ_beta"] = _get(d, "activation_situ_beta", REQUIRED)
        kw["situ_linear_beta"] = _get(d, "activation_situ_linear_beta", REQUIRED)
    kw.update(_kda_fields(d, kw["num_layers"]))
    extra = d.get("k3c_extra") or {}
    for f in KIMI_EXTRA:
        if f in extra:
            kw[f] = extra[f]
    return KimiConfig(**kw)


def _kda_fields(d: dict, num_layers: int) -> dict:
    """KDA fields and the MLA layer list from `linear_attn_config` (or HF's flat fields)."""
    lac = d.get("linear_attn_config")
    if lac is None and "layer_types" in d:  # a config written by HF transformers only
        lac = {"num_heads": d.get("linear_num_heads"), "head_dim": d.get("linear_head_dim"),
               "short_conv_kernel_size": d.get("linear_conv_kernel_dim"),
               "full_attn_layers": [i + 1 for i, t in enumerate(d["layer_types"]) if t == "full_attention"]}
    if lac is None:
        raise CheckpointError("config.json: missing required field 'linear_attn_config'")
    kw = {ours: _get(lac, theirs, default, "config.json linear_attn_config") for ours, theirs, default in KDA_KEYS}
    full = lac.get("full_attn_layers", d.get("full_attn_layers"))
    if full is None:
        raise CheckpointError("config.json: missing required field 'linear_attn_config.full_attn_layers'")
    mla = sorted(int(i) for i in full)
    everything = set(range(1, num_layers + 1))
    if not set(mla) <= everything:
        raise CheckpointError(f"config.json: linear_attn_config.full_attn_layers {mla} outside 1..{num_layers} "
                              "(layer numbers are 1-based)")
    if lac.get("kda_layers") is not None:
        kda = {int(i) for i in lac["kda_layers"]}
        if kda & set(mla) or kda | set(mla) != everything:
            raise CheckpointError(f"config.json: linear_attn_config.kda_layers and full_attn_layers do not "
                                  f"partition layers 1..{num_layers}")
    kw["mla_layers"] = tuple(mla)
    lower = lac.get("gate_lower_bound")
    kw["kda_gate"] = "softplus" if lower is None else "sigmoid"
    if lower is not None:
        kw["gate_lower_bound"] = float(lower)
    kw["kda_out_gate_rank"] = None if lac.get("use_full_rank_gate", False) else kw["kda_head_dim"]
    return kw


def config_to_json(cfg: object) -> dict:
    if isinstance(cfg, KimiConfig):
        return kimi_config_to_json(cfg)
    if isinstance(cfg, (GPT2Config, LinearConfig)):
        return {"k3c_family": cfg.family, **asdict(cfg)}
    raise TypeError(f"not a model config: {type(cfg).__name__}")


def config_from_json(d: dict) -> object:
    """The dataclass config a config.json describes (Kimi by `model_type`, others by `k3c_family`)."""
    if isinstance(d.get("text_config"), dict) and "model_type" in d["text_config"]:
        d = d["text_config"]  # a multimodal wrapper: the language model's config is inside
    family = d.get("k3c_family")
    if family in ("gpt2", "linear"):
        cls = GPT2Config if family == "gpt2" else LinearConfig
        kw = {}
        for f in fields(cls):
            if f.name not in d:
                raise CheckpointError(f"config.json: missing required field {f.name!r}")
            kw[f.name] = d[f.name]
        return cls(**kw)
    if d.get("model_type") in KIMI_MODEL_TYPES:
        return kimi_config_from_json(d)
    if "model_type" not in d and family is None:
        raise CheckpointError("config.json: missing required field 'model_type'")
    raise CheckpointError(f"config.json: unsupported model_type={d.get('model_type')!r} / "
                          f"k3c_family={family!r} (known: {', '.join(KIMI_MODEL_TYPES)}, gpt2, linear)")


# --------------------------------------------------------------------------------------
# weight layouts: rules between the module's state dict and the checkpoint's tensors
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Rule:
    """Some module tensors <-> some checkpoint tensors, both ways."""

    model_keys: tuple[str, ...]
    ckpt_keys: tuple[str, ...]
    to_ckpt: Callable[[list[Tensor]], list[Tensor]]
    to_model: Callable[[list[Tensor]], list[Tensor]]


def _same(ts: list[Tensor]) -> list[Tensor]:
    return list(ts)


def _rename(model_key: str, ckpt_key: str) -> Rule:
    return Rule((model_key,), (ckpt_key,), _same, _same)


def _reshape(shape_ckpt: tuple[int, ...], shape_model: tuple[int, ...]):
    return (lambda ts: [ts[0].reshape(shape_ckpt)]), (lambda ts: [ts[0].reshape(shape_model)])


def _experts_w13(prefix: str, w13: Tensor) -> Rule:
    """w13 [E, 2I, D] <-> experts.e.w1.weight [I, D] (rows :I) and experts.e.w3.weight (rows I:)."""
    E, I = w13.shape[0], w13.shape[1] // 2
    keys = tuple(f"{prefix}{e}.w1.weight" for e in range(E)) + tuple(f"{prefix}{e}.w3.weight" for e in range(E))

    def to_ckpt(ts):
        return [*ts[0][:, :I].unbind(0), *ts[0][:, I:].unbind(0)]

    def to_model(ts):
        return [torch.cat([torch.stack(ts[:E]), torch.stack(ts[E:])], dim=1)]

    return Rule((prefix + "w13",), keys, to_ckpt, to_model)


def _experts_w2(prefix: str, w2: Tensor) -> Rule:
    E = w2.shape[0]
    keys = tuple(f"{prefix}{e}.w2.weight" for e in range(E))
    return Rule((prefix + "w2",), keys, lambda ts: list(ts[0].unbind(0)), lambda ts: [torch.stack(ts)])


def _packed_conv(prefix: str, sizes: list[int]) -> Rule:
    """q_conv1d, k_conv1d, v_conv1d [C, 1, W] <-> HF's conv1d [3C, 1, W] (q, k, v in order)."""
    model_keys = tuple(f"{prefix}{x}_conv1d.weight" for x in "qkv")
    return Rule(model_keys, (prefix + "conv1d.weight",), lambda ts: [torch.cat(ts, 0)],
                lambda ts: list(ts[0].split(sizes, 0)))


_FORGET_GATE = ("f_a_proj.weight", "f_b_proj.weight", "dt_bias", "A_log")


def _hf_name(key: str) -> str:
    key = key.replace(".block_sparse_moe.", ".mlp.")
    key = re.sub(r"\.experts\.w13$", ".experts.gate_up_proj", key)
    key = re.sub(r"\.experts\.w2$", ".experts.down_proj", key)
    for leaf in _FORGET_GATE:
        if key.endswith(".self_attn." + leaf):
            key = key[: -len(leaf)] + "forget_gate." + leaf
    return key


def tied_aliases(model: torch.nn.Module) -> dict[str, str]:
    """State-dict names that alias an earlier name's tensor (GPT-2's lm_head): alias -> name."""
    seen: dict[int, str] = {}
    out = {}
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) in seen:
            out[name] = seen[id(t)]
        else:
            seen[id(t)] = name
    return out


def plan(model: torch.nn.Module, layout: str) -> list[Rule]:
    """The rules between `model`'s state dict and a checkpoint in `layout`.

    layout: "official" (Kimi release layout), "hf" (transformers' kimi_linear) or "k3c"
    (the state dict as is, for the models without a published layout).
    """
    sd = model.state_dict()
    tied = tied_aliases(model)
    kimi = isinstance(model.config, KimiConfig)
    if layout not in ("official", "hf", "k3c") or (layout != "k3c" and not kimi):
        raise ValueError(f"no {layout!r} layout for {type(model).__name__}")
    # HF and the Kimi Linear release keep A_log as (1, 1, H, 1); K3 (K3-SPEC.md section 8) as [H]
    a_log_4d = kimi and (layout == "hf" or _kimi_model_type(model.config) == "kimi_linear")
    rules: list[Rule] = []
    done: set[str] = set()
    for name, t in sd.items():
        if name in tied or name in done:
            continue
        if layout == "k3c":
            rules.append(_rename(name, name))
        elif name.endswith(".experts.w13") and layout == "official":
            rules.append(_experts_w13(name[: -len("w13")], t))
        elif name.endswith(".experts.w2") and layout == "official":
            rules.append(_experts_w2(name[: -len("w2")], t))
        elif name.endswith(".self_attn.q_conv1d.weight") and layout == "hf":
            prefix = name[: -len("q_conv1d.weight")]
            sizes = [sd[f"{prefix}{x}_conv1d.weight"].shape[0] for x in "qkv"]
            rule = _packed_conv(prefix, sizes)
            rules.append(Rule(rule.model_keys, tuple(_hf_name(k) for k in rule.ckpt_keys),
                              rule.to_ckpt, rule.to_model))
            done.update(rule.model_keys)
        elif name.endswith(".self_attn.A_log"):
            H = t.shape[0]
            ckpt_shape = (1, 1, H, 1) if a_log_4d else (H,)
            key = _hf_name(name) if layout == "hf" else name
            rules.append(Rule((name,), (key,), *_reshape(ckpt_shape, (H,))))
        else:
            rules.append(_rename(name, _hf_name(name) if layout == "hf" else name))
        done.add(name)
    return rules


_HF_MARKERS = re.compile(r"\.self_attn\.conv1d\.weight$|\.forget_gate\.|\.experts\.(gate_up_proj|down_proj)$")
_OFFICIAL_MARKERS = re.compile(
    r"\.experts\.\d+\.w[123]\.weight$|\.self_attn\.[qkv]_conv1d\.weight$|\.block_sparse_moe\.")


def detect_layout(keys: list[str], config: object) -> str:
    """"official" or "hf" for Kimi checkpoints (from the tensor names), "k3c" for the others."""
    if not isinstance(config, KimiConfig):
        return "k3c"
    hf = [k for k in keys if _HF_MARKERS.search(k)]
    official = [k for k in keys if _OFFICIAL_MARKERS.search(k)]
    if hf and official:
        raise CheckpointError(f"checkpoint mixes the HF layout ({hf[0]}) and the official layout ({official[0]})")
    return "hf" if hf else "official"


def expected_shapes(rules: list[Rule], sd: dict[str, Tensor]) -> dict[str, tuple[int, ...]]:
    """Checkpoint key -> shape, from the module's (possibly meta) tensors."""
    out = {}
    for r in rules:
        for key, t in zip(r.ckpt_keys, r.to_ckpt([sd[k] for k in r.model_keys]), strict=True):
            out[key] = tuple(t.shape)
    return out


def _shape_ok(key: str, expected: tuple[int, ...], actual: tuple[int, ...]) -> bool:
    if expected == actual:
        return True
    if key.endswith("A_log"):  # [H] and (1, 1, H, 1) are both in use
        H = max(expected)
        return actual in ((H,), (1, 1, H, 1))
    return False


def _listing(items: list[str], limit: int = 12) -> str:
    more = f", ... and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def check_shapes(expected: dict[str, tuple[int, ...]], found: dict[str, tuple[int, ...]], layout: str) -> None:
    """Raise one CheckpointError naming every missing, unexpected and misshaped tensor."""
    missing = [f"{k} {list(s)}" for k, s in expected.items() if k not in found]
    unexpected = [f"{k} {list(s)}" for k, s in found.items() if k not in expected]
    misshaped = [f"{k}: expected {list(s)}, got {list(found[k])}" for k, s in expected.items()
                 if k in found and not _shape_ok(k, s, found[k])]
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing tensor(s): {_listing(missing)}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected tensor(s): {_listing(unexpected)}")
    if misshaped:
        problems.append(f"{len(misshaped)} misshaped tensor(s): {_listing(misshaped)}")
    if problems:
        raise CheckpointError(f"checkpoint ({layout} layout) does not fit the config: " + "; ".join(problems))


# --------------------------------------------------------------------------------------
# files
# --------------------------------------------------------------------------------------

def weight_files(path: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it (single file or an index with shards)."""
    single, index = path / WEIGHTS_NAME, path / INDEX_NAME
    if single.is_file():
        files = [single]
    elif index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = [path / f for f in sorted(set(weight_map.values()))]
        for f in files:
            if not f.is_file():
                raise FileNotFoundError(f"{INDEX_NAME} names a shard that does not exist: {f.name}")
    else:
        raise FileNotFoundError(f"no {WEIGHTS_NAME} or {INDEX_NAME} in {path}")
    where: dict[str, Path] = {}
    for f in files:
        with safe_open(f, framework="pt") as fh:
            for k in fh.keys():
                if k in where:
                    raise CheckpointError(f"tensor {k} is stored twice: in {where[k].name} and {f.name}")
                where[k] = f
    if index.is_file() and not single.is_file():
        stray = [k for k, f in weight_map.items() if where.get(k) != path / f]
        if stray:
            raise CheckpointError(f"{INDEX_NAME} lists tensor(s) not in the named shard: {_listing(stray)}")
    return where


# transformers saves kimi_linear by renaming every `.mlp.` back to `.block_sparse_moe.`, the
# dense layers' MLP included: read those as the `mlp` they are.
_DENSE_AS_MOE = re.compile(r"^(.*\.layers\.\d+\.)block_sparse_moe\.((?:gate|up|down)_proj\.weight)$")


def canonical_names(d: dict[str, object]) -> dict[str, object]:
    """The checkpoint's entries under the names the layouts use (see `_DENSE_AS_MOE`)."""
    out: dict[str, object] = {}
    for key, value in d.items():
        name = _DENSE_AS_MOE.sub(r"\1mlp.\2", key)
        if name in out:
            raise CheckpointError(f"tensor {name} is stored twice (also as {key})")
        out[name] = value
    return out


def _file_shapes(where: dict[str, Path]) -> dict[str, tuple[int, ...]]:
    out = {}
    for f in sorted(set(where.values())):
        with safe_open(f, framework="pt") as fh:
            for k in fh.keys():
                out[k] = tuple(fh.get_slice(k).get_shape())
    return out


def _read_tensors(where: dict[str, Path], device: str | torch.device) -> dict[str, Tensor]:
    out = {}
    for f in sorted(set(where.values())):
        with safe_open(f, framework="pt", device=str(device)) as fh:
            for k in fh.keys():
                out[k] = fh.get_tensor(k)
    return out


def _as_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}")
    return value


def _retie(model: torch.nn.Module, tied: dict[str, str]) -> None:
    for alias, name in tied.items():
        owner, _, leaf = alias.rpartition(".")
        src_owner, _, src_leaf = name.rpartition(".")
        setattr(model.get_submodule(owner), leaf, getattr(model.get_submodule(src_owner), src_leaf))


def from_pretrained(path: str | Path, *, dtype: torch.dtype | str | None = None,
                    device: str | torch.device = "cpu") -> CausalLM:
    """The model in directory `path` (config.json + model.safetensors or an index with shards).

    `dtype` None keeps each tensor's stored dtype; otherwise floating tensors are cast.
    Raises CheckpointError (a ValueError) naming every tensor that does not fit the config.
    """
    from . import from_config

    path = Path(path)
    cfg_file = path / CONFIG_NAME
    if not cfg_file.is_file():
        raise FileNotFoundError(f"no {CONFIG_NAME} in {path}")
    cfg = config_from_json(json.loads(cfg_file.read_text()))
    with torch.device("meta"):
        model = from_config(cfg)
    where = weight_files(path)
    layout = detect_layout(list(where), cfg)
    rules = plan(model, layout)
    tied = tied_aliases(model)
    meta_sd = model.state_dict()
    check_shapes(expected_shapes(rules, meta_sd), canonical_names(_file_shapes(where)), layout)

    tensors = canonical_names(_read_tensors(where, device))
    dtype = _as_dtype(dtype)
    state: dict[str, Tensor] = {}
    for r in rules:
        outs = r.to_model([tensors.pop(k) for k in r.ckpt_keys])
        for key, t in zip(r.model_keys, outs, strict=True):
            if dtype is not None and t.is_floating_point():
                t = t.to(dtype)
            # a view into a packed tensor gets its own storage: the module owns what it loads
            state[key] = t.clone() if t._is_view() else t.contiguous()
    for alias, name in tied.items():
        state[alias] = state[name]
    model.load_state_dict(state, strict=True, assign=True)
    _retie(model, tied)
    model.name = path.name
    return model.eval()


def save_pretrained(model: CausalLM, path: str | Path, *, max_shard_bytes: int | None = None) -> None:
    """Write config.json and the weights (official layout for Kimi models, k3c names otherwise).

    With `max_shard_bytes`, tensors are split over `model-0000i-of-0000n.safetensors` files
    (in state-dict order) with a `model.safetensors.index.json`.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = model.config
    layout = "official" if isinstance(cfg, KimiConfig) else "k3c"
    sd = model.state_dict()
    tensors: dict[str, Tensor] = {}
    for r in plan(model, layout):
        for key, t in zip(r.ckpt_keys, r.to_ckpt([sd[k] for k in r.model_keys]), strict=True):
            tensors[key] = t.detach().to("cpu").contiguous().clone()

    for old in path.iterdir():  # stale weights of an earlier save would shadow or confuse these
        if old.name in (WEIGHTS_NAME, INDEX_NAME) or _SHARD_RE.match(old.name):
            old.unlink()
    (path / CONFIG_NAME).write_text(json.dumps(config_to_json(cfg), indent=2) + "\n")
    meta = {"format": "pt"}
    if max_shard_bytes is None:
        save_file(tensors, str(path / WEIGHTS_NAME), metadata=meta)
        return
    shards: list[dict[str, Tensor]] = [{}]
    size = 0
    for key, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = t
        size += nbytes
    weight_map = {}
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(path / name), metadata=meta)
        weight_map.update(dict.fromkeys(shard, name))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")


__all__ = ["from_pretrained", "save_pretrained", "CheckpointError", "config_to_json", "config_from_json",
           "kimi_config_to_json", "kimi_config_from_json", "plan", "detect_layout", "KIMI_KEYS", "KDA_KEYS"]
