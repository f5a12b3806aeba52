"""Differential testing: the same seeded inputs through eager PyTorch and each backend.

Prefill at a length several chunks beyond the one captured, then a decode loop that feeds
each backend its own state. Every output and state tensor is compared under the tolerance
table of k3c.numerics. When a backend is off, `bisect` names the first IR node whose output
differs, by compiling growing prefixes of the graph for that backend and comparing them with
the interpreter (as torch.onnx.verification compares intermediates).
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from . import backends as backends_mod
from .compiler import capture_entries, prepare
from .ir import Graph, Node, interpret
from .ir.extract import extract
from .numerics import TOLERANCES, Tolerance, compare


@dataclass
class TensorDiff:
    name: str
    max_abs_err: float
    rel_rms_err: float
    ok: bool


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

    def add(self, name: str, actual: torch.Tensor, expected: torch.Tensor) -> None:
        c = compare(actual, expected)
        self.tensors.append(TensorDiff(name, c.max_abs_err, c.rel_rms_err, c.ok))
        self.max_abs_err = max(self.max_abs_err, c.max_abs_err)
        self.rel_rms_err = max(self.rel_rms_err, c.rel_rms_err)


@dataclass
class DiffReport:
    model: str
    shapes: dict
    backends: dict[str, BackendDiff]
    eager_prefill_seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(b.ok for b in self.backends.values())

    def to_json(self) -> dict:
        return {"model": self.model, "shapes": self.shapes, "ok": self.ok,
                "backends": {k: asdict(v) for k, v in self.backends.items()}}

    def table(self, per_tensor: bool = False) -> str:
        rows = [("backend", "ok", "max_abs_err", "rel_rms_err", "compile s", "first bad node")]
        for b in self.backends.values():
            bad = ""
            if b.error:
                bad = b.error.splitlines()[0][:70]
            elif b.first_bad_node:
                bad = f"%{b.first_bad_node['value']} = {b.first_bad_node['op']} at {b.first_bad_node['loc']}"
            rows.append((b.backend, "yes" if b.ok else "NO", f"{b.max_abs_err:.2e}", f"{b.rel_rms_err:.2e}",
                         f"{b.compile_seconds:.1f}", bad))
            if per_tensor:
                rows.extend(("  " + t.name, "yes" if t.ok else "NO", f"{t.max_abs_err:.2e}",
                             f"{t.rel_rms_err:.2e}", "", "") for t in b.tensors)
        return format_table(rows)


def format_table(rows: list[tuple]) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def seeded_ids(vocab: int, B: int, T: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def diff(model: torch.nn.Module, backends: list[str], *, seq_len: int = 130, batch: int = 2,
         decode_steps: int = 8, capture_len: int = 16, passes: str | list[str] = "default", seed: int = 0,
         out_root: str | Path | None = None, bisect: bool = True, progress=None) -> DiffReport:
    """Compare each backend with eager `model` on prefill(seq_len) and `decode_steps` decode steps."""
    say = progress or (lambda msg: None)
    vocab = model.config.vocab_size
    ids = seeded_ids(vocab, batch, seq_len + decode_steps, seed)
    name = getattr(model, "name", type(model).__name__)
    say(f"capturing {name}")
    captured = capture_entries(model, (ids[:, :capture_len],))
    ref_logits, ref_state = model.prefill(ids[:, :seq_len])
    t0 = time.perf_counter()  # the speed column compares warm runs: a second prefill
    model.prefill(ids[:, :seq_len])
    eager_s = time.perf_counter() - t0
    ref_steps, st = [], ref_state
    for i in range(decode_steps):
        lg, st = model.decode(ids[:, seq_len + i: seq_len + i + 1], st)
        ref_steps.append(lg)
    ref_final = st
    out_root = Path(out_root) if out_root else Path(tempfile.mkdtemp(prefix="k3c-diff-"))
    report = DiffReport(name, {"batch": batch, "prefill_len": seq_len, "decode_steps": decode_steps,
                               "capture_len": capture_len}, {}, eager_s)
    for be_name in backends:
        say(f"{be_name}: lowering and running")
        report.backends[be_name] = _diff_backend(be_name, captured, passes, ids, seq_len, decode_steps, ref_logits,
                                                 ref_state, ref_steps, ref_final, out_root / be_name, bisect, say)
    return report


def _diff_backend(be_name, captured, passes, ids, seq_len, decode_steps, ref_logits, ref_state, ref_steps,
                  ref_final, out_dir: Path, bisect: bool, say) -> BackendDiff:
    d = BackendDiff(be_name, artifact=str(out_dir))
    try:
        be = backends_mod.get(be_name)
        graphs = prepare(captured, be, passes)  # the pipeline as this backend runs it, legalized
        t0 = time.perf_counter()
        be.lower(graphs, out_dir)
        runner = be.load(out_dir)
        d.compile_seconds = time.perf_counter() - t0
        outs = runner.run("prefill", ids[:, :seq_len])  # the first run also starts the runtime up
        t0 = time.perf_counter()
        runner.run("prefill", ids[:, :seq_len])
        d.prefill_seconds = time.perf_counter() - t0
    except Exception as e:  # a backend that cannot compile the model is a failed backend
        d.error = f"{type(e).__name__}: {e}"
        return d
    names = [k for k, _ in graphs["prefill"].outputs]
    d.add("prefill/logits", outs[0], ref_logits)
    state = dict(zip(names[1:], outs[1:]))
    for k, v in state.items():
        d.add(f"prefill/{k}", v, ref_state[k])
    dec = graphs["decode"]
    try:
        for i in range(decode_steps):
            outs = runner.run("decode", ids[:, seq_len + i: seq_len + i + 1], *[state[k] for k in dec.inputs[1:]])
            d.add(f"decode{i}/logits", outs[0], ref_steps[i])
            state = dict(zip([k for k, _ in dec.outputs[1:]], outs[1:]))
    except Exception as e:
        d.error = f"decode: {type(e).__name__}: {e}"
        return d
    for k, v in state.items():
        d.add(f"final/{k}", v, ref_final[k])
    d.ok = all(t.ok for t in d.tensors)
    if not d.ok and bisect:
        say(f"{be_name}: off; bisecting the prefill graph")
        bad = first_divergent_node(be, graphs["prefill"], [ids[:, :seq_len]], out_dir / "bisect")
        d.first_bad_node = bad
    return d


def first_divergent_node(backend, graph: Graph, inputs: list[torch.Tensor], workdir: Path,
                         tolerance: dict[torch.dtype, Tolerance] | None = None) -> dict | None:
    """The first node (in graph order) whose outputs, computed by `backend` on a prefix of the
    graph, differ from the interpreter's beyond tolerance; None when all agree.

    Binary search over node positions: the probe for position i is the prefix of the graph
    up to node i with every floating-point value it computes as an output, so "some node up to
    i is off" is monotone in i even when the graph branches.
    """
    tolerance = tolerance or TOLERANCES
    reference: dict[str, torch.Tensor] = {}

    def observe(node: Node, outs):
        reference.update(zip(node.outputs, outs))

    interpret(graph, *inputs, observe=observe)
    floats = [i for i, n in enumerate(graph.nodes)
              if n.op not in ("const", "full", "arange") and graph.types[n.outputs[0]].dtype.startswith(("f", "bf"))]

    def off(value: str, actual: torch.Tensor) -> bool:
        tol = tolerance.get(actual.dtype)
        c = compare(actual, reference[value])
        return tol is not None and not (c.finite and c.rel_rms_err <= tol.rel_rms)

    def first_bad_in_prefix(i: int) -> str | None:
        values = [o for n in graph.nodes[: i + 1] for o in n.outputs if o in reference
                  and graph.types[o].dtype.startswith(("f", "bf"))]
        d = workdir / f"upto{i}"
        backend.lower({"probe": extract(graph, values, name="probe")}, d)
        outs = backend.load(d).run("probe", *inputs)
        return next((v for v, o in zip(values, outs) if off(v, o)), None)

    if not floats or first_bad_in_prefix(floats[-1]) is None:
        return None
    lo, hi = 0, len(floats) - 1  # invariant: the prefix up to floats[hi] has an off value
    while lo < hi:
        mid = (lo + hi) // 2
        if first_bad_in_prefix(floats[mid]) is not None:
            hi = mid
        else:
            lo = mid + 1
    node = graph.nodes[floats[hi]]
    return {"index": floats[hi], "op": node.op, "value": node.outputs[0], "loc": node.loc or "?"}


def write_json(report: DiffReport, path: str | Path) -> None:
    Path(path).write_text(json.dumps(report.to_json(), indent=2) + "\n")
