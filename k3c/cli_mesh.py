"""The mesh commands of the CLI: `k3c diff --mesh` (compile per rank, spawn the ranks,
compare with the one-process model) and `k3c plan` (per-rank bytes on a mesh, and with
--device whether it fits and a roofline estimate), and the --combine flag both take."""

from __future__ import annotations

import argparse

from . import cli_checks as checks
from .errors import UsageError


def refuse_unchecked(args: argparse.Namespace) -> None:
    """A UsageError for a flag `diff --mesh` would otherwise drop: the mesh check runs the fp32
    model (MXFP4 experts included) at the fp32 tolerance of one process, and nothing else yet."""
    why = {"dtype": "the mesh check runs fp32 weights (bf16 on a mesh is not checked yet)",
           "compute": "the mesh check runs the fp32 compute policy only",
           "state_dtype": "the mesh check holds recurrent states in fp32 only",
           "stress": "the mesh check runs the default weights only (the stress presets run in one process)",
           "keep": "give --out DIR to keep the rank artifacts"}
    for key, reason in why.items():
        value = getattr(args, key, None)
        if value not in (None, False, "f32"):
            flag = "--" + key.replace("_", "-")
            shown = "" if value is True else f" {value}"
            raise UsageError(f"{flag}{shown} with --mesh: {reason}")


def diff_mesh(args: argparse.Namespace, model, specs) -> int:
    from .distributed.diff import diff_mesh, format_report
    from .distributed.mesh import Mesh

    refuse_unchecked(args)
    batch = args.batch or max(2, Mesh.parse(args.mesh).dp)  # by default a row or more for each dp copy
    report = diff_mesh(model, specs, args.mesh, seq_len=args.seq_len, batch=batch,
                       decode_steps=args.decode_steps, out_root=args.out, combine=args.combine,
                       passes=args.pipeline)
    print(format_report(report))
    if args.json:
        checks.write_json(args.json, report)
    return 0 if report["ok"] else 1


def add_combine(s: argparse.ArgumentParser) -> None:
    s.add_argument("--combine", choices=("auto", "all_reduce", "all_to_all"), default="auto",
                   help="how a mesh combines the routed experts' outputs: an all-reduce over the world, the "
                        "all-to-all dispatch and combine over the world, or (auto) the one that sends fewer bytes")


def add_plan(sub) -> None:
    """The `plan` subcommand and its flags."""
    from .plan_devices import DEVICES, HEADROOM

    s = sub.add_parser("plan", help="per-rank weights and state pool, bytes sent per token, fit on a device "
                                    "and a roofline estimate of tokens/s, on a mesh")
    s.add_argument("--model", required=True)
    s.add_argument("--mesh", required=True, help="dp=N,tp=N,ep=N,pp=N (any subset; ',vocab' splits the vocabulary "
                                                 "over tp); pp with ep or dp is plan-only")
    s.add_argument("--seq-len", type=checks.count(1), default=4096,
                   help="tokens of the counted prefill (and the context when --context is not given)")
    s.add_argument("--device", metavar="|".join(DEVICES),
                   help="a GPU to fit the ranks on and to estimate tokens/s for")
    s.add_argument("--concurrency", type=checks.count(1), help="sequences served at once (default 1)")
    s.add_argument("--context", type=checks.count(1), help="tokens of each sequence's state (default --seq-len)")
    s.add_argument("--state-dtype", choices=("f32", "bf16"), default="f32",
                   help="dtype of the recurrent KDA state (bf16 halves it)")
    s.add_argument("--headroom", type=float, default=HEADROOM,
                   help=f"share of a GPU's memory left for activations and runtime (default {HEADROOM})")
    s.add_argument("--json", help="write the plan as JSON to this file")
    add_combine(s)
    s.set_defaults(func=cmd_plan)


def cmd_plan(args: argparse.Namespace) -> int:
    from .plan import format_plan, plan

    report = plan(args.model, args.mesh, args.seq_len, combine=args.combine, device_name=args.device,
                  concurrency=args.concurrency, context=args.context, state_dtype=args.state_dtype,
                  headroom=args.headroom)
    print(format_plan(report))
    if args.json:
        checks.write_json(args.json, report)
    return 0
