"""Run a TVM artifact in the Relax VM, from its directory alone (no IR needed).

    runner = TvmRunner("DIR")                   # lib.so + weights.safetensors + manifest.json
    outputs = runner.run("prefill", input_ids)  # torch tensors, in the manifest's order

Inputs are checked against the manifest first (count, dtype, rank, dims consistent across
inputs, embedding ids in range), so a misfit is one line naming the input rather than an error
from inside the VM. The device and the VM come up on the first run, so a `cuda` artifact can be
built and loaded on a machine without a GPU; running it there says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import sympy
import torch
import tvm
from safetensors.torch import load_file
from tvm import relax

from ...ir import dims as D
from ...ir.interpret import InputError
from .build import FORMAT

DTYPES = {"f64": torch.float64, "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
          "i64": torch.int64, "i32": torch.int32, "i8": torch.int8, "u8": torch.uint8, "bool": torch.bool}


@dataclass
class Entry:
    """What an entry takes and returns (from the manifest)."""

    name: str
    inputs: list[dict]
    outputs: list[dict]
    dims: dict
    id_bounds: dict

    @property
    def input_names(self) -> list[str]:
        return [i["name"] for i in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [o["name"] for o in self.outputs]


class TvmRunner:
    def __init__(self, out_dir: str | Path):
        self.out_dir = Path(out_dir)
        for f in ("lib.so", "weights.safetensors", "manifest.json"):
            if not (self.out_dir / f).exists():
                raise FileNotFoundError(f"{self.out_dir} is not a TVM artifact: {f} is missing")
        self.manifest = json.loads((self.out_dir / "manifest.json").read_text())
        if self.manifest.get("format") != FORMAT:
            raise ValueError(f"{self.out_dir}/manifest.json: format {self.manifest.get('format')!r}, "
                             f"expected {FORMAT!r}")
        self.target = self.manifest["target"]
        self.entries = {e: Entry(e, m["inputs"], m["outputs"], m["dims"], m["id_bounds"])
                        for e, m in self.manifest["entries"].items()}
        self._vm = None
        self._params = None
        self._device = None

    # ---- start up ------------------------------------------------------------------
    def _start(self) -> None:
        dev = tvm.cuda(0) if self.target == "cuda" else tvm.cpu(0)
        if not dev.exist:
            raise RuntimeError(f"{self.out_dir} was built for {self.target}, and there is no {self.target} device here")
        lib = tvm.runtime.load_module(str(self.out_dir / "lib.so"))
        vm = relax.VirtualMachine(lib, dev)
        tensors = load_file(str(self.out_dir / "weights.safetensors"))
        missing = [w for w in self.manifest["weights"] if w not in tensors]
        if missing:
            raise ValueError(f"{self.out_dir}/weights.safetensors lacks {missing[:4]}")
        weights = [tvm.runtime.tensor(tensors[w].numpy(), dev) for w in self.manifest["weights"]]
        self._params = list(vm["transform_params"](weights)) if weights else []
        self._vm, self._device = vm, dev

    # ---- running -------------------------------------------------------------------
    def check_inputs(self, entry: str, inputs) -> None:
        """Raise InputError naming the first input that does not fit `entry`."""
        e = self.entries[entry]
        if len(inputs) != len(e.inputs):
            raise InputError(f"{entry} takes {len(e.inputs)} inputs ({', '.join(e.input_names)}), got {len(inputs)}")
        symbols = {n: D.sym(n) for n in e.dims}
        env: dict[str, int] = {}
        for spec, x in zip(e.inputs, inputs):
            want = f"{spec['dtype']}[{', '.join(spec['shape'])}]"
            if not isinstance(x, torch.Tensor) or x.dtype != DTYPES[spec["dtype"]] or x.dim() != len(spec["shape"]):
                got = f"{x.dtype} {list(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
                raise InputError(f"input {spec['name']!r}: expected {want}, got {got}")
            for axis, text in enumerate(spec["shape"]):
                d = D.parse(text, symbols)
                if isinstance(d, sympy.Symbol):
                    env.setdefault(d.name, int(x.shape[axis]))
        for spec, x in zip(e.inputs, inputs):
            for axis, text in enumerate(spec["shape"]):
                expected = D.evaluate(D.parse(text, symbols), env)
                if int(x.shape[axis]) != expected:
                    raise InputError(f"input {spec['name']!r}: expected {spec['dtype']}[{', '.join(spec['shape'])}], "
                                     f"got {list(x.shape)} (dim {axis} is {x.shape[axis]}, expected {expected})")
        for n, (lo, hi) in e.dims.items():
            if n in env and (env[n] < lo or (hi is not None and env[n] > hi)):
                raise InputError(f"dim {n} = {env[n]} is outside its range [{lo}, {hi if hi is not None else 'inf'}]")
        for name, bound in e.id_bounds.items():
            x = inputs[e.input_names.index(name)]
            if x.numel() and (int(x.min()) < 0 or int(x.max()) >= bound):
                raise InputError(f"input {name!r}: ids must lie in [0, {bound}), got [{int(x.min())}, {int(x.max())}]")

    def run(self, entry: str, *inputs: torch.Tensor) -> list[torch.Tensor]:
        if entry not in self.entries:
            raise KeyError(f"no entry {entry!r} in {self.out_dir}; it has {', '.join(self.entries)}")
        self.check_inputs(entry, inputs)
        if self._vm is None:
            self._start()
        args = [tvm.runtime.from_dlpack(x.detach().contiguous()) if self.target == "llvm"
                else tvm.runtime.tensor(x.detach().cpu().numpy(), self._device) for x in inputs]
        outs = self._vm[entry](*args, *self._params)
        return [torch.from_dlpack(o).cpu() if self.target == "llvm" else torch.from_numpy(o.numpy()) for o in outs]
