"""Random config.json files (random values, types, nesting; missing, extra and null fields):
reading one either gives a config k3c's models can build or raises a k3c error, within a
second. Parse and validate only: nothing is built."""

from __future__ import annotations

import json
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from k3c.errors import K3cError
from k3c.models.checkpoint import config_from_json, config_to_json
from k3c.models.checkpoint.config_json import KDA_KEYS, KIMI_KEYS, check_memory
from k3c.models.configs import PRESETS, config_problems

BASES = [config_to_json(PRESETS[n]) for n in ("k3-tiny", "kimi-linear-tiny", "gpt2-tiny", "deltanet-tiny")]
KEYS = sorted({k for b in BASES for k in b} | {t for _, t, _ in KIMI_KEYS} | {"text_config", "layer_types",
              "mlp_layer_types", "quantization_config", "k3c_extra", "full_attn_layers", "linear_num_heads"})
INNER = sorted({t for _, t, _ in KDA_KEYS} | {"full_attn_layers", "kda_layers", "gate_lower_bound",
                                              "use_full_rank_gate"})

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**70), st.floats(allow_nan=True),
                    st.sampled_from(["", "9", "silu", "situ", "kimi_linear", "kimi_k3", "gpt2", "deltanet"]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(st.sampled_from(KEYS + INNER), inner, max_size=5)), max_leaves=20)


@st.composite
def configs(draw) -> object:
    if draw(st.integers(0, 9)) == 0:
        return draw(values)  # not even an object, now and then
    d = json.loads(json.dumps(draw(st.sampled_from(BASES))))
    for _ in range(draw(st.integers(0, 4))):
        where = d
        if "linear_attn_config" in d and isinstance(d["linear_attn_config"], dict) and draw(st.booleans()):
            where = d["linear_attn_config"]
        key = draw(st.sampled_from(INNER if where is not d else KEYS))
        action = draw(st.sampled_from(["set", "delete", "null", "wrap"]))
        if action == "delete":
            where.pop(key, None)
        elif action == "null":
            where[key] = None
        elif action == "wrap":
            d = {"model_type": "kimi_k3", "text_config": d}
        else:
            where[key] = draw(values)
    return d


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs())
def test_only_k3c_errors_escape_and_each_within_a_second(d):
    # within a second of this process's CPU time (the work a config makes k3c do); wall time
    # also counts the other test worker on a shared machine, so it only bounds waiting
    t0, cpu = time.perf_counter(), time.process_time()
    try:
        cfg = config_from_json(d)
        check_memory(cfg)
    except K3cError:
        pass
    else:
        assert config_problems(cfg) == []
    assert time.process_time() - cpu < 1.0
    assert time.perf_counter() - t0 < 10.0
