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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="k3c", description=__doc__.splitlines()[0])
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("stats", help="params, FLOPs per token and state bytes of a model")
    s.add_argument("--model", required=True)
    s.add_argument("--seq-len", type=int, default=4096, help="context length for FLOPs per token")
    s.set_defaults(func=_cmd_stats)
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
