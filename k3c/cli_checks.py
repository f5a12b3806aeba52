"""The CLI's argument values, checked before any work: a bad --json, --plot, --dot or --out
path, an empty backend list or a negative count fails in the first second with one line,
not after the whole run (or, worse, by doing nothing and exiting 0)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from .errors import UsageError


def count(minimum: int):
    """An argparse type: an int >= minimum."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {n}")
        return n
    parse.__name__ = f"integer >= {minimum}"
    return parse


def output_file(flag: str, path: str | None) -> None:
    """A file the run will write at its end: it must be writable now."""
    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{flag} {path}: is a folder, not a file")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{flag} {path}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise UsageError(f"{flag} {path}: cannot write there (no permission)")


def plot_available() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'k3c[plot]'") from None


def flavours(text: str | None) -> list[str]:
    """--flavour portable,ort -> the ONNX flavours to run (default: every one)."""
    from .backend_spec import flavours_of

    known = flavours_of("onnx")
    if text is None:
        return list(known)
    names = [f.strip() for f in text.split(",") if f.strip()]
    if not names:
        raise UsageError(f"--flavour {text!r} names no flavour; known: {', '.join(known)}")
    bad = [f for f in names if f not in known]
    if bad:
        raise UsageError(f"unknown ONNX flavour(s) {bad}; known: {', '.join(known)}")
    return names


def backend_specs(text: str, flavour_text: str | None, flag: str = "--backends") -> list[str]:
    """`reference,onnx,tvm` or `all` -> the backends to run, a bare `onnx` once per flavour of
    --flavour (`onnx` is the portable flavour, `onnx:ort` the ort one); each name is read by
    backend_spec.parse_backend. An empty list, or a --flavour with no bare onnx to apply to, is an error."""
    from .backend_spec import BackendSpec, known_backends, parse_backend

    names = list(known_backends()) if text.strip() == "all" else [b.strip() for b in text.split(",") if b.strip()]
    if not names:
        raise UsageError(f"{flag} {text!r} names no backend; known: {', '.join(known_backends())} or all")
    flavour_list = flavours(flavour_text)
    specs: list[str] = []
    bare_onnx = False
    for b in names:
        spec = parse_backend(b, flag)
        if spec.name == "onnx" and spec.flavour is None:
            bare_onnx = True
            expanded = [str(BackendSpec("onnx", f)) for f in flavour_list]
        else:
            expanded = [str(spec)]
        specs += [s for s in expanded if s not in specs]
    if flavour_text is not None and not bare_onnx:
        raise UsageError(f"--flavour {flavour_text} applies to a bare onnx in {flag}, and {flag} {text} has none "
                         "(onnx:FLAVOUR names its own)")
    return specs


def out_root(path: str | None, specs: list[str], model: str, force: bool) -> None:
    """--out of diff/bench: a folder that gets one artifact per backend (DIR/onnx, DIR/onnx-ort ...)."""
    if path is None:
        return
    from .backends import artifact

    root = Path(path)
    if root.exists() and not root.is_dir():
        raise UsageError(f"--out {path}: is a file; artifacts go into a folder")
    from .backend_spec import parse_backend

    for text in specs:
        spec = parse_backend(text)
        artifact.check_target(root / text.replace(":", "-"), backend=spec.name, model=model, variant=spec.variant(),
                              force=force)


def write_json(path: str, data: dict) -> None:
    import json

    try:
        with open(path, "w") as f:
            json.dump(data, f, indent=2)
    except OSError as err:
        raise UsageError(f"--json {path}: cannot write ({err.strerror})") from None


def aot_seq_len(seq_len: int) -> None:
    """--seq-len of a Triton AOT compile: grids a GPU can launch (the backend's own check)."""
    from .backends.triton.aot import check_launch_limits

    check_launch_limits(seq_len, "--seq-len")


def flag_conflicts(args: argparse.Namespace) -> None:
    """Flags that contradict each other, or that the command would ignore: one line each."""
    given = vars(args)
    model = given.get("model") or ""
    if (given.get("inputs") or given.get("dims")) and ".py:" not in model:
        flag = "--inputs" if given.get("inputs") else "--dims"
        raise UsageError(f"{flag} applies to --model FILE.py:NAME (a module of a file); {model} is a zoo model")
    if given.get("cache") == "grow" and given.get("max_context") is not None:
        raise UsageError(f"--cache grow and --max-context {args.max_context} contradict each other: growing caches "
                         "have no capacity (--cache fixed --max-context N for fixed ones)")
    if given.get("cache") == "fixed" and given.get("max_context") is None:
        raise UsageError("--cache fixed needs --max-context N, the caches' capacity")
    outputs = [(f, given.get(k)) for f, k in (("--json", "json"), ("--plot", "plot"), ("--dot", "dot"))]
    paths = [(f, os.path.realpath(p)) for f, p in outputs if p]
    for i, (f, p) in enumerate(paths):
        for g, q in paths[i + 1:]:
            if p == q:
                raise UsageError(f"{f} and {g} name the same file {q}: one would overwrite the other")
    if args.command == "generate" and given.get("backend") == "eager":
        for flag, key in (("--out", "out"), ("--force", "force")):
            if given.get(key):
                raise UsageError(f"{flag} with --backend eager: the eager model writes no artifact")
    if given.get("keep") and given.get("out"):
        raise UsageError(f"--keep with --out {args.out}: artifacts written to --out are kept anyway")
    if args.command == "show" and given.get("backend") != "tvm":
        if given.get("target"):
            raise UsageError("--target applies to show --backend tvm")
    if args.command == "show" and given.get("backend") == "tvm" and given.get("dot"):
        raise UsageError("--dot with --backend tvm: show prints the scheduled TIR there, no graph to draw")
    if given.get("mesh") is not None and not given["mesh"].strip():
        raise UsageError("--mesh '' names no mesh: give tp=N,ep=M (or leave --mesh out for one process)")
    several = (given.get("backend") or "").strip() == "all" or "," in (given.get("backend") or "")
    if args.command == "compile" and several:
        one = [flag for flag, key in (("--target", "target"), ("--max-context", "max_context"), ("--cache", "cache"),
                                      ("--expert-activations", "expert_activations"), ("--dump-after", "dump_after"),
                                      ("--verify", "verify")) if given.get(key)]
        if one:
            raise UsageError(f"{', '.join(one)} with --backend {given['backend']}: that builds each backend for this "
                             "machine and checks it; give one --backend to build with "
                             f"{'it' if len(one) == 1 else 'them'}")
    if args.command == "compile" and given.get("seq_len") is not None:
        backend = given.get("backend", "")
        if not (backend.strip() == "all" or "," in backend or given.get("target", "") and
                str(given.get("target")).startswith("sm_")):
            raise UsageError("--seq-len applies to --backend all (the check's length) or --target sm_* (the "
                             "kernels' length); a compiled artifact takes any length")
