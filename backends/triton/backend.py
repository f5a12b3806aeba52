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

from ...ir import Graph, InputError, Node, bind_dims, parse, print_graph
from .codegen import generate_module
from .elementwise import FLOATS
from .lowering import LOWERINGS, REASONS

MODULE_FILE = "model_triton.py"
FORMAT = "k3c-triton-1"
# Recurrent-state ops whose kernels hold a [K, BV] state block in registers.
MAX_HEAD_DIM = 256


class TritonRunner:
    """Runs the entries of a loaded artifact; inputs on the CPU move to the kernels' device."""

    def __init__(self, module, entries: dict[str, Graph], weights: dict[str, torch.Tensor], device: str,
                 missing: str = ""):
        self.module, self.entries, self.weights, self.device = module, entries, weights, device
        self.missing = missing  # why it cannot run: weights without data (a model built on the meta device)

    def run(self, entry: str, *inputs: torch.Tensor) -> list[torch.Tensor]:
        """Outputs in the graph's order, on the device of the inputs (CPU inputs on a GPU
        machine run on the GPU and come back; CUDA inputs stay there, state included)."""
        if entry not in self.entries:
            raise KeyError(f"the Triton artifact has no entry {entry!r}; it has {', '.join(self.entries)}")
        if self.missing:
            raise ValueError(self.missing)
        bind_dims(self.entries[entry], inputs)  # an InputError names an input that does not fit
        home = inputs[0].device if inputs else torch.device(self.device)
        outs = self.module.forward(entry, [x.to(self.device) for x in inputs], self.weights)
        return outs if home.type == torch.device(self.device).type else [o.to(home) for o in outs]


class TritonBackend:
    """`target` None: the kernels compile when they first run (on the GPU, or the interpreter);
    "sm_80", "sm_90", "sm_100": `lower` also compiles every kernel ahead of time for that GPU
    (aot.py; `aot_options`: seq_len, batch, jobs) and keeps the report in `aot_report`."""

    name = "triton"

    def __init__(self, target: str | None = None, **aot_options):
        if target is not None:
            from .aot import target as known_target

            known_target(target)
        self.target, self.aot_options = target, aot_options
        self.aot_report = None

    def is_available(self) -> tuple[bool, str]:
        try:
            from ...kernels.common import triton as _  # noqa: F401  (decides the mode)
        except ImportError as e:
            return False, f"triton is not importable: {e}"
        return True, ""

    def supports(self, node: Node, graph: Graph) -> tuple[bool, str]:
        if node.op not in LOWERINGS:
            return False, REASONS.get(node.op, f"no Triton lowering for op {node.op!r}")
        if node.op in ("kda", "gated_delta_rule", "delta_rule", "linear_attention", "chunk_prepare"):
            K = graph.types[node.inputs[0]].shape[-1]
            V = graph.types[node.inputs[2]].shape[-1]
            if not all(isinstance(d, int) and d <= MAX_HEAD_DIM for d in (K, V)):
                return False, f"head dims K={K}, V={V}: the Triton kernels take static head dims up to {MAX_HEAD_DIM}"
            if any(graph.types[i].dtype not in FLOATS for i in node.inputs):
                return False, "the Triton kernels take floating-point inputs"
        if node.op == "chunk_prepare":
            C = node.attrs.get("chunk_size")
            if not isinstance(C, int) or C < 16 or C & (C - 1):
                return False, f"chunk_size {C}: the Triton chunk kernels need a power of two >= 16"
        return True, ""

    def lower(self, graphs: dict[str, Graph], out_dir: Path, **options) -> Path:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        title = next(iter(graphs.values())).meta.get("model") or next(iter(graphs.values())).name
        (out / MODULE_FILE).write_text(generate_module(graphs, str(title)))
        weights: dict[str, torch.Tensor] = {}
        for entry, g in graphs.items():
            for name, t in g.weights.items():
                if name in weights and not (weights[name].is_meta or torch.equal(weights[name], t)):
                    raise ValueError(f"weight {name!r} differs between entries; the artifact stores one copy")
                weights[name] = t
            (out / f"{entry}.k3c").write_text(print_graph(g))
        real = {k: v.detach().cpu().contiguous() for k, v in weights.items() if not v.is_meta}
        if real:
            from safetensors.torch import save_file

            save_file(real, str(out / "weights.safetensors"))
        manifest = {"format": FORMAT, "module": MODULE_FILE,
                    "entries": {e: {"inputs": g.inputs, "outputs": [k for k, _ in g.outputs], "graph": f"{e}.k3c"}
                                for e, g in graphs.items()}}
        (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        target = options.get("target") or self.target
        if target:
            from .aot import compile_kernels

            aot = {**self.aot_options, **{k: options[k] for k in ("seq_len", "batch", "jobs") if k in options}}
            self.aot_report = compile_kernels(out, target, **aot)
        return out

    def load(self, out_dir: Path, **options) -> TritonRunner:
        out = Path(out_dir)
        manifest_file = out / "manifest.json"
        if not manifest_file.exists():
            raise FileNotFoundError(f"{out} holds no Triton artifact (no manifest.json); run k3c compile first")
        manifest = json.loads(manifest_file.read_text())
        if manifest.get("format") != FORMAT:
            raise ValueError(f"{manifest_file}: format {manifest.get('format')!r}, this k3c reads {FORMAT!r}")
        from ...kernels.common.triton import DEVICE

        entries = {e: parse((out / spec["graph"]).read_text()) for e, spec in manifest["entries"].items()}
        needed = {w for g in entries.values() for w in g.weights}
        wfile = out / "weights.safetensors"
        tensors = {}
        if wfile.exists():
            from safetensors.torch import load_file

            tensors = load_file(str(wfile))
        missing = sorted(needed - set(tensors))
        why = ""
        if missing:  # said when it runs: the artifact (and its AOT kernels) is still the result
            why = (f"{out}: no data for weight(s) {missing[:4]}{' ...' if len(missing) > 4 else ''} "
                   f"(a model built on the meta device compiles, but cannot run)")
        weights = {k: v.to(DEVICE) for k, v in tensors.items()}
        return TritonRunner(_import(out / manifest["module"]), entries, weights, DEVICE, why)


def _import(path: Path):
    """Import the generated module from its file (a unique module name per artifact folder)."""
    name = "k3c_triton_" + "".join(c if c.isalnum() else "_" for c in str(path.resolve().parent))[-80:]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # triton reads kernel sources through the module
    spec.loader.exec_module(module)
    return module


__all__ = ["TritonBackend", "TritonRunner", "InputError"]
