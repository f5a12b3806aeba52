"""Whether onnxruntime's CPU provider reads 2-byte weights faster than 4-byte ones: a chain of
decode-step MatMuls ([1, K] @ [K, N], --layers distinct weights, more bytes than the caches
hold) in float16 and in float32, side by side in one run, on --threads threads.

    python benchmarks/bench_ort_half.py                  # 24 x 2048 x 2048
    python benchmarks/bench_ort_half.py --layers 48 --size 1024

A float16 weight holds every BF16 value between 2^-17 and 65504 exactly, so a BF16 release
could reach onnxruntime's CPU MatMul as float16 without rounding a weight, if the kernel read
it at the bytes' speed. It prints each chain's best time and the weight bytes a second. Not a
test: nothing is asserted.
"""

from __future__ import annotations

import argparse

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from k3c.bench import best_of


def chain(dtype, np_dtype, layers: int, n: int, threads: int, rng) -> tuple[float, int]:
    inits = [numpy_helper.from_array((rng.standard_normal((n, n)) * 0.02).astype(np_dtype), f"w{i}")
             for i in range(layers)]
    nodes = [helper.make_node("MatMul", ["x" if i == 0 else f"y{i - 1}", f"w{i}"], [f"y{i}"]) for i in range(layers)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", dtype, [1, n])],
                              [helper.make_tensor_value_info(f"y{layers - 1}", dtype, [1, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    x = rng.standard_normal((1, n)).astype(np_dtype)
    return best_of(lambda: sess.run(None, {"x": x}), 30, warmup=5), layers * n * n * np.dtype(np_dtype).itemsize


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--size", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"onnxruntime {ort.__version__}, {args.layers} MatMuls [1, {args.size}] @ [{args.size}, {args.size}]")
    print("| weights | MiB | best ms | GB/s of weight bytes |\n|---|---|---|---|")
    for _ in range(args.rounds):
        for name, dtype, np_dtype in (("float16", TensorProto.FLOAT16, np.float16),
                                      ("float32", TensorProto.FLOAT, np.float32)):
            t, nbytes = chain(dtype, np_dtype, args.layers, args.size, args.threads, rng)
            print(f"| {name} | {nbytes / 2**20:.0f} | {1e3 * t:.2f} | {nbytes / t / 1e9:.1f} |", flush=True)


if __name__ == "__main__":
    main()
