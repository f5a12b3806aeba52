"""The `k3c` command: a thin top that composes the public functions of each layer.

Errors a user can cause (an unknown model, a bad flag, an unsupported op) print one line
and exit non-zero; `--debug` shows the traceback.
"""

from __future__ import annotations

import argparse
import sys


class UserError(Exception):
    """An error in what the user asked for: printed as one line, exit status 2."""


def _cmd_stats(args: argparse.Namespace) -> int:
    from .models.stats import format_stats, model_stats

    print(format_stats(model_stats(args.model, seq_len=args.seq_len)))
    return 0


def _example_ids(model, batch: int = 2, seq_len: int = 16):
    import torch

    vocab = getattr(model.config, "vocab_size", 1024)
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (batch, seq_len), generator=gen)
    return ids.to(device)


def _capture_for_cli(args: argparse.Namespace):
    from . import capture, models, passes

    model = models.build(args.model)
    graph = capture(model, (_example_ids(model),), entry=args.entry)
    if args.after:
        graph = passes.run(graph, args.pipeline, stop_after=args.after)
    elif args.pipeline != "none":
        graph = passes.run(graph, args.pipeline)
    return graph


def _cmd_show(args: argparse.Namespace) -> int:
    graph = _capture_for_cli(args)
    if args.dot:
        from .ir.dot import write_dot

        write_dot(graph, args.dot)
        print(f"wrote {args.dot}", file=sys.stderr)
    else:
        print(graph, end="")
    return 0


def _cmd_compile(args: argparse.Namespace) -> int:
    from . import compile as k3c_compile
    from . import models

    model = models.build(args.model)
    options = {}
    if args.flavour:
        options["flavour"] = args.flavour
    if args.target:
        options["target"] = args.target
    compiled = k3c_compile(model, args.backend, (_example_ids(model),), out_dir=args.out,
                           passes=args.pipeline, verbose=True, **options)
    print(compiled.out_dir)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="k3c", description=__doc__.splitlines()[0])
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("stats", help="params, FLOPs per token and state bytes of a model")
    s.add_argument("--model", required=True)
    s.add_argument("--seq-len", type=int, default=4096, help="context length for FLOPs per token")
    s.set_defaults(func=_cmd_stats)

    s = sub.add_parser("show", help="print the IR of a model (after a pass, or as Graphviz)")
    s.add_argument("--model", required=True)
    s.add_argument("--entry", default="prefill", choices=["prefill", "decode", "forward"])
    s.add_argument("--pipeline", default="none", help="pass pipeline to run first (default: none)")
    s.add_argument("--after", help="stop after this pass of --pipeline (default pipeline if none given)")
    s.add_argument("--dot", help="write Graphviz to this file instead of printing the IR")
    s.set_defaults(func=_cmd_show)

    s = sub.add_parser("compile", help="compile a model to a backend and write the artifact")
    s.add_argument("--model", required=True)
    s.add_argument("--backend", required=True)
    s.add_argument("--out", help="artifact folder (default: a new temporary folder)")
    s.add_argument("--pipeline", default="default", help="pass pipeline (default: default)")
    s.add_argument("--flavour", choices=["portable", "ort"], help="onnx: custom-op flavour")
    s.add_argument("--target", help="tvm: llvm or cuda")
    s.set_defaults(func=_cmd_compile)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (UserError, KeyError, ValueError, TypeError, FileNotFoundError) as e:
        if args.debug:
            raise
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"k3c {args.command}: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
