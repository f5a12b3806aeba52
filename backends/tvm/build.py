"""Build: the Relax module through our pipeline into a VM executable (`tvm.compile`), and the
artifact on disk.

The pipeline is TVM's default one for the target with three additions: `LiftTransformParams`
first (weight-only work, such as the transposes of GEMM and expert weights, moves into one
`transform_params` function that the runner calls once at load), `RemoveRedundantReshape`
(a reshape of a reshape, or to the shape it has, is three VM instructions at run time: a
k3-small decode step ran 3,640 of them, 3,212 without these, and took 4.77 ms instead of
5.00), and our schedules after fusion (schedules.py). The artifact of `lower`:

    DIR/lib.so                 the compiled library (functions prefill/decode/forward and
                               transform_params), loadable with tvm.runtime.load_module
    DIR/weights.safetensors    the weights, by IR name, as the graphs hold them
    DIR/manifest.json          target (its name, the compiled target string, the CPU features
                               that chose kernel forms), weight order, and per entry its
                               inputs, outputs and dims
    DIR/kernels.cu             (cuda only) the generated CUDA source, for reading
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
import tvm
from safetensors.torch import save_file
from tvm import relax

from ...ir import Graph
from ...ir import dims as D
from ..contract import id_bounds
from ..signs import decay_inputs
from .lower import lower_module, weight_names
from .schedules import default_schedule
from .target import cpu_features, make_target

FORMAT = "k3c-tvm/1"


@tvm.transform.module_pass(opt_level=0, name="K3cNoAlias")
def noalias_everywhere(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """Mark every PrimFunc of the module `tirx.noalias`, as Relax's own legalized ones are.

    With one function of a module lacking it (VMShapeLower's host `shape_func`, which a module
    gets when its shapes need arithmetic at run time such as the B * T rows of a GEMM, or a
    kernel declared without it) the LLVM code of the module's kernels came out without
    `noalias` on any argument (TVM 0.27): the packed GEMM's accumulators went to memory and
    its tile indices were divided again at every k step, so a user's `nn.Linear(512, 3072)`
    on [1, 1024, 512] ran 5 to 8 times slower than the same module with static shapes.

    It holds for every function here: `call_tir` writes outputs the VM allocates for the call
    (the memory planner never hands a call one of its own live inputs), `call_tir_inplace`
    writes into an input with no separate output argument, and a shape function's only
    buffer is the VM's shape heap."""
    for gv, func in list(mod.functions.items()):
        if isinstance(func, tvm.tirx.PrimFunc) and not (func.attrs is not None and func.attrs.get("tirx.noalias")):
            mod[gv] = func.with_attr("tirx.noalias", True)
    return mod


def pipeline(target: tvm.target.Target, stop_after_schedule: bool = False) -> tvm.transform.Pass:
    """The Relax pipeline: lift weight transforms, legalize, fuse, schedule, lower to the VM."""
    passes = [
        relax.transform.LiftTransformParams(shared_transform=True),
        relax.backend.DispatchSampling(),
        relax.backend.DispatchSortScan(),
        relax.transform.RemoveRedundantReshape(),
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
        default_schedule(target),
    ]
    if not stop_after_schedule:
        passes += [
            relax.transform.RewriteDataflowReshape(),
            relax.transform.ToNonDataflow(),
            relax.transform.RemovePurityChecking(),
            relax.transform.CallTIRRewrite(),
            relax.transform.StaticPlanBlockMemory(),
            relax.transform.LowerAllocTensor(),
            relax.transform.KillAfterLastUse(),
            relax.transform.LowerRuntimeBuiltin(),
            relax.transform.ComputePrimValue(),
            relax.transform.VMShapeLower(),
            relax.transform.AttachGlobalSymbol(),
            noalias_everywhere,
        ]

    @tvm.transform.module_pass(opt_level=0, name="K3cRelaxPipeline")
    def run(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        with target:
            return tvm.transform.Sequential(passes)(mod)

    return run


def scheduled_module(graphs: dict[str, Graph], target: str = "llvm", **options) -> tvm.IRModule:
    """The module as it is compiled: Relax functions plus every TensorIR function scheduled."""
    tgt = make_target(target, options.get("arch"), options.get("mcpu"))
    mod = lower_module(graphs, target, options)
    return pipeline(tgt, stop_after_schedule=True)(mod)


def without_kernel_asserts() -> tvm.transform.PassContext:
    """The current pass context with `tirx.disable_assert`: the kernels' argument checks left out.

    Each TensorIR function's packed wrapper checks every buffer it is handed (type, ndim,
    dtype, device, each dim and stride, the symbolic dims shared between buffers), with an
    error message per check: for k3-tiny's prefill and decode 60% of the library's machine
    code (120,680 instructions with them, 48,634 without), 2 s of the 3.9 s LLVM takes to
    emit it, and 1 s of `tvm.compile`. Their only caller is the Relax VM,
    which hands them the buffers it allocated for shapes it has already matched: the
    functions an artifact exposes (prefill, decode, ...) check their inputs in VM code
    (`vm.builtin.check_tensor_info`, `match_shape`), which this setting does not touch, and the
    runner checks them against the manifest before that. The kernels have no asserts of
    their own."""
    ctx = tvm.transform.PassContext.current()
    return tvm.transform.PassContext(opt_level=ctx.opt_level, required_pass=list(ctx.required_pass),
                                     disabled_pass=list(ctx.disabled_pass),
                                     config={**dict(ctx.config), "tirx.disable_assert": True})


def build(graphs: dict[str, Graph], target: str = "llvm", **options):
    """(executable, seconds): the graphs lowered, scheduled and compiled for `target`."""
    tgt = make_target(target, options.get("arch"), options.get("mcpu"))
    t0 = time.perf_counter()
    mod = lower_module(graphs, target, options)
    with without_kernel_asserts():
        ex = tvm.compile(mod, target=tgt, relax_pipeline=pipeline(tgt))
    return ex, time.perf_counter() - t0


def _type_entry(name: str, t) -> dict:
    return {"name": name, "dtype": t.dtype, "shape": [D.to_str(d) for d in t.shape]}


def manifest(graphs: dict[str, Graph], target: str, options: dict, seconds: float) -> dict:
    tgt = make_target(target, options.get("arch"), options.get("mcpu"))
    return {
        "format": FORMAT,
        "target": target,
        "target_string": str(tgt),  # what the library was compiled for (llvm: -mcpu, features turned off)
        "cpu_features": cpu_features(tgt),  # that chose kernel forms; the loading host needs them all
        "weights": weight_names(graphs),
        "options": {k: v for k, v in options.items() if isinstance(v, (str, int, float, bool))},
        "build_seconds": round(seconds, 2),
        "entries": {
            entry: {
                "dims": {n: [lo, hi] for n, (lo, hi) in g.dims.items()},
                "inputs": [_type_entry(n, g.types[n]) for n in g.inputs],
                "outputs": [_type_entry(name, g.types[v]) for name, v in g.outputs],
                "id_bounds": id_bounds(g),
                "nonpositive": decay_inputs(g),  # log-decays fed as inputs: the kernels assume <= 0
                **({"dynamic": g.meta["dynamic"]} if "dynamic" in g.meta else {}),  # a module's, as captured
            }
            for entry, g in graphs.items()
        },
    }


def export(ex, graphs: dict[str, Graph], out_dir: Path, target: str, options: dict, seconds: float) -> Path:
    """Write lib.so, weights.safetensors and manifest.json into `out_dir` (`ex` None: lib.so,
    and kernels.cu for cuda, are there already, from the build cache)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if ex is not None:
        ex.export_library(str(out_dir / "lib.so"))
    weights: dict[str, torch.Tensor] = {}
    for g in graphs.values():
        for name, t in g.weights.items():
            weights.setdefault(name, t.detach().contiguous().clone())  # tied weights become copies
    save_file(weights, str(out_dir / "weights.safetensors"))
    (out_dir / "manifest.json").write_text(json.dumps(manifest(graphs, target, options, seconds), indent=1))
    if target == "cuda" and ex is not None:
        (out_dir / "kernels.cu").write_text(device_source(ex))
    return out_dir


def device_source(ex) -> str:
    """The generated device (CUDA) source of an executable, "" when it has none."""
    found, todo = [], list(ex.mod.imports)
    while todo:
        m = todo.pop()
        if m.kind == "cuda":
            found.append(m.inspect_source())
        todo.extend(m.imports)
    return "\n".join(found)
