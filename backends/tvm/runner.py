"""Run a TVM artifact in the Relax VM, from its directory alone (no IR needed).

    runner = TvmRunner("DIR")                   # lib.so + weights.safetensors + manifest.json
    outputs = runner.run("prefill", input_ids)  # torch tensors, in the manifest's order

Inputs are checked against the manifest first (count, dtype, rank, dims consistent across
inputs; ids, positions and lengths against what the entry indexes, backends/contract.py), so a
misfit is one line naming the input rather than an error, or a write past a cache, inside the
VM. The manifest is data: every field is checked when the runner starts (a ManifestError names
the field), and its dims are parsed by k3c's bounded parser. The device and the VM come up on
the first run, so a `cuda` artifact can be built and loaded on a machine without a GPU;
running it there says so. On a CPU the parameters that the load's transform makes are copied
into one mapping on transparent huge pages (arena.py), which a decode step reads faster.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import sympy
import torch
import tvm
from safetensors.torch import load_file
from tvm import relax

from ...errors import ArtifactError, InputError, UsageError
from ..artifact import verify
from ..contract import check_limits, check_nonpositive
from ..manifest import Fields, evaluate, symbols
from . import arena
from .build import FORMAT
from .target import KINDS, check_host

DTYPES = {"f64": torch.float64, "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
          "i64": torch.int64, "i32": torch.int32, "i8": torch.int8, "u8": torch.uint8, "bool": torch.bool}


def _fmt(spec: dict) -> str:
    return f"{spec['dtype']}[{', '.join(str(d) for d in spec['shape'])}]"


@dataclass
class Entry:
    """What an entry takes and returns (from the manifest)."""

    name: str
    inputs: list[dict]
    outputs: list[dict]
    dims: dict
    limits: dict
    nonpositive: list
    shapes: list  # of each input: ints and sympy expressions, parsed from the manifest

    @property
    def input_names(self) -> list[str]:
        return [i["name"] for i in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [o["name"] for o in self.outputs]


def use_all_cpus() -> int:
    """Size TVM's CPU thread pool to the CPUs this process may run on, unless TVM_NUM_THREADS
    says otherwise; returns the count. TVM's default takes half of the hardware threads on
    x86 (it assumes two per core), so on a VM whose vCPUs are whole cores it left half of them
    idle (k3-small prefill on 2 vCPUs: 1 thread). The pool starts on the first parallel
    kernel, so this must run before that; the runner calls it when it starts."""
    if "TVM_NUM_THREADS" not in os.environ:
        cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
        os.environ["TVM_NUM_THREADS"] = str(max(1, len(cpus)))
    return int(os.environ["TVM_NUM_THREADS"])


class TvmRunner:
    def __init__(self, out_dir: str | Path):
        self.out_dir = Path(out_dir)
        for f in ("lib.so", "weights.safetensors", "manifest.json"):
            if not (self.out_dir / f).exists():
                raise ArtifactError(f"{self.out_dir} is not a TVM artifact: {f} is missing")
        # a truncated lib.so would be mapped and crash the process (SIGBUS): it must be listed and whole
        self.manifest = verify(self.out_dir, "tvm", uses=("lib.so", "weights.safetensors"))
        self.target, self.entries = _read(self.manifest, self.out_dir / "manifest.json")
        self.cpu_features = Fields(self.out_dir / "manifest.json").names(self.manifest.get("cpu_features", []),
                                                                         "cpu_features")
        self._vm = None
        self._params = None
        self._device = None
        self._fits: set = set()  # input signatures (dtype, shape) whose shapes fit their entry

    # ---- start up ------------------------------------------------------------------
    def _start(self) -> None:
        if self.target == "llvm":  # before the library is mapped: its kernels may use what this CPU lacks
            check_host(self.cpu_features, str(self.out_dir), self.manifest.get("target_string", ""))
            use_all_cpus()
        dev = tvm.cuda(0) if self.target == "cuda" else tvm.cpu(0)
        if not dev.exist:
            raise RuntimeError(f"{self.out_dir} was built for {self.target}, and there is no {self.target} device here")
        lib = tvm.runtime.load_module(str(self.out_dir / "lib.so"))
        vm = relax.VirtualMachine(lib, dev)
        tensors = load_file(str(self.out_dir / "weights.safetensors"))
        missing = [w for w in self.manifest["weights"] if w not in tensors]
        if missing:
            raise ArtifactError(f"{self.out_dir}/weights.safetensors lacks {missing[:4]}")
        weights = [_on(tensors[w], dev) for w in self.manifest["weights"]]
        huge = self.target == "llvm" and arena.available()  # a decode step streams them: huge pages
        # there, the transform's outputs come from the naive allocator, so that freeing them frees
        # them (the pooled allocator would keep them for reuse: the parameters held twice)
        transform = relax.VirtualMachine(lib, dev, memory_cfg="naive") if huge else vm
        params = list(transform["transform_params"](weights)) if weights else []
        del transform, weights, tensors
        if huge:
            params = arena.place(params)
            arena.trim()
        self._params, self._vm, self._device = params, vm, dev

    # ---- running -------------------------------------------------------------------
    def check_inputs(self, entry: str, inputs) -> None:
        """Raise InputError naming the first input that does not fit `entry`. The dtypes and
        shapes are checked once per distinct signature (a decode loop repeats one); the values
        (ids, positions, log-decays) on every call."""
        e = self.entries[entry]
        if len(inputs) != len(e.inputs):
            raise InputError(f"{entry} takes {len(e.inputs)} inputs ({', '.join(e.input_names)}), got {len(inputs)}")
        signature = (entry, *((x.dtype, x.shape) if isinstance(x, torch.Tensor) else None for x in inputs))
        if signature not in self._fits:
            self._check_shapes(entry, e, inputs)
            if len(self._fits) > 256:
                self._fits.clear()
            self._fits.add(signature)
        check_limits(entry, e.limits, e.input_names, inputs)
        for name in e.nonpositive:
            check_nonpositive(name, inputs[e.input_names.index(name)], "TVM")

    @staticmethod
    def _check_shapes(entry: str, e: Entry, inputs) -> None:
        env: dict[str, int] = {}
        for spec, shape, x in zip(e.inputs, e.shapes, inputs):
            if not isinstance(x, torch.Tensor) or x.dtype != DTYPES[spec["dtype"]] or x.dim() != len(shape):
                got = f"{x.dtype} {list(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
                raise InputError(f"input {spec['name']!r}: expected {_fmt(spec)}, got {got}")
            for axis, d in enumerate(shape):
                if isinstance(d, sympy.Symbol):
                    env.setdefault(d.name, int(x.shape[axis]))
        for spec, shape, x in zip(e.inputs, e.shapes, inputs):
            for axis, d in enumerate(shape):
                expected = evaluate(d, env, f"{entry} input {spec['name']!r} dim {axis}")
                if int(x.shape[axis]) != expected:
                    raise InputError(f"input {spec['name']!r}: expected {_fmt(spec)}, got {list(x.shape)} "
                                     f"(dim {axis} is {x.shape[axis]}, expected {expected})")
        for n, (lo, hi) in e.dims.items():
            if n in env and (env[n] < lo or (hi is not None and env[n] > hi)):
                raise InputError(f"dim {n} = {env[n]} is outside its range [{lo}, {hi if hi is not None else 'inf'}]")

    def _to_tvm(self, x: torch.Tensor):
        """Zero-copy on the CPU when the data is 64-byte aligned (what TVM requires): the torch
        tensor itself, which the VM's function call takes through DLPack (72 us less for a
        k3-small decode step's 45 inputs than a TVM tensor made for each); else a copy."""
        x = x.detach().contiguous() if x.requires_grad or not x.is_contiguous() else x
        if self.target == "llvm" and x.device.type == "cpu" and x.data_ptr() % 64 == 0:
            return x
        return tvm.runtime.tensor(x.cpu().numpy(), self._device)

    def run(self, entry: str, *inputs: torch.Tensor) -> list[torch.Tensor]:
        if entry not in self.entries:
            raise UsageError(f"no entry {entry!r} in {self.out_dir}; it has {', '.join(self.entries)}")
        self.check_inputs(entry, inputs)
        if self._vm is None:
            self._start()
        args = [self._to_tvm(x) for x in inputs]
        outs = self._vm[entry](*args, *self._params)[:]  # a list in one call; the Array iterates item by item
        if self.target == "llvm":  # the VM's CPU tensors, shared: torch's already when a torch tensor went in
            return [o if isinstance(o, torch.Tensor) else torch.from_dlpack(o) for o in outs]
        return [torch.from_numpy(o.numpy()) for o in outs]


def _read(manifest: dict, path) -> tuple[str, dict[str, Entry]]:
    """The target and entries of a TVM manifest, every field the runner uses checked."""
    f = Fields(path)
    f.obj(manifest, "", keys=("format", "target", "weights", "entries"))
    f.version(manifest, FORMAT)
    target = f.text(manifest["target"], "target", choices=KINDS)
    f.names(manifest["weights"], "weights")
    recorded = f.obj(manifest.get("limits", {}), "limits")
    entries = {}
    for name, m in f.obj(manifest["entries"], "entries").items():
        where = f"entries.{f.dim_name(name, 'entries key')}"
        m = f.obj(m, where, keys=("dims", "inputs", "outputs", "id_bounds"))
        dims = f.dims(m["dims"], f"{where}.dims")
        inputs, shapes = f.seq(m["inputs"], f"{where}.inputs"), []
        for i, spec in enumerate(inputs):
            at = f"{where}.inputs[{i}]"
            f.obj(spec, at, keys=("name", "dtype", "shape"))
            f.text(spec["name"], f"{at}.name")
            f.text(spec["dtype"], f"{at}.dtype", choices=tuple(DTYPES))
            shapes.append(f.shape(spec["shape"], f"{at}.shape", symbols(dims)))
        names = f.names([s["name"] for s in inputs], f"{where}.inputs names")
        ranks = {n: len(sh) for n, sh in zip(names, shapes)}
        outputs = f.seq(m["outputs"], f"{where}.outputs")
        for i, spec in enumerate(outputs):
            f.text(f.obj(spec, f"{where}.outputs[{i}]", keys=("name",))["name"], f"{where}.outputs[{i}].name")
        if name in recorded:
            limits = f.limits(recorded[name], f"limits.{name}", ranks)
        elif "positions" in ranks or "lengths" in ranks:
            f.fail("limits", f"records nothing for {name!r}, whose positions or lengths index its caches "
                   f"(compile the artifact again)")
        else:
            limits = f.limits({"ids": m["id_bounds"]}, f"{where}.id_bounds", ranks)
        nonpositive = f.names(m.get("nonpositive", []), f"{where}.nonpositive")
        if set(nonpositive) - set(names):
            f.fail(f"{where}.nonpositive", "names an input the entry does not have")
        entries[name] = Entry(name, inputs, outputs, dims, limits, nonpositive, shapes)
    if not entries:
        f.fail("entries", "lists no entry")
    return target, entries


def _on(t: torch.Tensor, dev):
    """A weight as a TVM tensor on `dev`: copied through DLPack into TVM's own (aligned) memory,
    as numpy has no bfloat16."""
    host = tvm.runtime.empty(tuple(t.shape), str(t.dtype).removeprefix("torch."), tvm.cpu())
    torch.from_dlpack(host).copy_(t)
    return host if dev.dlpack_device_type() == tvm.cpu().dlpack_device_type() else host.copyto(dev)
