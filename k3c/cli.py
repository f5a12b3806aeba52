"""The `k3c` command: a thin top that composes the public functions of each layer.

Errors a user can cause (an unknown model, a bad flag, an unsupported op) print one line
and exit 2; a check that finds a difference exits 1; `--debug` shows the traceback.
Argument values are checked before any work (cli_checks.py).
"""

from __future__ import annotations

import argparse
import sys

from . import cli_checks as checks
from . import cli_mesh, cli_module
from .errors import UsageError

UserError = UsageError  # an error in what the user asked for: printed as one line, exit status 2


def _cmd_stats(args: argparse.Namespace) -> int:
    from .models.stats import format_stats, model_stats

    stats = model_stats(args.model, seq_len=args.seq_len)
    print(format_stats(stats))
    if args.json:
        checks.write_json(args.json, stats)
    return 0


def _cmd_ops(args: argparse.Namespace) -> int:
    from .backends import coverage

    print(coverage.markdown() if args.markdown else coverage.text())
    return 0


def _example_ids(model, batch: int = 2, seq_len: int = 16):
    import torch

    vocab = getattr(model.config, "vocab_size", 1024)
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (batch, seq_len), generator=gen)
    return ids.to(device)


def _build(models, args: argparse.Namespace):
    """The model of --model in the precision of --dtype and --experts (default: fp32, dense)."""
    dtype = {"bf16": "bfloat16", "f32": None, None: None}[getattr(args, "dtype", None)]
    return models.build(args.model, dtype=dtype, experts=getattr(args, "experts", None))


def _precision_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("--dtype", choices=["f32", "bf16"], help="weights in this dtype, the F32 tensors of the "
                   "release kept (default f32); the CPU backends compute a bf16 model in float32")
    s.add_argument("--experts", choices=["mxfp4"], help="routed experts stored as MXFP4, as K3 is released")
    s.add_argument("--compute", choices=["f32", "bf16"], help="compute policy of a bf16 model: f32 (default: "
                   "float32 from the stored weights) or bf16 (GEMM operands rounded to bf16, float32 accumulation)")


def _state_dtype_arg(s: argparse.ArgumentParser) -> None:
    s.add_argument("--state-dtype", choices=["f32", "bf16"], help="dtype the recurrent states (KDA and "
                   "delta-rule states, short-conv tails) are held in between calls: f32 (default) or bf16 "
                   "(updated in float32, rounded when stored); the attention caches keep theirs")


def _capture_for_cli(args: argparse.Namespace):
    from . import capture, models, passes

    pipeline = "default" if (args.after or args.dump_after) and args.pipeline == "none" else args.pipeline
    passes.check_pipeline(pipeline, stop_after=args.after, dump_after=args.dump_after)  # before a slow capture
    if cli_module.is_module(args.model):  # a user's FILE.py:NAME: its forward
        graph = cli_module.capture(args)
    else:
        graph = capture(model := _build(models, args), (_example_ids(model),), entry=args.entry)
    if pipeline != "none":
        report = [] if args.report else None
        graph = passes.run(graph, pipeline, stop_after=args.after, dump_after=args.dump_after,
                           verify_each=args.verify, report=report)
        if report is not None:
            print(passes.format_report(report), file=sys.stderr)
    return graph


def _cmd_show(args: argparse.Namespace) -> int:
    checks.output_file("--dot", args.dot)
    graph = _capture_for_cli(args)
    if args.backend == "tvm":  # the scheduled TensorIR (and Relax) the TVM backend compiles
        from .backends import get

        print(get("tvm", target=args.target or "llvm").show({args.entry: graph}), end="")
    elif args.dot:
        from .ir.dot import write_dot

        write_dot(graph, args.dot)
        print(f"wrote {args.dot}", file=sys.stderr)
    elif not args.dump_after:  # the dump already printed the IR asked for
        print(graph, end="")
    return 0


def _backend_list(args: argparse.Namespace, text: str, flag: str) -> list[str]:
    """The backends of --backends/--backend, onnx once per --flavour, and --out checked."""
    specs = checks.backend_specs(text, getattr(args, "flavour", None), flag)
    checks.out_root(args.out, specs, args.model, getattr(args, "force", False))
    return specs


def _cmd_diff(args: argparse.Namespace) -> int:
    from . import models, stress_capacity
    from .diff import diff, write_json

    checks.output_file("--json", args.json)
    specs = _backend_list(args, args.backends, "--backends")
    if args.stress:
        from .stress import check

        check(args.stress)
    model = _build(models, args)
    if args.stress == "garbage-capacity" and not args.mesh:  # a stress of the inputs, not the weights
        return stress_capacity.run_cli(args, model, specs)
    if args.mesh:
        if args.state_dtype not in (None, "f32"):
            raise UsageError("--mesh with --state-dtype: the per-rank artifacts hold their states in float32")
        return cli_mesh.diff_mesh(args, model, specs)
    report = diff(model, specs, seq_len=args.seq_len, batch=args.batch or 2,
                  decode_steps=args.decode_steps, passes=args.pipeline, out_root=args.out,
                  bisect=not args.no_bisect, progress=lambda m: print(m, file=sys.stderr), stress=args.stress,
                  keep=args.keep, force=args.force, compute=args.compute, state_dtype=args.state_dtype)
    print(report.table(per_tensor=args.verbose))
    if report.policy is not None:
        print(report.policy.table())
    for b in report.backends.values():
        if b.first_bad_node and b.first_bad_node.get("how"):
            print(f"{b.backend}: first bad node found as the {b.first_bad_node['how']}", file=sys.stderr)
    if args.json:
        write_json(report, args.json)
    return 0 if report.ok else 1


def _cmd_bench(args: argparse.Namespace) -> int:
    from . import models
    from .bench import bench, plot, write_json

    checks.output_file("--json", args.json)
    checks.output_file("--plot", args.plot)
    if args.plot:
        checks.plot_available()
    specs = _backend_list(args, args.backends, "--backends")
    model = _build(models, args)
    report = bench(model, specs, seq_len=args.seq_len, decode_steps=args.decode_steps,
                   batch=args.batch, warmup=args.warmup, repeats=args.repeats,
                   torch_compile=not args.no_torch_compile, passes=args.pipeline, out_root=args.out,
                   keep=args.keep, force=args.force, compute=args.compute)
    m = report.machine
    print(f"{report.model} on {m['processor']} ({m['cpus']} CPUs, torch {m['torch']}, {m['torch_threads']} threads)")
    print(report.table())
    if args.json:
        write_json(report, args.json)
    if args.plot:
        plot(report, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def _cmd_compile_all(args: argparse.Namespace) -> int:
    """Compile to every backend, check each against eager, print one summary table."""
    from . import models
    from .diff import diff, format_table

    names = _backend_list(args, args.backend, "--backend")
    model = _build(models, args)
    report = diff(model, names, seq_len=args.seq_len or 130, decode_steps=4, passes=args.pipeline,
                  out_root=args.out, progress=lambda m: print(m, file=sys.stderr), force=args.force,
                  compute=args.compute, state_dtype=args.state_dtype)
    rows = [("backend", "artifact", "compile s", "max_abs_err", "rel_rms_err", "ok", "warm prefill vs eager")]
    for b in report.backends.values():
        speed = f"{report.eager_prefill_seconds / b.prefill_seconds:.2f}x" if b.prefill_seconds else "-"
        status = "yes" if b.ok else "NO" + (f" ({b.error.splitlines()[0][:90]})" if b.error else "")
        rows.append((b.backend, b.artifact, f"{b.compile_seconds:.1f}", f"{b.max_abs_err:.1e}",
                     f"{b.rel_rms_err:.1e}", status, speed))
    print(f"{report.model}: prefill T={args.seq_len or 130}, B=2, 4 decode steps, each backend against eager PyTorch")
    print(format_table(rows))
    if "triton" in report.backends:
        from .kernels.common import triton_mode

        if triton_mode.interpreted():
            print("triton ran under TRITON_INTERPRET=1 (no CUDA GPU here): its speed says nothing of a GPU's")
    return 0 if report.ok else 1


def _cmd_compile(args: argparse.Namespace) -> int:
    from . import compile as k3c_compile
    from . import models

    if args.backend.strip() == "all" or "," in args.backend:
        return _cmd_compile_all(args)
    from .backend_spec import parse_backend

    spec = parse_backend(args.backend, "--backend", args.flavour)
    name = spec.name
    aot = name == "triton" and args.target is not None
    if aot:
        from .backends.triton.aot import DEFAULT_SEQ_LEN, target

        target(args.target)  # an unknown target is said before a slow capture
        checks.aot_seq_len(args.seq_len or DEFAULT_SEQ_LEN)
    options = spec.options()
    if args.target:
        options["target"] = args.target
    if aot and args.seq_len:
        options["seq_len"] = args.seq_len
    if args.expert_activations:  # said before any work
        from .backends.triton.backend import expert_activations_for
        options["expert_activations"] = expert_activations_for(args.expert_activations, args.target, name)
    if args.out is not None and not cli_module.is_module(args.model):  # a target not to replace fails now
        from .backends import artifact

        artifact.check_target(args.out, backend=name, model=args.model, variant=spec.variant(args.target),
                              force=args.force)
    model, example, extra = cli_module.compile_args(args) if cli_module.is_module(args.model) else (
        _build(models, args), None, {})
    try:
        compiled = k3c_compile(model, name, example or (_example_ids(model),), out_dir=args.out, **extra,
                               passes=args.pipeline, verbose=True, force=args.force,
                               pass_options={"verify_each": args.verify, "dump_after": args.dump_after},
                               max_context=args.max_context, cache=args.cache, compute=args.compute,
                               state_dtype=args.state_dtype, **options)
    except RuntimeError as e:
        from .backends.triton.aot import AotError

        if not isinstance(e, AotError):
            raise
        print(f"k3c compile: {e}", file=sys.stderr)  # kernels that cannot run on the target: a finding
        return 1
    if aot:
        from .backends.triton.aot import load_report

        report = load_report(compiled.out_dir)
        print(report.table())
        for line in report.problems():
            print(f"  {line}")
    print(compiled.out_dir)
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with its errors as one line (the usage is what --help is for), exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="k3c", description=__doc__.splitlines()[0])
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("stats", help="params, FLOPs per token and state bytes of a model")
    s.add_argument("--model", required=True)
    s.add_argument("--seq-len", type=checks.count(1), default=4096, help="context length for FLOPs per token")
    s.add_argument("--json", help="also write the figures here (bytes as released under 'bytes')")
    s.set_defaults(func=_cmd_stats)

    s = sub.add_parser("ops", help="the backend x op support matrix, read from the lowering tables")
    s.add_argument("--markdown", action="store_true", help="as the Markdown table of README.md")
    s.set_defaults(func=_cmd_ops)

    s = sub.add_parser("show", help="print the IR of a model (after a pass, or as Graphviz)")
    s.add_argument("--model", required=True)
    s.add_argument("--entry", default="prefill", choices=["prefill", "decode", "forward"])
    s.add_argument("--pipeline", default="none", help="pass pipeline to run first (default: none)")
    s.add_argument("--after", help="stop after this pass of --pipeline (default pipeline if none given)")
    s.add_argument("--dot", help="write Graphviz to this file instead of printing the IR")
    s.add_argument("--dump-after", metavar="PASS", help="print the IR after this pass (instead of the final IR)")
    s.add_argument("--verify", action="store_true", help="run the verifier after every pass")
    s.add_argument("--report", action="store_true", help="print what each pass changed to stderr")
    s.add_argument("--backend", choices=["tvm"], help="print what this backend compiles (tvm: the scheduled TIR)")
    s.add_argument("--target", help="tvm: llvm or cuda (default llvm)")
    _precision_args(s)
    cli_module.add_args(s)
    s.set_defaults(func=_cmd_show)

    s = sub.add_parser("compile", help="compile a model to a backend and write the artifact")
    s.add_argument("--model", required=True)
    s.add_argument("--backend", required=True)
    s.add_argument("--out", help="artifact folder (default: a new temporary folder)")
    s.add_argument("--pipeline", default="default", help="pass pipeline (default: default)")
    s.add_argument("--flavour", help="onnx: custom-op flavour, portable or ort (with --backend all: a list, "
                                     "default portable,ort)")
    s.add_argument("--target", help="tvm: llvm (this CPU), 'llvm -mcpu=NAME' (another CPU) or cuda; "
                   "triton: sm_80, sm_90 or sm_100 (every kernel compiled "
                   "ahead of time: cubins and kernels.json, no GPU needed); onnx: cpu or cuda "
                   "(onnxruntime's CUDA provider: with --compute bf16, BF16 GEMMs on its MatMul)")
    s.add_argument("--dump-after", metavar="PASS", help="print the IR of each entry after this pass")
    s.add_argument("--verify", action="store_true", help="run the verifier after every pass")
    s.add_argument("--seq-len", type=checks.count(1),
                   help="with --backend all: prefill length of the check (default 130); "
                   "with --target sm_*: the prefill length the kernels are compiled for (default 8192)")
    s.add_argument("--force", action="store_true", help="replace what --out holds, even another artifact")
    s.add_argument("--max-context", type=checks.count(2), help="fixed-capacity caches of this many rows")
    s.add_argument("--cache", choices=["fixed", "grow"], help="the caches' form (fixed needs --max-context)")
    s.add_argument("--expert-activations", choices=["bf16", "mxfp8"], help="triton sm_100: MXFP4 experts' activations "
                   "into tl.dot_scaled: bf16 (default), mxfp8 (block-scaled MMA; 0.41 rel RMS on k3-tiny's logits)")
    _precision_args(s)
    _state_dtype_arg(s)
    cli_module.add_args(s)
    s.set_defaults(func=_cmd_compile)

    s = sub.add_parser("diff", help="run eager and backends on the same inputs; exit 1 when one is off")
    s.add_argument("--model", required=True)
    s.add_argument("--backends", required=True, help="comma-separated backend names, or all")
    s.add_argument("--json", help="write the report as JSON to this file")
    s.add_argument("--seq-len", type=checks.count(1), default=130)
    s.add_argument("--batch", type=checks.count(1), help="sequences (default 2, or N with --mesh dp=N)")
    s.add_argument("--decode-steps", type=checks.count(0), default=8)
    s.add_argument("--pipeline", default="default")
    s.add_argument("--flavour", help="onnx flavours to check, comma-separated (default: portable,ort)")
    s.add_argument("--stress", help="run at weights the defaults never reach: router-low, strong-decay, "
                                    "large-a-log, spiky-gates, situ-saturated, router-ties; or with garbage in "
                                    "unused cache rows: garbage-capacity")
    s.add_argument("--out", help="folder for the artifacts (default: a temporary one, removed at the end)")
    s.add_argument("--keep", action="store_true", help="keep the temporary artifacts (their folder is printed)")
    s.add_argument("--force", action="store_true", help="replace what --out holds, even other artifacts")
    s.add_argument("--no-bisect", action="store_true", help="do not look for the first differing node")
    s.add_argument("-v", "--verbose", action="store_true", help="one row per output and state tensor")
    s.add_argument("--mesh", help="[dp=N,]tp=N,ep=M[,pp=N]: one artifact per rank, spawn the ranks (gloo on CPU)")
    cli_mesh.add_combine(s)
    _precision_args(s)
    _state_dtype_arg(s)
    s.set_defaults(func=_cmd_diff)

    cli_mesh.add_plan(sub)

    s = sub.add_parser("bench", help="time prefill and decode: eager, torch.compile and backends")
    s.add_argument("--model", required=True)
    s.add_argument("--backends", required=True, help="comma-separated backend names, or all")
    s.add_argument("--json", help="write the report as JSON to this file")
    s.add_argument("--plot", help="write a PNG plot of the speedups to this file")
    s.add_argument("--seq-len", type=checks.count(1), default=1024)
    s.add_argument("--decode-steps", type=checks.count(0), default=64)
    s.add_argument("--batch", type=checks.count(1), default=1)
    s.add_argument("--warmup", type=checks.count(0), default=1)
    s.add_argument("--repeats", type=checks.count(1), default=3)
    s.add_argument("--no-torch-compile", action="store_true", help="skip the torch.compile baseline")
    s.add_argument("--pipeline", default="default")
    s.add_argument("--flavour", help="onnx flavours to time, comma-separated (default: portable,ort)")
    s.add_argument("--out", help="folder for the artifacts (default: a temporary one, removed at the end)")
    s.add_argument("--keep", action="store_true", help="keep the temporary artifacts")
    s.add_argument("--force", action="store_true", help="replace what --out holds, even other artifacts")
    _precision_args(s)
    s.set_defaults(func=_cmd_bench)

    s = sub.add_parser("generate", help="greedy generation through an artifact with fixed-capacity caches")
    s.add_argument("--model", required=True)
    s.add_argument("--backend", required=True, help="reference, onnx, onnx:ort, tvm, triton (any name diff takes) "
                   "or eager")
    s.add_argument("--prompt-ids", help='one prompt of token ids, e.g. "1 2 3"')
    s.add_argument("--prompt-file", help="a file holding one prompt's token ids")
    s.add_argument("--batch-file", help="a file of prompts, one a line (they may differ in length)")
    s.add_argument("--max-new-tokens", type=checks.count(1), required=True)
    s.add_argument("--max-context", type=checks.count(2), help="cache capacity (default: longest prompt + new)")
    s.add_argument("--out", help="artifact folder, kept (default: a temporary one, removed at the end)")
    s.add_argument("--force", action="store_true", help="replace what --out holds, even another artifact")
    s.add_argument("--draft", help="a zoo model of the same vocabulary that proposes tokens, verified by one "
                   "extend a round (speculative: the same tokens as greedy)")
    s.add_argument("--draft-tokens", type=checks.count(1), default=4, help="drafts a round (default 4)")
    s.set_defaults(func=_cmd_generate)
    return p


def _cmd_generate(args: argparse.Namespace) -> int:
    from .generate import run_cli

    return run_cli(args)


def main(argv: list[str] | None = None) -> int:
    from .cli_signals import EXIT_STATUS, Terminated, sigterm_as_interrupt
    from .errors import user_errors  # k3c's own error types: meant for the user, without a traceback

    args = build_parser().parse_args(argv)
    try:
        with sigterm_as_interrupt():  # SIGTERM cleans up like Ctrl-C (cli_signals.py)
            checks.flag_conflicts(args)
            return args.func(args)
    except Terminated:
        print(f"k3c {args.command}: terminated (SIGTERM); its temporary files removed", file=sys.stderr)
        return EXIT_STATUS
    except (KeyError, ValueError, TypeError, FileNotFoundError, ImportError, *user_errors()) as e:
        if args.debug:
            raise
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"k3c {args.command}: error: {' '.join(str(msg).split())}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
