"""What a lowered TVM module does, read back from the module itself (for tests and `k3c show`).

    kernel_calls(mod, "forward")   one record per `call_tir` of the entry, in order:
        {"callee": "packed_linear1", "kernel": "packed_linear", "args": ["lv", "lv2"],
         "params": {"lv2": [192, 512, 16]}}   # the arguments that are the entry's parameters
    missing_noalias(mod)           PrimFuncs without `tirx.noalias`

After `LiftTransformParams` an entry's parameters past its inputs are what `transform_params`
returns at load, so a kernel argument that is a parameter in a shape no stored weight has
(the GEMM's panels [N / 16, K, 16] of a weight [N, K]) was packed once at load, not per call.

`kernel` is the `k3c.kernel` attribute a hand-written kernel carries (kernels/*/tvm), else
None. Run them on `build.scheduled_module(...)` (or on the module through the whole pipeline
for `missing_noalias`): the records are what the schedules and the VM compile, so a test can
say that a user module's `linear` takes the zoo's path without timing anything.
"""

from __future__ import annotations

import tvm
from tvm import relax


def _bindings(func: relax.Function):
    body = func.body
    for block in getattr(body, "blocks", []):
        yield from block.bindings


def kernel_calls(mod: tvm.IRModule, entry: str) -> list[dict]:
    """The `call_tir`s of Relax function `entry`: callee, its k3c kernel, its arguments."""
    call_tir = tvm.ir.Op.get("relax.call_tir")
    func = mod[entry]
    params = {p.name: _shape(p) for p in func.params}
    out = []
    for binding in _bindings(func):
        value = binding.value
        if not isinstance(value, relax.Call) or value.op != call_tir:
            continue
        callee = value.args[0]
        attrs = mod[callee].attrs
        args = [a.name if isinstance(a, relax.Var) else str(a) for a in value.args[1].fields]
        out.append({"callee": callee.name_hint,
                    "kernel": str(attrs["k3c.kernel"]) if attrs is not None and "k3c.kernel" in attrs else None,
                    "args": args, "params": {a: params[a] for a in args if a in params}})
    return out


def _shape(var: relax.Var) -> list:
    shape = getattr(var.ty, "shape", None)
    if shape is None or not hasattr(shape, "values"):
        return []
    return [int(d) if isinstance(d, tvm.tirx.IntImm) else str(d) for d in shape.values]


def missing_noalias(mod: tvm.IRModule) -> list[str]:
    """The PrimFuncs of `mod` that lack `tirx.noalias` (build.noalias_everywhere adds it)."""
    return sorted(gv.name_hint for gv, f in mod.functions.items()
                  if isinstance(f, tvm.tirx.PrimFunc) and not (f.attrs is not None and f.attrs.get("tirx.noalias")))
