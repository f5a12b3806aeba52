"""The Triton backend object: lowering table checks, the artifact on disk, the runner.

Artifact (DIR):
    model_triton.py         the generated module (codegen.py): kernels + one function per entry
    weights.safetensors     every weight of every entry, by IR name
    {entry}.k3c             each entry's IR (text form, no weight data): names, types, dims
    manifest.json           format, module file, entries with their input and output names
    kernels.json, sm_90/    with a GPU target (TritonBackend(target="sm_90")): every kernel
                            compiled ahead of time, cubins and what they use (aot.py)
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import torch

from ...errors import ArtifactError, UsageError
from ...ir import Graph, InputError, Node, parse, print_graph
from .. import tables as L
from ..artifact import listed, seal, verify
from ..base import legalized
from ..contract import check_inputs
from ..manifest import Fields
from ..signs import decay_inputs
from ..weights import unshared
from .codegen import generate_module

MODULE_FILE = "model_triton.py"
FORMAT = "k3c-triton-1"


class TritonRunner:
    """Runs the entries of a loaded artifact; inputs on the CPU move to the kernels' device."""

    def __init__(self, module, entries: dict[str, Graph], weights: dict[str, torch.Tensor], device: str,
                 missing: str = ""):
        self.module, self.entries, self.weights, self.device = module, entries, weights, device
        self.missing = missing  # why it cannot run: weights without data (a model built on the meta device)
        self._decays: dict[str, list[str]] = {}

    def run(self, entry: str, *inputs: torch.Tensor) -> list[torch.Tensor]:
        """Outputs in the graph's order, on the device of the inputs (CPU inputs on a GPU
        machine run on the GPU and come back; CUDA inputs stay there, state included)."""
        if entry not in self.entries:
            raise UsageError(f"the Triton artifact has no entry {entry!r}; it has {', '.join(self.entries)}")
        if self.missing:
            raise ArtifactError(self.missing)
        g = self.entries[entry]  # an InputError names an input, an id, a dim out of range or a log-decay > 0
        check_inputs(g, inputs, self._decays.setdefault(entry, decay_inputs(g)), "Triton")
        home = inputs[0].device if inputs else torch.device(self.device)
        outs = self.module.forward(entry, [x.to(self.device) for x in inputs], self.weights)
        return outs if home.type == torch.device(self.device).type else [o.to(home) for o in outs]



def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same tensor bit for bit: a weight with a NaN is the same weight in every entry
    (torch.equal says a NaN differs from itself)."""
    if a is b:
        return True
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.detach().contiguous().reshape(-1).view(torch.uint8),
                       b.detach().contiguous().reshape(-1).view(torch.uint8))


class TritonBackend:
    """`compute` None: a BF16 model computes in BF16 (fp32 accumulation and state, as its
    kernels do), "f32": in float32 from its stored weights. `target` None: the kernels
    compile when they first run (on the GPU, or the interpreter); "sm_80", "sm_90", "sm_100":
    `lower` also compiles every kernel ahead of time for that GPU (aot.py, at prefill length
    `seq_len` and `batch`, on `jobs` processes) and keeps the report in `aot_report`. The
    target is decided here once: on sm_100 the module's MXFP4 experts call `tl.dot_scaled`
    (kernels/moe/triton/mxfp4_scaled.py) with BF16 activations, or, with
    `expert_activations="mxfp8"`, activations quantized to MXFP8 for the block-scaled MMA (a
    numerics choice: k3-tiny's logits 0.41 rel RMS from BF16); elsewhere the kernels that
    decode the codes in registers."""

    name = "triton"

    def __init__(self, target: str | None = None, seq_len: int | None = None, batch: int | None = None,
                 jobs: int | None = None, compute: str | None = None, expert_activations: str | None = None):
        if compute not in (None, "f32"):
            raise ValueError(f"triton backend: compute must be None (the model's dtypes) or 'f32', got {compute!r}")
        self.expert_activations = expert_activations_for(expert_activations, target)
        self.compute_dtype = compute  # "f32": a BF16 model computes in float32 (the compute-dtype pass)
        if target is not None:
            from .aot import DEFAULT_SEQ_LEN, check_launch_limits
            from .aot import target as known_target

            known_target(target)
            check_launch_limits(DEFAULT_SEQ_LEN if seq_len is None else seq_len)  # before any capture
        elif seq_len is not None or batch is not None or jobs is not None:
            raise TypeError("triton backend: seq_len, batch and jobs configure the AOT compile; give a target too")
        given = {"seq_len": seq_len, "batch": batch, "jobs": jobs}
        self.target, self.aot_options = target, {k: v for k, v in given.items() if v is not None}
        self.aot_report = None

    def is_available(self) -> tuple[bool, str]:
        try:
            from ...kernels.common import triton as _  # noqa: F401  (decides the mode)
        except ImportError as e:
            return False, f"triton is not importable: {e}"
        return True, ""

    def supports(self, node: Node, graph: Graph) -> tuple[bool, str]:
        low, why = L.find("triton", node, graph)
        return (True, "") if low is not None else (False, why)

    def lower(self, graphs: dict[str, Graph], out_dir: Path) -> Path:
        graphs = legalized(self, graphs)
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        title = next(iter(graphs.values())).meta.get("model") or next(iter(graphs.values())).name
        (out / MODULE_FILE).write_text(generate_module(graphs, str(title), self.target, self.expert_activations))
        weights: dict[str, torch.Tensor] = {}
        for entry, g in graphs.items():
            for name, t in g.weights.items():
                if name in weights and not (weights[name].is_meta or _same_bits(weights[name], t)):
                    raise ValueError(f"weight {name!r} differs between entries; the artifact stores one copy")
                weights[name] = t
            (out / f"{entry}.k3c").write_text(print_graph(g))
        real = {k: v.detach().cpu().contiguous() for k, v in weights.items() if not v.is_meta}
        if real:
            from safetensors.torch import save_file

            save_file(unshared(real), str(out / "weights.safetensors"))  # tied weights as copies
        manifest = {"format": FORMAT, "module": MODULE_FILE,
                    "entries": {e: {"inputs": g.inputs, "outputs": [k for k, _ in g.outputs], "graph": f"{e}.k3c"}
                                for e, g in graphs.items()}}
        if self.target:
            manifest["target"] = self.target
            forms = expert_forms(self.target, graphs, self.expert_activations)
            if forms:  # a numerics choice: said where the artifact is
                manifest["expert_activations"] = ",".join(forms)
        (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        if self.target:  # every kernel compiled for the GPU, inside the artifact before it is sealed
            from .aot import compile_kernels

            self.aot_report = compile_kernels(out, self.target, **self.aot_options)
        seal(out, backend=self.name, model=next(iter(graphs.values())).meta.get("model"))
        return out

    def load(self, out_dir: Path) -> TritonRunner:
        out = Path(out_dir)
        manifest_file = out / "manifest.json"
        if not manifest_file.exists():
            raise ArtifactError(f"{out} holds no Triton artifact (no manifest.json); run k3c compile first")
        manifest = verify(out, self.name)
        f = Fields(manifest_file)
        f.version(manifest, FORMAT)
        if manifest.get("module") != MODULE_FILE:  # the one file of code it imports: k3c's name, listed
            f.fail("module", f"must be {MODULE_FILE!r}")
        module_file = listed(out, manifest, MODULE_FILE, "module")
        from ...kernels.common.triton import DEVICE

        entries = {}
        for e, spec in f.obj(manifest.get("entries"), "entries").items():
            where = f"entries.{f.dim_name(e, 'entries key')}"
            graph = listed(out, manifest, f.obj(spec, where, keys=("graph",))["graph"], f"{where}.graph")
            entries[e] = parse(graph.read_text())
        if not entries:
            f.fail("entries", "lists no entry")
        needed = {w for g in entries.values() for w in g.weights}
        wfile = out / "weights.safetensors"
        tensors = {}
        if wfile.exists():
            from safetensors.torch import load_file

            tensors = load_file(str(listed(out, manifest, wfile.name, "files")))
        missing = sorted(needed - set(tensors))
        why = ""
        if missing:  # said when it runs: the artifact (and its AOT kernels) is still the result
            why = (f"{out}: no data for weight(s) {missing[:4]}{' ...' if len(missing) > 4 else ''} "
                   f"(a model built on the meta device compiles, but cannot run)")
        weights = {k: v.to(DEVICE) for k, v in tensors.items()}
        return TritonRunner(_import(module_file), entries, weights, DEVICE, why)


MXFP4_EXPERT_OPS = frozenset({"moe_gate_up_mxfp4", "moe_down_mxfp4", "moe_experts_mxfp4"})


def expert_activations_for(value: str | None, target: str | None, backend: str = "triton") -> str:
    """The MXFP4 experts' activations into tl.dot_scaled: "bf16" (the default) or "mxfp8", which
    only a target whose MMA takes block-scaled MX operands (sm_100) has a use for."""
    from .aot import TARGETS

    if backend != "triton":
        raise UsageError(f"expert activations are a triton option (the MXFP4 experts on sm_100), not {backend}'s")
    if value in (None, "bf16"):
        return "bf16"
    if value != "mxfp8":
        raise UsageError(f"triton: expert activations {value!r}; known: bf16, mxfp8")
    if target is None or not TARGETS[target].block_scaled:
        raise UsageError(f"triton: expert activations 'mxfp8' feed the block-scaled MMA of sm_100; the target is "
                         f"{target or 'none (give --target sm_100)'}")
    return value


def expert_forms(target: str, graphs: dict[str, Graph], requested: str = "bf16") -> list[str]:
    """How the module's MXFP4 experts take their activations into tl.dot_scaled ("bf16",
    "mxfp8"; none: they decode in registers), as codegen.expert_activations decides per op."""
    from .codegen import expert_activations

    return sorted({f for g in graphs.values() for n in g.nodes if n.op in MXFP4_EXPERT_OPS
                   for f in [expert_activations(g, n, target, requested)] if f})


def _import(path: Path):
    """Import the generated module from its file (a unique module name per artifact folder)."""
    name = "k3c_triton_" + "".join(c if c.isalnum() else "_" for c in str(path.resolve().parent))[-80:]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # triton reads kernel sources through the module
    spec.loader.exec_module(module)
    return module


__all__ = ["TritonBackend", "TritonRunner", "InputError"]
