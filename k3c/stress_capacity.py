"""`k3c diff --stress garbage-capacity`: unused capacity of fixed caches never changes an output.

A serving artifact (k3c.compile(..., max_context=N)) holds every cache at N rows; a sequence
uses the rows below its position, and the rows past it hold whatever they hold: zeros never
written, or an earlier sequence's keys left in the slot. Each runner (the eager model and each
backend) runs the same calls twice: clean, and with garbage (NaN, +-inf, +-1e30) written into
every cache row past each sequence's position before each call, and with other token ids in
the padding of the ragged prompts. The calls: a ragged prefill, decode steps, and a ragged
extend (one sequence sits it out). Every real logit row, every used cache row and every other
state tensor of the garbage run must equal the clean run's (bit for bit, or within the fp32
row: a backend may sum in another order when the two runs' shapes differ nowhere, so this is
slack it never needs). 0 * NaN in a masked matmul, or a softmax over masked NaN scores, fails.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch

from .errors import UsageError
from .numerics import TOLERANCES

GARBAGE = (float("nan"), float("inf"), float("-inf"), 1e30, -1e30)


def cache_axes(model) -> dict[str, int]:
    """name -> the row axis of each cache of `model`'s state (the axis that grows with length)."""
    from .models.validate import state_spec

    return {k: min(grow) for k, (_shape, grow, _dt) in state_spec(model).items() if grow}


def with_garbage(state: dict, axes: dict[str, int]) -> dict:
    """A copy of `state` whose cache rows at or past each sequence's position hold garbage."""
    pos = state["positions"]
    out = {k: v.clone() for k, v in state.items()}
    for name, axis in axes.items():
        c = out[name]
        rows = torch.arange(c.shape[axis]).view(*([1] * axis), -1, *([1] * (c.dim() - axis - 1)))
        unused = rows >= pos.view(-1, *([1] * (c.dim() - 1)))
        junk = torch.tensor(GARBAGE, dtype=c.dtype).repeat(c.numel() // len(GARBAGE) + 1)[: c.numel()].view(c.shape)
        out[name] = torch.where(unused, junk, c)
    return out


def _used(name: str, t: torch.Tensor, positions: torch.Tensor, axes: dict[str, int]) -> torch.Tensor:
    """What of a state tensor a sequence uses: a cache's rows below its position, all of any other."""
    if name not in axes:
        return t
    axis = axes[name]
    return torch.cat([t[b].narrow(axis - 1, 0, int(positions[b])).reshape(-1) for b in range(t.shape[0])])


def _real_rows(logits: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    return torch.cat([logits[b, : int(n)] for b, n in enumerate(lengths)])


def _calls(run, ids, lengths, steps, ext, ext_lengths, axes, garbage: bool) -> dict[str, torch.Tensor]:
    """The outputs that count of one run: prefill, decode steps, one extend; `garbage` writes
    garbage into unused rows before each call and other ids into the padding."""
    if garbage:  # other token ids where the prompts are padding
        pad = torch.arange(ids.shape[1])[None, :] >= lengths[:, None]
        ids = torch.where(pad, (ids * 7 + 3) % int(ids.max() + 1), ids)
        ext = torch.where(torch.arange(ext.shape[1])[None, :] >= ext_lengths[:, None], (ext + 5) % int(ext.max() + 1),
                          ext)
    out = {}
    logits, state = run.prefill(ids, lengths=lengths)
    out["prefill/logits"] = _real_rows(logits, lengths)
    for i, step in enumerate(steps):
        state = with_garbage(state, axes) if garbage else {k: v.clone() for k, v in state.items()}
        logits, state = run.decode(step, state)
        out[f"decode{i}/logits"] = logits
    state = with_garbage(state, axes) if garbage else {k: v.clone() for k, v in state.items()}
    logits, state = run.extend(ext, state, lengths=ext_lengths)
    out["extend/logits"] = _real_rows(logits, ext_lengths)
    for k, v in state.items():
        out[f"final/{k}"] = _used(k, v, state["positions"], axes)
    return out


def serving_graphs(model: torch.nn.Module, capacity: int, example: torch.Tensor) -> dict:
    """The serving entries of `model` at `capacity` rows, captured once for every backend."""
    from .compiler import capture_entries
    from .serving import with_last_entry

    return with_last_entry(capture_entries(model, (example,), max_context=capacity))


def _compiled(spec: str, graphs: dict, passes, out_dir: Path, force: bool):
    """A serving artifact of backend `spec` from the captured serving graphs, as k3c.compile makes it."""
    from .backends import artifact
    from .compiler import CompiledModel, prepare
    from .diff import backend_for
    from .serving import record_serving

    be = backend_for(spec)
    prepared = prepare(graphs, be, passes)
    artifact.write(be, prepared, out_dir, force=force)
    record_serving(out_dir, prepared)
    return CompiledModel(be.load(out_dir), prepared, out_dir, spec)


@torch.no_grad()
def garbage_capacity(model: torch.nn.Module, backends: list[str], *, seq_len: int = 12, batch: int = 2,
                     decode_steps: int = 2, capacity: int | None = None, passes="default", seed: int = 0,
                     out_root: str | Path | None = None, keep: bool = False, force: bool = False,
                     progress=None, captured: dict | None = None, eager: bool = True):
    """Run the garbage-capacity stress on the eager model (unless not `eager`) and each backend:
    a DiffReport whose rows compare each runner's garbage run with its own clean run.
    `captured`: the serving graphs of this model at `capacity` (serving_graphs), shared
    between calls."""
    from .diff import BackendDiff, DiffReport, seeded_ids
    from .generate import EagerRunner

    say = progress or (lambda msg: None)
    axes = cache_axes(model)
    if not axes:
        raise UsageError(f"stress garbage-capacity needs a model with attention caches; "
                         f"{getattr(model, 'name', type(model).__name__)} holds fixed-size states only")
    ext_len = 3
    capacity = capacity or seq_len + decode_steps + ext_len + 2  # two rows no call ever writes
    if seq_len + decode_steps + ext_len > capacity:
        raise UsageError(f"garbage-capacity: {seq_len} + {decode_steps} + {ext_len} tokens exceed capacity {capacity}")
    vocab = model.config.vocab_size
    ids = seeded_ids(vocab, batch, seq_len + decode_steps + ext_len, seed)
    lengths = torch.tensor([seq_len - 3 * (b % 2) for b in range(batch)])  # ragged: every other row shorter
    prompt, steps = ids[:, :seq_len], [ids[:, seq_len + i: seq_len + i + 1] for i in range(decode_steps)]
    ext, ext_lengths = ids[:, seq_len + decode_steps:], torch.tensor([ext_len - 2 * (b % 2) for b in range(batch)])
    ext_lengths[-1] = 0 if batch > 1 else ext_lengths[-1]  # one sequence sits the extend out
    if captured is None and backends:
        say("capturing the serving entries")
        captured = serving_graphs(model, capacity, prompt)
    report = DiffReport(getattr(model, "name", type(model).__name__),
                        {"batch": batch, "prefill_len": seq_len, "decode_steps": decode_steps, "extend_len": ext_len,
                         "capacity": capacity}, {}, stress="garbage-capacity")
    temporary = out_root is None
    root = Path(tempfile.mkdtemp(prefix="k3c-diff-")) if temporary else Path(out_root)
    tol = TOLERANCES[torch.float32]
    try:
        for spec in ["eager"] * eager + list(backends):
            say(f"{spec}: clean and garbage runs")
            d = BackendDiff(spec)
            try:
                run = EagerRunner(model, capacity) if spec == "eager" else \
                    _compiled(spec, captured, passes, root / spec.replace(":", "-"), force)
                clean = _calls(run, prompt, lengths, steps, ext, ext_lengths, axes, garbage=False)
                dirty = _calls(run, prompt, lengths, steps, ext, ext_lengths, axes, garbage=True)
            except UsageError:
                raise
            except Exception as e:  # a backend that cannot run the serving forms is a failed backend
                d.error = f"{type(e).__name__}: {e}"
                report.backends[spec] = d
                continue
            for name, c in clean.items():
                d.add(name, dirty[name], c, tol)
            d.ok = all(t.ok for t in d.tensors)
            report.backends[spec] = d
    finally:
        if temporary and not keep:
            shutil.rmtree(root, ignore_errors=True)
    return report


def run_cli(args, model: torch.nn.Module, specs: list[str]) -> int:
    """`k3c diff --stress garbage-capacity`: the table, --json, exit 1 when a runner is off."""
    import sys

    from .diff import write_json

    report = garbage_capacity(model, specs, batch=args.batch or 2, out_root=args.out, keep=args.keep, force=args.force,
                              passes=args.pipeline, progress=lambda m: print(m, file=sys.stderr))
    print(report.table(per_tensor=args.verbose))
    if args.json:
        write_json(report, args.json)
    return 0 if report.ok else 1


__all__ = ["garbage_capacity", "run_cli", "serving_graphs", "with_garbage", "cache_axes", "GARBAGE"]
