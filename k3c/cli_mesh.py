"""The mesh commands of the CLI: `k3c diff --mesh` (compile per rank, spawn the ranks,
compare with the one-process model) and `k3c plan` (per-rank bytes on a mesh), and the
--combine flag both take."""

from __future__ import annotations

import argparse

from . import cli_checks as checks


def diff_mesh(args: argparse.Namespace, model, specs) -> int:
    from .distributed.diff import diff_mesh, format_report

    report = diff_mesh(model, specs, args.mesh, seq_len=args.seq_len, batch=args.batch,
                       decode_steps=args.decode_steps, out_root=args.out, combine=args.combine)
    print(format_report(report))
    if args.json:
        checks.write_json(args.json, report)
    return 0 if report["ok"] else 1


def add_combine(s: argparse.ArgumentParser) -> None:
    s.add_argument("--combine", choices=("auto", "all_reduce", "all_to_all"), default="auto",
                   help="how a mesh combines the routed experts' outputs: an all-reduce over the world, the "
                        "all-to-all dispatch and combine over the world, or (auto) the one that sends fewer bytes")


def cmd_plan(args: argparse.Namespace) -> int:
    from .plan import format_plan, plan

    report = plan(args.model, args.mesh, args.seq_len, combine=args.combine)
    print(format_plan(report))
    if args.json:
        checks.write_json(args.json, report)
    return 0
