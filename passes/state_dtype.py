"""state-dtype: the dtype the recurrent states are held in between calls, decided once.

`k3c.compile(..., state_dtype="bf16")` halves the bytes of every recurrent state an engine
keeps per sequence: a KDA or delta-rule state `S` [B, H, K, V], linear attention's normaliser
`z` and the short convs' tails `conv_q`, `conv_k`, `conv_v` cross each entry's boundary in
BF16, while the update inside stays in float32. Each such graph input becomes bf16 and is
widened (a `cast`) before anything reads it; each such output is computed as before and
rounded to bf16 (a `cast`, to nearest even) where the graph returns it. So a call rounds the
state once, when it stores it, as vLLM's bf16 SSM state cache does (its Triton kernels, fla's
fused-recurrent form, load the state, widen it to fp32, and round when they store it); the
chunked scan of a prefill or extend keeps its inter-chunk states in float32.

The attention caches do not follow (MLA's latent `ckv` and `krope`, GPT-2's `k` and `v`):
they are KV caches, which engines hold in the model's dtype under a separate option (vLLM's
`kv_cache_dtype`, beside `mamba_cache_dtype` for the recurrent ones), and a cache row is
written once and read at every later step, so rounding it is a decision of its own; positions
are integers. Which state is recurrent is decided by name, the names the models give it
(models/kda_layer.py, models/linear_lm.py): graphs of fixed-capacity caches cannot tell a
cache from a state by shape.

Options: dtype ("bf16", or "f32": the graph as it is). Only float32 and float64 states
narrow; `graph.meta["state_dtype"]` records the choice.
"""

from __future__ import annotations

from ..ir import Graph, Node
from .registry import register_pass

STATE_DTYPES = ("f32", "bf16")  # k3c.compile(..., state_dtype=)
RECURRENT = frozenset({"S", "z", "conv_q", "conv_k", "conv_v"})  # the last part of a state entry's name
_WIDE = frozenset({"f32", "f64"})


def is_recurrent(name: str) -> bool:
    """A state entry (`layers.3.S`, `layers.0.conv_k`) that is a recurrent state, not a cache."""
    return name.rsplit(".", 1)[-1] in RECURRENT


def recurrent_names(graph: Graph) -> list[str]:
    """The recurrent state entries `graph` takes or returns, in its order."""
    names = [v for v in graph.inputs if is_recurrent(v)] + [k for k, _ in graph.outputs if is_recurrent(k)]
    return list(dict.fromkeys(names))


@register_pass("state-dtype", dtype="bf16")
def state_dtype(graph: Graph, dtype: str = "bf16") -> dict:
    """Recurrent-state inputs and outputs in `dtype` at the graph boundary: widened where read,
    rounded where returned; the update between computes as before."""
    if dtype not in STATE_DTYPES:
        raise ValueError(f"state-dtype: dtype must be one of {', '.join(STATE_DTYPES)}, got {dtype!r}")
    if dtype == "f32":
        return {}
    sites = {"state-inputs": 0, "state-outputs": 0}
    widened: list[Node] = []
    for v in graph.inputs:
        t = graph.types[v]
        if not is_recurrent(v) or t.dtype not in _WIDE:
            continue
        wide = graph.fresh(f"{v}.{t.dtype}")
        graph.replace_uses(v, wide)
        graph.types[wide], graph.types[v] = t, t.with_dtype(dtype)
        widened.append(Node("cast", [v], [wide], {"dtype": t.dtype}, {}))
        sites["state-inputs"] += 1
    graph.nodes = widened + graph.nodes
    outputs = []
    for k, v in graph.outputs:
        t = graph.types[v]
        if is_recurrent(k) and t.dtype in _WIDE:
            narrow = graph.fresh(f"{k}.{dtype}")
            graph.types[narrow] = t.with_dtype(dtype)
            graph.nodes.append(Node("cast", [v], [narrow], {"dtype": dtype}, {}))
            v = narrow
            sites["state-outputs"] += 1
        outputs.append((k, v))
    graph.outputs = outputs
    graph.meta["state_dtype"] = dtype
    return {k: n for k, n in sites.items() if n}
