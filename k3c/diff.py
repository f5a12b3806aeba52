"""Differential testing: the same seeded inputs through eager PyTorch and each backend.

Prefill at a length several chunks beyond the one captured, then a decode loop that feeds
each backend its own state. Every output and state tensor is compared with eager under a
tolerance derived from the model itself (k3c.numerics.model_tolerance): the eager model is
also run in float64, and a backend may differ from eager by a few times eager's own distance
from that. When a backend is off, the first IR node whose output is off given correct
inputs is named (k3c.bisect).

Backends are named as on the command line: `onnx` (the portable flavour), `onnx:ort`, `tvm`,
`triton`, `reference`. Artifacts go to `out_root/NAME` (a temporary folder, removed at the end
unless `keep`).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .bisect import first_divergent_node, first_divergent_prefix  # noqa: F401  (public names)
from .compiler import ZOO_ENTRIES, capture_entries, rebind_weights
from .diff_builds import Builds, Built, backend_for, simulated  # noqa: F401  (backend_for: public here)
from .diff_runs import Names, Worker, run_artifact
from .errors import UsageError
from .models.precision import BF16State, bf16_policy, fp32_copy, low_precision, with_bf16_outputs
from .numerics import BF16_COMPUTE, BF16_STATE, Tolerance, compare, model_tolerance, rel_rms_err
from .resources import check_fits
from .yardstick import float64_copy, float64_mode


@dataclass
class TensorDiff:
    name: str
    max_abs_err: float
    rel_rms_err: float
    ok: bool
    tol_max_abs: float = 0.0
    tol_rel_rms: float = 0.0
    noise_rel_rms: float = 0.0  # eager's own distance from its float64 copy: what the tolerance follows


@dataclass
class BackendDiff:
    backend: str
    ok: bool = False
    max_abs_err: float = 0.0
    rel_rms_err: float = 0.0
    tensors: list[TensorDiff] = field(default_factory=list)
    compile_seconds: float = 0.0
    prefill_seconds: float = 0.0
    artifact: str = ""
    first_bad_node: dict | None = None
    error: str | None = None
    routing: dict | None = None  # compute="bf16": the backend's routing against the eager policy's

    def add(self, name: str, actual: torch.Tensor, expected: torch.Tensor, tol: Tolerance | None = None,
            noise: float = 0.0) -> None:
        c = compare(actual, expected, tolerance=tol)
        self.tensors.append(TensorDiff(name, c.max_abs_err, c.rel_rms_err, c.ok,
                                       tol.max_abs if tol else 0.0, tol.rel_rms if tol else 0.0, noise))
        self.max_abs_err = max(self.max_abs_err, c.max_abs_err)
        self.rel_rms_err = max(self.rel_rms_err, c.rel_rms_err)

    @property
    def worst_margin(self) -> float:
        """The largest rel_rms_err / tolerance over the tensors (ok means every one <= 1)."""
        return max((t.rel_rms_err / t.tol_rel_rms for t in self.tensors if t.tol_rel_rms), default=0.0)


def one_line(text: str, limit: int = 110) -> str:
    """An error message as one line: whitespace collapsed, cut at `limit` characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class DiffReport:
    model: str
    shapes: dict
    backends: dict[str, BackendDiff]
    eager_prefill_seconds: float = 0.0
    stress: str | None = None
    compute: str | None = None  # "f32": the backends computed a BF16 model in float32 (see diff)
    policy: object = None  # compute="bf16": the policy against fp32 compute (k3c.precision_check.PolicyReport)
    state_dtype: str | None = None  # "bf16": recurrent states held in BF16 between calls, eager likewise

    @property
    def ok(self) -> bool:
        return all(b.ok for b in self.backends.values())

    def to_json(self) -> dict:
        return {"model": self.model, "shapes": self.shapes, "stress": self.stress, "compute": self.compute,
                "state_dtype": self.state_dtype, "ok": self.ok,
                "policy": self.policy.to_json() if self.policy is not None else None,
                "backends": {k: asdict(v) for k, v in self.backends.items()}}

    def table(self, per_tensor: bool = False) -> str:
        rows = [("backend", "ok", "max_abs_err", "rel_rms_err", "of tol", "compile s", "first bad node")]
        for b in self.backends.values():
            bad = ""
            if b.error:
                bad = one_line(b.error)
            elif b.first_bad_node:
                bad = f"%{b.first_bad_node['value']} = {b.first_bad_node['op']} at {b.first_bad_node['loc']}"
            rows.append((b.backend, "yes" if b.ok else "NO", f"{b.max_abs_err:.2e}", f"{b.rel_rms_err:.2e}",
                         f"{b.worst_margin:.2f}" if b.tensors else "", f"{b.compile_seconds:.1f}", bad))
            if b.routing:
                r = b.routing
                rows.append(("  routing", "yes" if r["ok"] else "NO", f"{r['agreeing']}/{r['slots']} slots agree",
                             "", "", "", f"{len(r['gaps_ulps'])} tokens differ; the eager gap there "
                             f"at most {max(r['gaps_ulps'], default=0):.2g} BF16 ulps"))
            if per_tensor:
                rows.extend(("  " + t.name, "yes" if t.ok else "NO", f"{t.max_abs_err:.2e}", f"{t.rel_rms_err:.2e}",
                             f"{t.rel_rms_err / t.tol_rel_rms:.2f}" if t.tol_rel_rms else "", "", "")
                            for t in b.tensors)
        return format_table(rows)


def format_table(rows: list[tuple]) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def seeded_ids(vocab: int, B: int, T: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


@dataclass
class _Eager:
    """The eager model's outputs on the diff's inputs, and the tolerance of each."""

    prefill: tuple[torch.Tensor, dict]
    steps: list[torch.Tensor]
    final: dict
    tol: dict[str, Tolerance]
    noise: dict[str, float]


def _run_eager(model, ids, seq_len: int, decode_steps: int):
    logits, state = model.prefill(ids[:, :seq_len])
    steps, st = [], state
    for i in range(decode_steps):
        lg, st = model.decode(ids[:, seq_len + i: seq_len + i + 1], st)
        steps.append(lg)
    return (logits, state), steps, st


def _eager(model, ids, seq_len: int, decode_steps: int, state_dtype: str | None = None) -> _Eager:
    """`state_dtype="bf16"`: the model and its float64 copy under the BF16 state policy
    (models.precision.BF16State), each tensor at least at the BF16_STATE row."""
    exact = float64_copy(model)  # the yardstick of the tolerances (numerics.model_tolerance)
    if state_dtype == "bf16":
        model, exact = BF16State(model), BF16State(exact)
    (logits, state), steps, final = _run_eager(model, ids, seq_len, decode_steps)
    with float64_mode():  # float64 throughout, the models' float32 casts included (k3c/yardstick.py)
        (x_logits, x_state), x_steps, x_final = _run_eager(exact, ids, seq_len, decode_steps)
    pairs = {"prefill/logits": (logits, x_logits)}
    pairs.update({f"prefill/{k}": (v, x_state[k]) for k, v in state.items()})
    pairs.update({f"decode{i}/logits": ab for i, ab in enumerate(zip(steps, x_steps))})
    pairs.update({f"final/{k}": (v, x_final[k]) for k, v in final.items()})
    tol = {k: model_tolerance(a, b) for k, (a, b) in pairs.items()}
    if state_dtype == "bf16":
        tol = {k: Tolerance(max(t.max_abs, BF16_STATE.max_abs), max(t.rel_rms, BF16_STATE.rel_rms))
               for k, t in tol.items()}
    noise = {k: rel_rms_err(a, b) for k, (a, b) in pairs.items()}
    return _Eager((logits, state), steps, final, tol, noise)


def _policy_eager(policy, ids, seq_len: int, decode_steps: int, taken: list[torch.Tensor]) -> tuple[_Eager, dict]:
    """The eager BF16 policy (models.precision.bf16_policy) on the routing a backend took, and
    that routing against the policy's own. Why on the backend's routing: BF16 rounding turns
    float32 differences into BF16-sized ones at the elements next to a rounding boundary, and
    random-weight routers have near ties (see k3c.numerics.BF16_COMPUTE); on one routing, the
    two evaluations differ by rounding alone."""
    from .precision_check import instrumented, routing_check

    with instrumented(policy, list(taken)) as own:
        (logits, state), steps, final = _run_eager(policy, ids, seq_len, decode_steps)
    names = ["prefill/logits", *(f"prefill/{k}" for k in state), *(f"decode{i}/logits" for i in range(decode_steps)),
             *(f"final/{k}" for k in final)]
    return (_Eager((logits, state), steps, final, dict.fromkeys(names, BF16_COMPUTE), dict.fromkeys(names, 0.0)),
            routing_check(own, taken))


def _pop_routing(state: dict) -> list[torch.Tensor]:
    from .precision_check import ROUTING

    keys = sorted((k for k in state if k.startswith(ROUTING)), key=lambda k: int(k[len(ROUTING):]))
    return [state.pop(k) for k in keys]


@torch.no_grad()
def diff(model: torch.nn.Module, backends: list[str], *, seq_len: int = 130, batch: int = 2,
         decode_steps: int = 8, capture_len: int = 16, passes: str | list[str] = "default", seed: int = 0,
         out_root: str | Path | None = None, bisect: bool = True, progress=None, stress: str | None = None,
         keep: bool = False, force: bool = False, captured: dict | None = None,
         timing: bool = True, compute: str | None = None, greedy_tokens: int = 128,
         state_dtype: str | None = None) -> DiffReport:
    """Compare each backend with eager `model` on prefill(seq_len) and `decode_steps` decode steps.

    `stress` runs it at the weights of a k3c.stress edit. Without `out_root` the artifacts go
    to a temporary folder that is removed at the end unless `keep`. `captured`: the graphs of
    `capture_entries` for this model (or one of its structure: its weights are rebound), not
    yet through the passes. `timing` False skips the second (timed) prefill of each backend.

    `compute` "f32" (the default for a model with BF16 weights): every backend computes in
    float32 from the stored weights, and is compared with the model in float32 on the same
    weights (BF16 widened, MXFP4 decoded: models.precision.fp32_copy). A BF16 computation of
    a MoE model is no yardstick: one routing flip moves a token's logits by O(1).

    `compute` "bf16": every backend computes under the BF16 policy (k3c.compile's compute=)
    and returns its routing; it is compared at the BF16_COMPUTE row with the eager policy
    (models.precision.bf16_policy) run on that routing, and each routing decision it took that
    the eager policy did not must be a near tie there. `report.policy` measures the policy
    against fp32 compute (k3c.precision_check), with `greedy_tokens` of greedy generation.

    `state_dtype` "bf16": every backend holds the recurrent states in BF16 between calls
    (k3c.compile's state_dtype=) and is compared with the eager model under the same policy
    (models.precision.BF16State) at the BF16_STATE row or the measured noise, whichever is more."""
    if not backends:
        raise UsageError("no backend to compare")
    if decode_steps < 0 or seq_len < 1 or batch < 1:
        raise UsageError(f"seq_len {seq_len}, batch {batch} must be >= 1 and decode_steps {decode_steps} >= 0")
    say = progress or (lambda msg: None)
    name = getattr(model, "name", type(model).__name__)
    if state_dtype not in (None, "f32", "bf16"):
        raise UsageError(f"--state-dtype {state_dtype}: the recurrent states can be held in f32 or bf16")
    if state_dtype == "bf16" and compute == "bf16":
        raise UsageError("--state-dtype bf16 with --compute bf16: diff checks one precision policy at a time")
    if compute == "bf16" and not low_precision(model):  # before the slow capture
        raise UsageError(f"--compute bf16 rounds the GEMM operands a model holds in BF16, and {name} holds "
                         "none: build it in its release precision (--dtype bf16)")
    tokens = batch * (seq_len + decode_steps)  # eager's logits in float32 and its yardstick's in float64, at least
    check_fits(f"diff: batch {batch} x {seq_len + decode_steps} tokens of {model.config.vocab_size} logits",
               tokens * model.config.vocab_size * 12, UsageError)
    if stress:
        from .stress import stressed

        model = stressed(model, stress)
        say(f"stress {stress}: {model.stress}")
    ids = seeded_ids(model.config.vocab_size, batch, seq_len + decode_steps, seed)
    # an interpreted backend runs in a worker process, started now so that its imports overlap the capture
    worker = Worker() if any(simulated(s) for s in backends) else None
    try:
        return _diff(model, backends, ids, name, worker, seq_len=seq_len, batch=batch, decode_steps=decode_steps,
                     capture_len=capture_len, passes=passes, out_root=out_root, bisect=bisect, say=say,
                     keep=keep, force=force, captured=captured, timing=timing, compute=compute,
                     greedy_tokens=greedy_tokens, state_dtype=state_dtype, stress=stress)
    finally:
        if worker is not None:
            worker.close(kill=isinstance(sys.exc_info()[1], KeyboardInterrupt))


def _diff(model, backends: list[str], ids: torch.Tensor, name: str, worker, *, seq_len: int, batch: int,
          decode_steps: int, capture_len: int, passes, out_root, bisect: bool, say, keep: bool, force: bool,
          captured, timing: bool, compute: str | None, greedy_tokens: int, state_dtype: str | None,
          stress: str | None) -> DiffReport:
    # what the check runs is prefill and decode; artifacts that are kept get every entry
    entries = ZOO_ENTRIES if out_root is not None or keep else ("prefill", "decode")
    if captured is None:
        say(f"capturing {name}")
        captured = capture_entries(model, (ids[:, :capture_len],), entries=entries)
    else:  # captured from a model of this structure: this model's weights in copies of them
        captured = rebind_weights({k: g for k, g in captured.items() if k in entries or "forward" in captured}, model)
    if compute is None and low_precision(model):
        compute = "f32"
    if compute == "bf16":
        say("measuring the BF16 policy against fp32 compute")
        from .precision_check import compare_policies

        yardstick = bf16_policy(model)
        policy = compare_policies(model, ids[:, :seq_len], greedy_tokens, policy=yardstick)
        ref = yardstick  # the eager policy runs on each backend's routing (_policy_eager)
    else:  # run while the first artifacts build
        yardstick, ref = fp32_copy(model) if compute == "f32" else model, None
    temporary = out_root is None
    root = Path(tempfile.mkdtemp(prefix="k3c-diff-")) if temporary else Path(out_root)
    report = DiffReport(name, {"batch": batch, "prefill_len": seq_len, "decode_steps": decode_steps,
                               "capture_len": capture_len}, {}, 0.0, stress, compute, state_dtype=state_dtype)
    report.policy = policy if compute == "bf16" else None
    # the artifacts are built one after another in a thread while this one checks the ones
    # built already: what overlaps is the native part of a build (TVM's LLVM, onnx's writer)
    def built(spec: str, b: Built) -> bool:  # in the build thread: hand an interpreted backend to the worker
        if worker is None or not simulated(spec):
            return False
        worker.submit(spec, b.out_dir, ids, seq_len, decode_steps, Names.of(b.graphs))
        return True  # it loads there: this process never runs it

    builds = Builds(backends, captured, passes, root, force, compute, state_dtype, built)
    try:
        builds.import_native()  # here, while the build thread builds the others (TVM's: 2 s)
        if ref is None:
            ref = _eager(yardstick, ids, seq_len, decode_steps, state_dtype)
        checked, runners, in_worker = {}, {}, []
        for spec in builds.finished():  # in the order the builds finish; the worker's runs last
            if worker is not None and simulated(spec):
                in_worker.append(spec)
                continue
            say(f"{spec}: running and checking")
            checked[spec], runners[spec] = _diff_backend(spec, builds.result(spec), ids, seq_len, decode_steps,
                                                         ref, bisect, keep, say, compute)
        for spec in in_worker:
            say(f"{spec}: checking its runs in the worker process")
            checked[spec], runners[spec] = _diff_backend(spec, builds.result(spec), ids, seq_len, decode_steps,
                                                         ref, bisect, keep, say, compute, worker.result)
        report.backends.update((spec, checked[spec]) for spec in backends)
        builds.join()
        if timing:  # warm prefills, one at a time, once every build has finished
            report.eager_prefill_seconds = _seconds(model.prefill, ids[:, :seq_len])
            for spec, runner in runners.items():
                if runner is not None and not simulated(spec):
                    report.backends[spec].prefill_seconds = _seconds(runner.run, "prefill", ids[:, :seq_len])
    finally:
        # interrupted (Ctrl-C, SIGTERM): do not wait for a build in progress; remove what it began
        builds.join(wait=not isinstance(sys.exc_info()[1], KeyboardInterrupt))
        if temporary and not keep:
            shutil.rmtree(root, ignore_errors=True)
            for b in report.backends.values():
                b.artifact = ""
    return report


def _seconds(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def _diff_backend(spec: str, built: Built, ids, seq_len: int, decode_steps: int, ref, bisect: bool, keep: bool,
                  say, compute: str | None, runs=None) -> tuple[BackendDiff, object]:
    """The check of one built backend, and its runner (None when it failed to build or run).
    `runs`: where its Runs come from when not run here (Worker.result)."""
    d = BackendDiff(spec, artifact=str(built.out_dir))
    be, graphs, runner = built.be, built.graphs, built.runner
    try:
        if built.error is not None:
            raise built.error
        d.compile_seconds = built.seconds
        names = Names.of(graphs)
        # the first run also starts the runtime up
        got = runs(spec) if runs is not None else run_artifact(runner, ids, seq_len, decode_steps, names)
    except UsageError:
        raise
    except Exception as e:  # a backend that cannot compile the model is a failed backend
        d.error = f"{type(e).__name__}: {e}"
        return d, None
    logits, state = got.prefill[0], dict(zip(names.prefill_outputs[1:], got.prefill[1:]))
    taken = _pop_routing(state)  # compute="bf16": the routing the backend took
    prefill_state, steps, d.error = dict(state), [], got.error
    for outs in got.steps:
        steps.append(outs[0])
        state = dict(zip(names.decode_outputs[1:], outs[1:]))
        taken += _pop_routing(state)
    if compute == "bf16":
        if d.error:
            return d, None
        try:
            if getattr(be, "gemm_io", None) == "bf16":  # its GEMMs return BF16 (passes/bf16_reads.py)
                ref = with_bf16_outputs(ref)
            ref, d.routing = _policy_eager(ref, ids, seq_len, decode_steps, taken)
        except ValueError as e:  # the backend's graph routes otherwise than eager (a top-k fused away)
            d.error = f"routing: {e}"
            return d, None
    d.add("prefill/logits", logits, ref.prefill[0], ref.tol["prefill/logits"], ref.noise["prefill/logits"])
    for k, v in prefill_state.items():
        d.add(f"prefill/{k}", v, ref.prefill[1][k], ref.tol[f"prefill/{k}"], ref.noise[f"prefill/{k}"])
    if d.error:
        return d, None
    for i, lg in enumerate(steps):
        d.add(f"decode{i}/logits", lg, ref.steps[i], ref.tol[f"decode{i}/logits"], ref.noise[f"decode{i}/logits"])
    for k, v in state.items():
        d.add(f"final/{k}", v, ref.final[k], ref.tol[f"final/{k}"], ref.noise[f"final/{k}"])
    d.ok = all(t.ok for t in d.tensors) and (d.routing is None or d.routing["ok"])
    if not d.ok and bisect:
        say(f"{spec}: off; looking for the first node that is off on correct inputs")
        work = Path(tempfile.mkdtemp(prefix=f"k3c-bisect-{built.out_dir.name}-"))
        try:
            d.first_bad_node = first_divergent_node(be, graphs["prefill"], [ids[:, :seq_len]], work)
        except Exception as e:
            d.first_bad_node = {"index": -1, "op": "?", "value": "?", "loc": "?",
                                "how": f"bisection failed: {one_line(f'{type(e).__name__}: {e}')}"}
        finally:
            if not keep:
                shutil.rmtree(work, ignore_errors=True)
    return d, runner


def write_json(report: DiffReport, path: str | Path) -> None:
    Path(path).write_text(json.dumps(report.to_json(), indent=2) + "\n")
