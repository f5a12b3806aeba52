"""Caches that onnxruntime writes in place: outputs that may share their input's buffer.

A decode graph's present cache made by `TensorScatter` straight from the past cache, which
nothing else reads, can be bound (IOBinding) to the very buffer the caller passed in:
onnxruntime's TensorScatter then writes only the new rows instead of copying the cache.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def aliases(path: str | Path) -> dict[str, str]:
    """{output name: input name} of the in-place cache writes of the ONNX model at `path`."""
    import onnx

    g = onnx.load(str(path), load_external_data=False).graph
    inputs, outputs = {i.name for i in g.input}, {o.name for o in g.output}
    readers: dict[str, int] = {}
    for n in g.node:
        for i in n.input:
            readers[i] = readers.get(i, 0) + 1
    return {n.output[0]: n.input[0] for n in g.node
            if n.op_type == "TensorScatter" and n.input[0] in inputs and n.output[0] in outputs
            and readers[n.input[0]] == 1}


def ortvalue(a: np.ndarray):
    """An OrtValue sharing `a`'s memory. onnxruntime's numpy bridge knows no bfloat16 (a state
    held in BF16 arrives as an ml_dtypes array): such an array goes in by its bits."""
    import onnxruntime as ort

    if a.dtype.name == "bfloat16":
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(a.view(np.uint16), 16)  # TensorProto.BFLOAT16
    return ort.OrtValue.ortvalue_from_numpy(a)


def as_numpy(v) -> np.ndarray:
    """An OrtValue's data as numpy; a bfloat16 tensor copied out by its bits as an ml_dtypes array."""
    if v.data_type() != "tensor(bfloat16)":
        return v.numpy()
    import ctypes

    import ml_dtypes

    raw = (ctypes.c_char * v.tensor_size_in_bytes()).from_address(v.data_ptr())
    return np.frombuffer(raw, dtype=np.uint16).reshape(v.shape()).copy().view(ml_dtypes.bfloat16)


def run_bound(session, specs_in: list[dict], specs_out: list[dict], arrays: list[np.ndarray],
              alias: dict[str, str]) -> list[np.ndarray]:
    """Run `session` with the aliased outputs bound to their inputs' buffers (CPU): those come
    back as the input arrays themselves, written in place."""
    io = session.io_binding()
    by_name = {}
    for s, a in zip(specs_in, arrays):
        v = ortvalue(a)  # shares a's memory
        io.bind_ortvalue_input(s["name"], v)
        by_name[s["name"]] = (a, v)
    for o in specs_out:
        if o["name"] in alias:
            io.bind_ortvalue_output(o["name"], by_name[alias[o["name"]]][1])
        else:
            io.bind_output(o["name"], "cpu")
    session.run_with_iobinding(io)
    got = io.get_outputs()
    return [by_name[alias[o["name"]]][0] if o["name"] in alias else as_numpy(v) for o, v in zip(specs_out, got)]
