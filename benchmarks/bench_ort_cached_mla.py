"""onnxruntime's forms of one decode step's absorbed MLA over a fixed-capacity latent cache,
side by side in one process: which of its CPU kernels can run it, and how fast.

    python benchmarks/bench_ort_cached_mla.py                    # k3-small's layer: H = 8, Dc = 128, Dr = 32
    python benchmarks/bench_ort_cached_mla.py --capacity 1088 --repeat 20

The cache holds P = N - 64 valid rows (`--valid P`; the rest zero), one query token, B = 1. Forms:
- decomposition: what k3c's ort flavour runs (ir/ops/cache.py `_absorbed_decompose`): the scores
  as cache @ queries (two MLAS GEMMs, ckv and krope), the mask over N, Softmax, weights @ ckv;
- Attention-23: standard Attention, one KV head of [ckv | krope] (a Concat: a copy of the
  cache each step), a boolean mask;
- Attention-24: the same with `nonpad_kv_seqlen` = P + 1 instead of the mask;
- GroupQueryAttention: com.microsoft, past and present sharing one [B, 1, N, Dc + Dr] buffer,
  `seqlens_k` = P (it writes the new row itself); V = K, the output's first Dc columns.
Each form's output is checked against numpy (max abs error printed); the fastest of --repeat.
"""

from __future__ import annotations

import argparse

import numpy as np
import onnxruntime as ort
from onnx import TensorProto as TP
from onnx import helper as oh

from k3c.bench import best_of

F32, I64, I32 = TP.FLOAT, TP.INT64, TP.INT32


def info(name, shape, t=F32):
    return oh.make_tensor_value_info(name, t, shape)


def session(nodes, inputs, outputs, inits=(), opset=24, threads=0):
    g = oh.make_graph(nodes, "step", inputs, outputs, initializer=list(inits))
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", opset), oh.make_opsetid("com.microsoft", 1)], ir_version=11)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


def const(name, values, t=I64):
    return oh.make_tensor(name, t, [len(values)] if isinstance(values, list) else [], values)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capacity", type=int, default=65600)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--latent", type=int, default=128)
    ap.add_argument("--rope", type=int, default=32)
    ap.add_argument("--valid", type=int, help="rows the sequence holds, P (default N - 64)")
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    N, H, Dc, Dr = args.capacity, args.heads, args.latent, args.rope
    Dk, P, scale = Dc + Dr, N - 64 if args.valid is None else args.valid, 0.1
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, H, 1, Dk), dtype=np.float32)
    ckv = rng.standard_normal((1, N, Dc), dtype=np.float32)
    kr = rng.standard_normal((1, N, Dr), dtype=np.float32)
    ckv[:, P + 1:], kr[:, P + 1:] = 0, 0
    keys = np.concatenate([ckv, kr], -1)[0, :P + 1]
    s = q[0, :, 0] @ keys.T * scale
    p = np.exp(s - s.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ ckv[0, :P + 1]  # [H, Dc]
    qkv = [info("q", [1, H, 1, Dk]), info("ckv", [1, N, Dc]), info("kr", [1, N, Dr])]
    feed = {"q": q, "ckv": ckv, "kr": kr}
    forms = {}

    nodes = [oh.make_node("Split", ["q", "sp"], ["ql", "qr"], axis=3),
             oh.make_node("Reshape", ["ql", "sl"], ["ql3"]), oh.make_node("Reshape", ["qr", "sr"], ["qr3"]),
             oh.make_node("Transpose", ["ql3"], ["qlt"], perm=[0, 2, 1]),
             oh.make_node("Transpose", ["qr3"], ["qrt"], perm=[0, 2, 1]),
             oh.make_node("MatMul", ["ckv", "qlt"], ["s1"]), oh.make_node("MatMul", ["kr", "qrt"], ["s2"]),
             oh.make_node("Add", ["s1", "s2"], ["snt"]), oh.make_node("Transpose", ["snt"], ["sc"], perm=[0, 2, 1]),
             oh.make_node("Mul", ["sc", "scale"], ["ss"]), oh.make_node("Where", ["mask3", "ss", "ninf"], ["sm"]),
             oh.make_node("Softmax", ["sm"], ["pr"], axis=-1), oh.make_node("MatMul", ["pr", "ckv"], ["o"])]
    inits = [const("sp", [Dc, Dr]), const("sl", [1, H, Dc]), const("sr", [1, H, Dr]),
             const("scale", scale, F32), const("ninf", float("-inf"), F32)]
    mask = np.arange(N) <= P
    forms["decomposition (k3c ort)"] = (
        session(nodes, qkv + [info("mask3", [1, 1, N], TP.BOOL)], [info("o", None)], inits),
        {**feed, "mask3": mask[None, None]}, lambda o: o[0])

    attn_in = [oh.make_node("Concat", ["ckv", "kr"], ["k3"], axis=2), oh.make_node("Unsqueeze", ["k3", "ax"], ["k4"]),
               oh.make_node("Unsqueeze", ["ckv", "ax"], ["v4"])]
    forms["Attention-23, bool mask"] = (
        session(attn_in + [oh.make_node("Attention", ["q", "k4", "v4", "mask4"], ["o"], scale=scale)],
                qkv + [info("mask4", [1, 1, 1, N], TP.BOOL)], [info("o", None)], [const("ax", [1])], opset=23),
        {**feed, "mask4": mask[None, None, None]}, lambda o: o[0, :, 0])
    forms["Attention-24, nonpad_kv_seqlen"] = (
        session(attn_in + [oh.make_node("Attention", ["q", "k4", "v4", "", "", "", "len"], ["o"], scale=scale)],
                qkv + [info("len", [1], I64)], [info("o", None)], [const("ax", [1])]),
        {**feed, "len": np.array([P + 1], np.int64)}, lambda o: o[0, :, 0])

    gqa = oh.make_node("GroupQueryAttention", ["q3", "k", "k", "past", "past", "seqlens", "total"], ["o", "pk", "pv"],
                       domain="com.microsoft", num_heads=H, kv_num_heads=1, scale=scale)
    sess = session([gqa], [info("q3", [1, 1, H * Dk]), info("k", [1, 1, Dk]), info("past", [1, 1, N, Dk]),
                           info("seqlens", [1], I32), info("total", [], I32)],
                   [info("o", None), info("pk", None), info("pv", None)])
    buf = ort.OrtValue.ortvalue_from_numpy(np.concatenate([ckv, kr], -1)[:, None].copy())
    io = sess.io_binding()
    for name, v in {"q3": q.reshape(1, 1, H * Dk), "k": keys[None, P:P + 1], "seqlens": np.array([P], np.int32),
                    "total": np.array(N, np.int32)}.items():
        io.bind_cpu_input(name, v)
    io.bind_ortvalue_input("past", buf)
    io.bind_ortvalue_output("pk", buf)
    io.bind_ortvalue_output("pv", buf)
    io.bind_output("o")

    print(f"N = {N}, P = {P}, H = {H}, Dc = {Dc}, Dr = {Dr}, onnxruntime {ort.__version__}")
    for name, (s_, f, get) in forms.items():
        err = np.abs(get(s_.run(None, f)[0]) - want).max()
        ms = 1e3 * best_of(lambda s_=s_, f=f: s_.run(None, f), args.repeat, warmup=1)
        print(f"{name:34s} {ms:8.2f} ms   max err {err:.1e}", flush=True)
    sess.run_with_iobinding(io)
    out = next(x for x in io.copy_outputs_to_cpu() if x.size == H * Dk).reshape(H, Dk)[:, :Dc]
    ms = 1e3 * best_of(lambda: sess.run_with_iobinding(io), args.repeat, warmup=1)
    print(f"{'GroupQueryAttention, shared buffer':34s} {ms:8.2f} ms   max err {np.abs(out - want).max():.1e}")



if __name__ == "__main__":
    main()
