"""Single-op IR graphs and their inputs, shared by the ONNX backend tests.

    case = CASES["kda"](T=70)        # an OpCase: a verified one-node graph and its inputs
    outs = run_ort(case.graph, case.inputs, flavour="portable")
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import sympy
import torch

from k3c.backends.onnx import lower_graph
from k3c.ir import Graph, Node, TensorType, verify
from k3c.ir.ops import OPS

B_, T_, P_ = (sympy.Symbol(n, integer=True, positive=True) for n in ("B", "T", "P"))


def f32(*shape) -> TensorType:
    return TensorType("f32", shape)


@dataclass
class OpCase:
    graph: Graph
    inputs: list[torch.Tensor]


def op_graph(op: str, inputs: list[tuple[str, TensorType]], attrs: dict | None = None,
             weights: dict[str, torch.Tensor] | None = None, order: list[str] | None = None,
             dims=("B", "T")) -> Graph:
    """A verified graph with one `op` node over graph inputs and weights (in `order`)."""
    attrs = dict(attrs or {})
    g = Graph(f"case.{op}", dims={d: (1, None) for d in dims})
    for name, t in inputs:
        g.inputs.append(name)
        g.types[name] = t
    for name, w in (weights or {}).items():
        g.weights[name] = w
        g.types[name] = TensorType.of(w)
    order = order or [n for n, _ in inputs] + list(weights or {})
    spec = OPS[op]
    out_types = spec.infer(*[g.types[n] for n in order], **spec.full_attrs(attrs))
    outs = [f"{op}_out{i}" for i in range(len(out_types))]
    g.types.update(zip(outs, out_types))
    g.nodes.append(Node(op, order, outs, attrs))
    g.outputs = [(o, o) for o in outs]
    return verify(g)


def feeds(graph: Graph, inputs: list[torch.Tensor]) -> dict[str, np.ndarray]:
    return {n: x.numpy() for n, x in zip(graph.inputs, inputs)}


def prepared(graph: Graph, flavour: str = "portable", chunk_size: int | None = None) -> Graph:
    """The graph as k3c.compile hands it to the flavour: chunk_size None keeps a recurrent op
    whole (its Scan body), an int runs chunk-delta-rule first, which keeps the ops the flavour
    takes whole (the ort flavour's LinearAttention)."""
    if chunk_size is None:
        return graph
    from k3c import passes
    from k3c.backends.onnx import OnnxBackend

    steps = passes.for_backend([f"chunk-delta-rule{{chunk_size={chunk_size}}}"], keep=OnnxBackend(flavour).takes_whole)
    return passes.run(graph, steps)


def run_ort(graph: Graph, inputs: list[torch.Tensor], flavour: str = "portable",
            chunk_size: int | None = None) -> list[torch.Tensor]:
    import onnxruntime as ort

    model, _ = lower_graph(prepared(graph, flavour, chunk_size), flavour)
    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [torch.from_numpy(o) for o in sess.run(None, feeds(graph, inputs))]


def run_reference_evaluator(graph: Graph, inputs: list[torch.Tensor],
                            chunk_size: int | None = None) -> list[torch.Tensor]:
    """The same lowering run by onnx's own reference evaluator (portable flavour)."""
    from onnx.reference import ReferenceEvaluator

    model, _ = lower_graph(prepared(graph, "portable", chunk_size))
    return [torch.from_numpy(np.asarray(o)) for o in ReferenceEvaluator(model).run(None, feeds(graph, inputs))]


# ---- the k3c-domain ops on awkward shapes ------------------------------------------------------

H, K, V = 3, 12, 10  # head dims not powers of two


def _rand(gen, *shape, scale=1.0):
    return torch.randn(*shape, generator=gen) * scale


def _delta_inputs(gen, B: int, T: int, g_shape: str | None, g_scale: float = 1.0):
    q = torch.nn.functional.normalize(_rand(gen, B, T, H, K), dim=-1)
    k = torch.nn.functional.normalize(_rand(gen, B, T, H, K), dim=-1)
    v = _rand(gen, B, T, H, V)
    beta = torch.rand(B, T, H, generator=gen)
    g = None
    if g_shape == "channel":
        g = -torch.rand(B, T, H, K, generator=gen) * g_scale
    elif g_shape == "head":
        g = -torch.rand(B, T, H, generator=gen) * g_scale
    return q, k, v, g, beta, _rand(gen, B, H, K, V, scale=0.3)


def recurrent_case(op: str, B: int = 2, T: int = 70, seed: int = 0, static_T: bool = False,
                   g_scale: float = 1.0) -> OpCase:
    gen = torch.Generator().manual_seed(seed)
    Tdim = T if static_T else T_
    qkv = [("q", f32(B_, Tdim, H, K)), ("k", f32(B_, Tdim, H, K)), ("v", f32(B_, Tdim, H, V))]
    if op == "linear_attention":
        q, k, v = (torch.rand(B, T, H, d, generator=gen) + 0.1 for d in (K, K, V))
        S, z = torch.rand(B, H, K, V, generator=gen), torch.rand(B, H, K, generator=gen) + 0.5
        g = op_graph(op, qkv + [("S", f32(B_, H, K, V)), ("z", f32(B_, H, K))], {"scale": 0.3})
        return OpCase(g, [q, k, v, S, z])
    gate = {"kda": "channel", "gated_delta_rule": "head", "delta_rule": None}[op]
    q, k, v, gt, beta, S = _delta_inputs(gen, B, T, gate, g_scale)
    ins = qkv + ([("g", f32(B_, Tdim, H, K) if gate == "channel" else f32(B_, Tdim, H))] if gate else [])
    ins += [("beta", f32(B_, Tdim, H)), ("S", f32(B_, H, K, V))]
    g = op_graph(op, ins, {"scale": K**-0.5})
    return OpCase(g, [q, k, v] + ([gt] if gate else []) + [beta, S])


def short_conv_case(activation: str, B: int = 2, T: int = 9, C: int = 6, W: int = 4, seed: int = 0,
                    decode: bool = False) -> OpCase:
    """decode: the graph's T is the static 1 of a decode step, else symbolic (prefill)."""
    gen = torch.Generator().manual_seed(seed)
    Tdim = 1 if decode else T_
    g = op_graph("short_conv", [("x", f32(B_, Tdim, C)), ("state", f32(B_, C, W - 1))], {"activation": activation},
                 weights={"w": _rand(gen, C, W)}, order=["x", "w", "state"])
    return OpCase(g, [_rand(gen, B, T, C), _rand(gen, B, C, W - 1)])


def chunk_prepare_case(gate: str, B: int = 2, T: int = 40, chunk_size: int = 16, seed: int = 0) -> OpCase:
    gen = torch.Generator().manual_seed(seed)
    q, k, v, g, beta, _ = _delta_inputs(gen, B, T, gate if gate in ("channel", "head") else None)
    ins = [("q", f32(B_, T_, H, K)), ("k", f32(B_, T_, H, K)), ("v", f32(B_, T_, H, V))]
    xs = [q, k, v]
    if gate != "linear":
        ins.append(("beta", f32(B_, T_, H)))
        xs.append(beta)
    if gate in ("channel", "head"):
        ins.append(("g", f32(B_, T_, H, K) if gate == "channel" else f32(B_, T_, H)))
        xs.append(g)
    return OpCase(op_graph("chunk_prepare", ins, {"chunk_size": chunk_size, "gate": gate}), xs)


def chunk_scan_case(B: int = 2, NC: int = 3, C: int = 16, per_channel: bool = True, seed: int = 0) -> OpCase:
    gen = torch.Generator().manual_seed(seed)
    d = K if per_channel else 1
    ins = [("w", f32(B_, H, NC, C, K)), ("u", f32(B_, H, NC, C, V)), ("k_decayed", f32(B_, H, NC, C, K)),
           ("decay_last", f32(B_, H, NC, d)), ("S", f32(B_, H, K, V))]
    xs = [_rand(gen, B, H, NC, C, K, scale=0.2), _rand(gen, B, H, NC, C, V), _rand(gen, B, H, NC, C, K, scale=0.2),
          torch.rand(B, H, NC, d, generator=gen), _rand(gen, B, H, K, V)]
    return OpCase(op_graph("chunk_state_scan", ins, dims=("B",)), xs)


def chunk_output_case(B: int = 2, T: int = 40, C: int = 16, seed: int = 0) -> OpCase:
    gen = torch.Generator().manual_seed(seed)
    NC = sympy.ceiling(T_ / C)
    nc = -(-T // C)
    ins = [("q_decayed", f32(B_, H, NC, C, K)), ("aqk", f32(B_, H, NC, C, C)), ("v_new", f32(B_, H, NC, C, V)),
           ("starts", f32(B_, H, NC, K, V))]
    g = Graph("case.chunk_output", dims={"B": (1, None), "T": (1, None)})
    # T is not a dim of any input here: it enters as the attribute, read from a T-long input
    g.inputs = [n for n, _ in ins] + ["time"]
    g.types.update(dict(ins))
    g.types["time"] = f32(T_)
    out_t = OPS["chunk_output"].infer(*[t for _, t in ins], scale=0.25, T=T_)[0]
    g.types["o"] = out_t
    g.nodes.append(Node("chunk_output", [n for n, _ in ins], ["o"], {"scale": 0.25, "T": T_}))
    g.outputs = [("o", "o")]
    xs = [_rand(gen, B, H, nc, C, K), torch.tril(_rand(gen, B, H, nc, C, C)), _rand(gen, B, H, nc, C, V),
          _rand(gen, B, H, nc, K, V), torch.zeros(T)]
    return OpCase(verify(g), xs)


D_MODEL, I_MLP, E, TOPK = 20, 14, 6, 2


def situ_case(linear_beta: float | None = 25.0, seed: int = 0) -> OpCase:
    gen = torch.Generator().manual_seed(seed)
    g = op_graph("situ", [("gate", f32(B_, T_, I_MLP)), ("up", f32(B_, T_, I_MLP))],
                 {"beta": 4.0, "linear_beta": linear_beta})
    return OpCase(g, [_rand(gen, 2, 5, I_MLP, scale=6.0), _rand(gen, 2, 5, I_MLP, scale=40.0)])


def gated_mlp_case(act: str, linear_beta: float | None = 25.0, seed: int = 0) -> OpCase:
    gen = torch.Generator().manual_seed(seed)
    g = op_graph("gated_mlp", [("x", f32(B_, T_, D_MODEL))], {"act": act, "beta": 4.0, "linear_beta": linear_beta},
                 weights={"w": _rand(gen, 2 * I_MLP, D_MODEL, scale=0.5)})
    return OpCase(g, [_rand(gen, 2, 7, D_MODEL)])


def _routing(gen, N: int, skewed: bool = False):
    from k3c.kernels.moe.naive import route

    logits = _rand(gen, N, E)
    if skewed:  # every token routes to experts 0 and 1
        logits[:, :2] += 20.0
    return route(logits, _rand(gen, E, scale=0.1), TOPK, 2.5)


def moe_case(op: str, N: int, act: str = "situ", seed: int = 0, negative_weights: bool = False,
             skewed: bool = False) -> OpCase:
    """moe_gate_up / moe_down / moe_experts over N tokens: N * k <= E takes the gather form,
    else balanced routing the padded batches and skewed routing the expert Loop."""
    gen = torch.Generator().manual_seed(seed)
    idx, w = _routing(gen, N, skewed)
    if negative_weights:
        w = w * torch.where(torch.rand(w.shape, generator=gen) < 0.5, -1.0, 1.0)
    w13, w2 = _rand(gen, E, 2 * I_MLP, D_MODEL, scale=0.3), _rand(gen, E, D_MODEL, I_MLP, scale=0.3)
    Nd = sympy.Symbol("N", integer=True, positive=True)
    if op == "moe_gate_up":
        g = op_graph(op, [("h", f32(Nd, D_MODEL)), ("idx", TensorType("i64", (Nd, TOPK)))], weights={"w13": w13},
                     order=["h", "w13", "idx"], dims=("N",))
        return OpCase(g, [_rand(gen, N, D_MODEL), idx])
    if op == "moe_down":
        g = op_graph(op, [("a", f32(Nd, TOPK, I_MLP)), ("idx", TensorType("i64", (Nd, TOPK))), ("w", f32(Nd, TOPK))],
                     weights={"w2": w2}, order=["a", "w2", "idx", "w"], dims=("N",))
        return OpCase(g, [_rand(gen, N, TOPK, I_MLP), idx, w])
    g = op_graph(op, [("h", f32(Nd, D_MODEL)), ("idx", TensorType("i64", (Nd, TOPK))), ("w", f32(Nd, TOPK))],
                 {"act": act, "beta": 4.0, "linear_beta": 25.0}, weights={"w13": w13, "w2": w2},
                 order=["h", "w13", "w2", "idx", "w"], dims=("N",))
    return OpCase(g, [_rand(gen, N, D_MODEL), idx, w])


def attention_case(op: str, T: int, S: int | None = None, seed: int = 0) -> OpCase:
    """causal_attention / mla_attention / mla_attention_absorbed with S keys: S = T (prefill),
    else S keys of which the T queries are the last (decode when T = 1)."""
    gen = torch.Generator().manual_seed(seed)
    B, Hh = 2, 3
    Tdim = 1 if T == 1 else T_
    Sdim = Tdim if S is None else P_
    S = T if S is None else S
    dims = ("B",) + (("T",) if T != 1 else ()) + (("P",) if Sdim is P_ else ())
    if op == "causal_attention":
        Dq, Dv = 10, 7
        ins = [("q", f32(B_, Tdim, Hh, Dq)), ("k", f32(B_, Sdim, Hh, Dq)), ("v", f32(B_, Sdim, Hh, Dv))]
        xs = [_rand(gen, B, T, Hh, Dq), _rand(gen, B, S, Hh, Dq), _rand(gen, B, S, Hh, Dv)]
        return OpCase(op_graph(op, ins, {"scale": 0.3}, dims=dims), xs)
    Dn, Dr, Dc, Dv = 6, 4, 9, 5
    ins = [("q", f32(B_, Tdim, Hh, Dn + Dr)), ("ckv", f32(B_, Sdim, Dc)), ("krope", f32(B_, Sdim, Dr))]
    xs = [_rand(gen, B, T, Hh, Dn + Dr), _rand(gen, B, S, Dc), _rand(gen, B, S, Dr)]
    w_kv_b = _rand(gen, Hh * (Dn + Dv), Dc, scale=0.4)
    if op == "mla_attention":
        g = op_graph(op, ins, {"v_head_dim": Dv, "scale": 0.3}, weights={"w_kv_b": w_kv_b}, dims=dims)
        return OpCase(g, xs)
    w = w_kv_b.view(Hh, Dn + Dv, Dc)
    g = op_graph(op, ins, {"scale": 0.3}, weights={"w_uk": w[:, :Dn].contiguous(), "w_uv": w[:, Dn:].contiguous()},
                 dims=dims)
    return OpCase(g, xs)


def attn_res_case(N: int = 3, seed: int = 0) -> OpCase:
    gen = torch.Generator().manual_seed(seed)
    g = op_graph("attn_res_mix", [("V", f32(N, B_, T_, D_MODEL))], {"eps": 1e-5},
                 weights={"w": _rand(gen, D_MODEL), "n": _rand(gen, D_MODEL)})
    return OpCase(g, [_rand(gen, N, 2, 5, D_MODEL, scale=3.0)])
