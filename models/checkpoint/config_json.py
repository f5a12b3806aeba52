"""config.json <-> the dataclass configs (K3-SPEC.md section 8).

Kimi models use the release field names (`num_hidden_layers`, `linear_attn_config`, ...,
the aliases HF transformers writes are read too). K3 is released as a multimodal wrapper,
`model_type "kimi_k3"` with the language model in `text_config` (and its
`quantization_config` inside `text_config`); `config_from_json` unwraps it and
`release_config_json` writes it. GPT-2 and the linear-attention ancestors are stored as
their dataclass fields with `k3c_family`.
"""

from __future__ import annotations

from dataclasses import asdict, fields

from ...resources import check_fits, gib
from ..configs import (
    GPT2Config,
    KimiConfig,
    LinearConfig,
    config_problems,
    kimi_model_type,
    kind_problem,
    weight_bytes_floor,
)
from .errors import CheckpointError

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


_OPTIONAL = {f.name for f in fields(KimiConfig) if str(f.type).endswith(" | None")}
_KIMI_TYPES = {f.name: str(f.type) for f in fields(KimiConfig)}


def _get(d: dict, key: str, default: object, where: str = "config.json", ours: str = "") -> object:
    """The value of `key` (or an alias); null is unset, as HF writes it: the default, None for
    a field that may be None, else a missing field."""
    for k in (key, *_ALIASES.get(key, ())):
        if d.get(k) is not None:
            return d[k]
    if default is REQUIRED and ours not in _OPTIONAL:
        raise CheckpointError(f"{where}: missing required field {key!r}")
    return None if default is REQUIRED else default


def _typed(value: object, ours: str, name: str) -> object:
    """`value` for KimiConfig field `ours`, refused (naming config.json's `name`) when not of its type."""
    what = kind_problem(value, _KIMI_TYPES[ours])
    if what:
        raise CheckpointError(f"config.json: {name} {what}")
    return value


def _int_list(value: object, name: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise CheckpointError(f"config.json: {name} must be a list of layer numbers (integers), got "
                              f"{_short(value)}")
    return value


def _str_list(value: object, name: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(i, str) for i in value):
        raise CheckpointError(f"config.json: {name} must be a list of strings, got {_short(value)}")
    return value


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def kimi_config_to_json(cfg: KimiConfig) -> dict:
    """The official config.json of a KimiConfig (1-based layer lists)."""
    out: dict = {"model_type": kimi_model_type(cfg)}
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
        if d.get(key) is not None and d[key] not in allowed:
            raise CheckpointError(f"config.json: {key}={_short(d[key])} is not supported (expected {allowed[0]!r})")
    d = dict(d)
    if d.get("first_k_dense_replace") is None and d.get("mlp_layer_types") is not None:  # written by HF transformers
        kinds = _str_list(d["mlp_layer_types"], "mlp_layer_types")
        k = next((i for i, t in enumerate(kinds) if t != "dense"), len(kinds))
        if any(t != "sparse" for t in kinds[k:]):
            raise CheckpointError(f"config.json: mlp_layer_types {kinds[:8]} is not 'dense' layers then 'sparse' ones")
        d["first_k_dense_replace"] = k
    kw = {ours: _typed(_get(d, theirs, default, ours=ours), ours, theirs) for ours, theirs, default in KIMI_KEYS}
    if kw["activation"] not in ("silu", "situ"):
        raise CheckpointError(f"config.json: hidden_act={kw['activation']!r} is not supported ('silu' or 'situ')")
    if kw["activation"] == "situ":  # the SiTU constants change the math: no silent default
        for ours, theirs in (("situ_beta", "activation_situ_beta"),
                             ("situ_linear_beta", "activation_situ_linear_beta")):
            if theirs not in d:
                raise CheckpointError(f"config.json: missing required field {theirs!r}")
            kw[ours] = _typed(_get(d, theirs, REQUIRED, ours=ours), ours, theirs)
    if kw["num_layers"] < 1:
        raise CheckpointError(f"config.json: num_hidden_layers = {kw['num_layers']} must be >= 1")
    kw.update(_kda_fields(d, kw["num_layers"]))
    extra = d.get("k3c_extra") or {}
    if not isinstance(extra, dict):
        raise CheckpointError(f"config.json: k3c_extra must be an object, got {_short(extra)}")
    for f in KIMI_EXTRA:
        if extra.get(f) is not None:
            kw[f] = _typed(extra[f], f, f"k3c_extra.{f}")
    return KimiConfig(**kw)


def _kda_fields(d: dict, num_layers: int) -> dict:
    """KDA fields and the MLA layer list from `linear_attn_config` (or HF's flat fields)."""
    lac = d.get("linear_attn_config")
    if lac is None and d.get("layer_types") is not None:  # a config written by HF transformers only
        kinds = _str_list(d["layer_types"], "layer_types")
        lac = {"num_heads": d.get("linear_num_heads"), "head_dim": d.get("linear_head_dim"),
               "short_conv_kernel_size": d.get("linear_conv_kernel_dim"),
               "full_attn_layers": [i + 1 for i, t in enumerate(kinds) if t == "full_attention"]}
    if lac is None:
        raise CheckpointError("config.json: missing required field 'linear_attn_config'")
    if not isinstance(lac, dict):
        raise CheckpointError(f"config.json: linear_attn_config must be an object, got {_short(lac)}")
    where = "config.json linear_attn_config"
    kw = {ours: _typed(_get(lac, theirs, default, where, ours), ours, f"linear_attn_config.{theirs}")
          for ours, theirs, default in KDA_KEYS}
    full = lac.get("full_attn_layers", d.get("full_attn_layers"))
    if full is None:
        raise CheckpointError("config.json: missing required field 'linear_attn_config.full_attn_layers'")
    mla = sorted(_int_list(full, "linear_attn_config.full_attn_layers"))
    if not all(1 <= i <= num_layers for i in mla) or len(set(mla)) != len(mla):
        raise CheckpointError(f"config.json: linear_attn_config.full_attn_layers {mla[:8]} must be distinct layer "
                              f"numbers in 1..{num_layers} (1-based)")
    if lac.get("kda_layers") is not None:
        kda = set(_int_list(lac["kda_layers"], "linear_attn_config.kda_layers"))
        union = kda | set(mla)  # == {1..num_layers}, without building a set of num_layers numbers
        if kda & set(mla) or len(union) != num_layers or not all(1 <= i <= num_layers for i in union):
            raise CheckpointError(f"config.json: linear_attn_config.kda_layers and full_attn_layers do not "
                                  f"partition layers 1..{num_layers}")
    kw["mla_layers"] = tuple(mla)
    lower = lac.get("gate_lower_bound")
    kw["kda_gate"] = "softplus" if lower is None else "sigmoid"
    if lower is not None:
        kw["gate_lower_bound"] = float(_typed(lower, "gate_lower_bound", "linear_attn_config.gate_lower_bound"))
    full_rank = lac.get("use_full_rank_gate") or False
    if not isinstance(full_rank, bool):
        raise CheckpointError(f"config.json: linear_attn_config.use_full_rank_gate = {_short(full_rank)} is not bool")
    kw["kda_out_gate_rank"] = None if full_rank else kw["kda_head_dim"]
    return kw


def config_to_json(cfg: object) -> dict:
    if isinstance(cfg, KimiConfig):
        return kimi_config_to_json(cfg)
    if isinstance(cfg, (GPT2Config, LinearConfig)):
        return {"k3c_family": cfg.family, **asdict(cfg)}
    raise TypeError(f"not a model config: {type(cfg).__name__}")


def config_from_json(d: dict) -> object:
    """The dataclass config a config.json describes (Kimi by `model_type`, others by `k3c_family`).

    Every field is checked for its type and range, the fields against each other and the
    `quantization_config` for its shape: each misfit is one CheckpointError naming the
    config.json field. Nothing is built, so a full-size config parses here; `check_memory`
    says whether its model fits."""
    if not isinstance(d, dict):
        raise CheckpointError(f"config.json: expected a JSON object, got {type(d).__name__}")
    text = text_config(d)
    cfg = _config_from_json(text)
    problems = config_problems(cfg)
    if problems:
        name, what = problems[0]
        name = _JSON_NAME.get(name, name) if isinstance(cfg, KimiConfig) else name
        raise CheckpointError(f"config.json: {name} {what}")
    _check_quantization_shape(text.get("quantization_config"))
    return cfg


def check_memory(cfg: object) -> None:
    """Refuse, before anything is built, a config whose weights cannot fit the memory available."""
    layers = getattr(cfg, "num_layers", None) or getattr(cfg, "n_layer", 0)
    check_fits(f"config.json: a model of {layers} layers ({gib(weight_bytes_floor(cfg))} of weights)",
               weight_bytes_floor(cfg) + layers * LAYER_OVERHEAD, CheckpointError)


LAYER_OVERHEAD = 64 * 1024  # bytes of Python objects a layer's modules take, even on the meta device


def _check_quantization_shape(q: object) -> None:
    """quantization_config: an object whose config_groups are objects, their weights objects."""
    if q is None:
        return
    if not isinstance(q, dict):
        raise CheckpointError(f"config.json: quantization_config must be an object, got {_short(q)}")
    groups = q.get("config_groups")
    if groups is not None and not isinstance(groups, dict):
        raise CheckpointError(f"config.json: quantization_config.config_groups must be an object, got {_short(groups)}")
    for name, g in (groups or {}).items():
        if g is not None and not isinstance(g, dict):
            raise CheckpointError(f"config.json: quantization_config.config_groups.{name} must be an object, "
                                  f"got {_short(g)}")
        w = (g or {}).get("weights")
        if w is not None and not isinstance(w, dict):
            raise CheckpointError(f"config.json: quantization_config.config_groups.{name}.weights must be an "
                                  f"object, got {_short(w)}")
    for key in ("quant_method", "format"):
        if q.get(key) is not None and not isinstance(q[key], str):
            raise CheckpointError(f"config.json: quantization_config.{key} must be a string, got {_short(q[key])}")


_JSON_NAME = {**{ours: theirs for ours, theirs, _ in KIMI_KEYS},
              **{ours: f"linear_attn_config.{theirs}" for ours, theirs, _ in KDA_KEYS},
              "mla_layers": "linear_attn_config.full_attn_layers"}


def _config_from_json(d: dict) -> object:
    family = d.get("k3c_family")
    if family in ("gpt2", "linear"):
        cls = GPT2Config if family == "gpt2" else LinearConfig
        kw = {}
        for f in fields(cls):
            if d.get(f.name) is None:
                raise CheckpointError(f"config.json: missing required field {f.name!r}")
            kw[f.name] = d[f.name]
        return cls(**kw)
    if d.get("model_type") in KIMI_MODEL_TYPES:
        return kimi_config_from_json(d)
    if "model_type" not in d and family is None:
        raise CheckpointError("config.json: missing required field 'model_type'")
    raise CheckpointError(f"config.json: unsupported model_type={_short(d.get('model_type'))} / "
                          f"k3c_family={_short(family)} (known: {', '.join(KIMI_MODEL_TYPES)}, gpt2, linear)")


def is_wrapped(d: dict) -> bool:
    """A multimodal wrapper (the K3 release): the language model's config is `text_config`."""
    return isinstance(d.get("text_config"), dict) and "model_type" in d["text_config"]


def text_config(d: dict) -> dict:
    return d["text_config"] if is_wrapped(d) else d


def merge_config(base: dict, ours: dict) -> dict:
    """`ours` over the config a model was read from; a field k3c leaves unset (None: the token
    ids, which k3c has no tokenizer for) keeps the value it was read with."""
    return {**base, **{k: v for k, v in ours.items() if v is not None or k not in base}}


def release_config_json(cfg: KimiConfig, *, dtype: str, quantization: dict | None = None,
                        base: dict | None = None) -> dict:
    """The K3 release's config.json for `cfg`: the `kimi_k3` wrapper, the language model in
    `text_config` (model_type `kimi_linear`) with `quantization_config` inside it.

    `base`, the config.json a model was read from, keeps the fields k3c does not interpret
    (token ids, context length, ...); its `vision_config` is dropped with the vision weights.
    """
    base = dict(base or {})
    base_text = dict(text_config(base)) if base else {}
    base.pop("vision_config", None)
    base.pop("text_config", None)
    text = {**merge_config(base_text, kimi_config_to_json(cfg)), "model_type": "kimi_linear"}
    text.pop("quantization_config", None)
    if quantization is not None:
        text["quantization_config"] = quantization
    out = {"architectures": ["KimiK3ForConditionalGeneration"], **base, "model_type": "kimi_k3",
           "dtype": dtype, "text_config": text}
    return out
