"""A user's own module named on the command line: `--model FILE.py:NAME` with `--inputs`.

    k3c show    --model my_block.py:Block --inputs "x=f32[6,512]" --dims "x=N _"
    k3c compile --model my_kda.py:make --backend tvm --inputs "q=f32[1,16,4,64]; ...; state=f32[1,4,64,64]"

NAME is an `nn.Module` instance in the file, or a class or function that makes one with no
arguments. `--inputs` gives the example inputs in forward's order, `name=dtype[d0,d1,...]`
separated by `;` (floats are seeded normal values, integers zeros); `--dims` names the
dynamic dims in the short form of `k3c.capture(dims=)`, `name=B T _` separated by `;`.
Without `--dims` the default of k3c.capture applies; either way the command prints the dims
the capture took.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

from .errors import UsageError

_DTYPES = {"f32": "float32", "f64": "float64", "bf16": "bfloat16", "f16": "float16", "i64": "int64", "i32": "int32"}
_INPUT = re.compile(r"^\s*([A-Za-z_]\w*)\s*=\s*(\w+)\s*\[([\d,\s]*)\]\s*$")


def is_module(model: str) -> bool:
    """Whether --model names a file's module (FILE.py:NAME) rather than a zoo model."""
    return ".py:" in model


def load(spec: str):
    """The nn.Module FILE.py:NAME names, in eval mode."""
    import torch

    path, _, name = spec.rpartition(":")
    if not Path(path).is_file():
        raise UsageError(f"--model {spec}: no file {path}")
    mspec = importlib.util.spec_from_file_location(Path(path).stem, path)
    mod = importlib.util.module_from_spec(mspec)
    sys.modules.setdefault(mspec.name, mod)  # dataclasses look their module up there
    mspec.loader.exec_module(mod)
    if not hasattr(mod, name):
        raise UsageError(f"--model {spec}: {path} has no {name!r}")
    obj = getattr(mod, name)
    module = obj if isinstance(obj, torch.nn.Module) else obj() if callable(obj) else None
    if not isinstance(module, torch.nn.Module):
        raise UsageError(f"--model {spec}: {name} is not an nn.Module, nor makes one with no arguments")
    return module.eval()


def example_inputs(text: str | None, spec: str) -> tuple:
    """The tensors of --inputs, in its order."""
    import torch

    if not text:
        raise UsageError(f"--model {spec} is a module of a file: give its example inputs with --inputs "
                         f"\"x=f32[2,16,512]; ...\"")
    gen = torch.Generator().manual_seed(0)
    out = []
    for part in filter(str.strip, text.split(";")):
        m = _INPUT.match(part)
        if not m or m.group(2) not in _DTYPES:
            raise UsageError(f"--inputs: {part.strip()!r} is not name=dtype[d0,d1,...] with a dtype of "
                             f"{', '.join(_DTYPES)}")
        shape = [int(d) for d in m.group(3).split(",") if d.strip()]
        dtype = getattr(torch, _DTYPES[m.group(2)])
        out.append(torch.randn(*shape, generator=gen).to(dtype) if dtype.is_floating_point
                   else torch.zeros(*shape, dtype=dtype))
    return tuple(out)


def dims(text: str | None) -> dict | None:
    """--dims "x=N _; q=B T _ _" as k3c.capture's dims= ({"x": "N _", ...}), or None."""
    if not text:
        return None
    out = {}
    for part in filter(str.strip, text.split(";")):
        name, eq, form = part.partition("=")
        if not eq or not name.strip() or not form.strip():
            raise UsageError(f"--dims: {part.strip()!r} is not name=TOKENS (one per axis: a dim name or _)")
        out[name.strip()] = form.strip()
    return out


def add_args(s) -> None:
    """--inputs and --dims, for a --model FILE.py:NAME."""
    s.add_argument("--inputs", help="with --model FILE.py:NAME: its example inputs, \"x=f32[6,512]; ...\"")
    s.add_argument("--dims", help="with --model FILE.py:NAME: its dynamic dims, \"x=N _; ...\" (default: B, T)")


def capture(args):
    """The graph of `k3c show --model FILE.py:NAME` (its forward), the dims it took printed."""
    from . import capture as k3c_capture
    from .compiler import dynamic_line

    module = load(args.model)
    graph = k3c_capture(module, example_inputs(args.inputs, args.model), dims=dims(args.dims))
    print(dynamic_line({"forward": graph}), file=sys.stderr)
    return graph


def compile_args(args) -> tuple:
    """(module, example inputs, extra k3c.compile keywords) of `k3c compile --model FILE.py:NAME`."""
    module = load(args.model)
    return module, example_inputs(args.inputs, args.model), {"dims": dims(args.dims)}
