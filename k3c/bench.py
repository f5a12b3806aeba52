"""Benchmarks measured side by side in one run: eager, torch.compile and each backend.

Prefill at one length and a decode loop, each timed after a warm-up as the median of a few
repeats. Ratios are speedups over eager (> 1 is faster). Not a test: nothing is asserted.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .backends import artifact
from .compiler import capture_entries, prepare
from .diff import backend_for, format_table, seeded_ids
from .errors import UsageError


class Progress:
    """A one-line progress display on stderr (plain lines when stderr is not a terminal)."""

    def __init__(self, total: int, stream=None):
        self.total, self.done, self.stream = total, 0, stream or sys.stderr
        self.tty = self.stream.isatty()

    def step(self, what: str) -> None:
        self.done += 1
        width = 24
        fill = int(width * self.done / max(self.total, 1))
        line = f"[{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total} {what}"
        self.stream.write(("\r" + line.ljust(100)) if self.tty else line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")


def machine() -> dict:
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
            "torch": torch.__version__, "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None}


SETTLE_S = 0.05
SETTLE_MAX_S = 2.0
_TICK_S = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)


def _other_threads_cpu() -> int | None:
    """CPU clock ticks used so far by this process's threads other than the caller (Linux
    /proc); None where that cannot be read."""
    me = str(threading.get_native_id())
    total = 0
    try:
        for tid in os.listdir("/proc/self/task"):
            if tid == me:
                continue
            try:
                with open(f"/proc/self/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:  # the thread ended
                continue
            total += int(fields[11]) + int(fields[12])  # utime + stime
    except OSError:
        return None
    return total


def settle(seconds: float = SETTLE_S) -> None:
    """Wait before timing the next runner of a side-by-side run, until the worker threads of
    the runners before it have stopped spinning: at least `seconds`, then until no other
    thread of this process has used the CPU for three clock ticks in a row (at most
    SETTLE_MAX_S). Thread pools keep spinning after a call, and on a 2-core machine they take
    the cores from whatever runs next: an onnxruntime GEMM timed straight after a torch one
    took 23.4 ms, 16.0 ms after a 10 ms pause, 17.8 ms with no torch work before it (1024 x
    512 x 3072, side by side); TVM's pool spins for about 200 ms after each call (a 1 s
    sleep after a KDA kernel: 180 to 210 ms of CPU in its worker). Where /proc cannot be
    read it sleeps `seconds`."""
    time.sleep(seconds)
    last = _other_threads_cpu()
    if last is None:
        return
    quiet, deadline = 0, time.monotonic() + SETTLE_MAX_S
    while quiet < 3 and time.monotonic() < deadline:
        time.sleep(_TICK_S)
        now = _other_threads_cpu()
        quiet = quiet + 1 if now == last else 0
        last = now


def timed_turn(fn) -> float:
    """Seconds of one call of `fn` in a side-by-side run, where runners take turns: settle
    (the last runner's threads stop spinning), one untimed call, then the timed one. The
    untimed call pays for what the runner before left behind (its heap trimmed to the OS,
    so this one's outputs page-fault again; caches full of its weights): right after a TVM
    call and a settle, a torch `Linear(512, 3072)` on [1, 1024, 512] took 31 to 48 ms with
    3072 page faults, against 23 to 27 ms before any TVM call and 2 s after one."""
    settle()
    fn()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _times(fn, warmup: int, repeats: int) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def timeit(fn, warmup: int, repeats: int) -> float:
    """The median seconds of `repeats` calls after `warmup` untimed ones."""
    return statistics.median(_times(fn, warmup, repeats))


def best_of(fn, repeats: int, warmup: int = 0) -> float:
    """The fastest of `repeats` timed calls (a shared CPU varies by 20% and more)."""
    return min(_times(fn, warmup, repeats))


@dataclass
class BenchRow:
    name: str
    prefill_seconds: float | None = None
    decode_seconds: float | None = None  # the whole loop of decode_steps
    compile_seconds: float | None = None
    ratio_vs_eager: float | None = None  # prefill speedup over eager
    decode_ratio_vs_eager: float | None = None
    seconds: float | None = None  # prefill + decode loop
    error: str | None = None


@dataclass
class BenchReport:
    model: str
    shapes: dict
    machine: dict
    rows: dict[str, BenchRow] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"model": self.model, "shapes": self.shapes, "machine": self.machine,
                "backends": {k: asdict(v) for k, v in self.rows.items()}}

    def table(self) -> str:
        def f(x, unit=""):
            return "-" if x is None else f"{x:.3f}{unit}" if unit == "s" else f"{x:.2f}x"

        rows = [("runner", "prefill s", "decode loop s", "prefill vs eager", "decode vs eager", "compile s")]
        for r in self.rows.values():
            if r.error:
                rows.append((r.name, "error: " + r.error.splitlines()[0][:60], "", "", "", ""))
                continue
            rows.append((r.name, f(r.prefill_seconds, "s"), f(r.decode_seconds, "s"), f(r.ratio_vs_eager),
                         f(r.decode_ratio_vs_eager), "-" if r.compile_seconds is None else f"{r.compile_seconds:.1f}"))
        return format_table(rows)


@torch.no_grad()
def bench(model: torch.nn.Module, backends: list[str], *, seq_len: int = 1024, decode_steps: int = 64,
          batch: int = 1, warmup: int = 1, repeats: int = 3, torch_compile: bool = True,
          passes: str | list[str] = "default", out_root: str | Path | None = None,
          progress: bool = True, keep: bool = False, force: bool = False,
          compute: str | None = None) -> BenchReport:
    """Time eager, torch.compile and each backend (NAME or onnx:FLAVOUR). Without `out_root` the
    artifacts go to a temporary folder that is removed at the end unless `keep`. `compute`: the
    backends' compute policy for a BF16 model (k3c.compile's; None: each backend's own)."""
    from .resources import check_fits, state_bytes

    if seq_len < 1 or batch < 1 or decode_steps < 0:
        raise UsageError(f"seq_len {seq_len}, batch {batch} must be >= 1 and decode_steps {decode_steps} >= 0")
    tokens = seq_len + decode_steps  # before anything is allocated: one prefill's logits and the state
    check_fits(f"bench: batch {batch} x {tokens} tokens of {model.config.vocab_size} logits and their state",
               batch * seq_len * model.config.vocab_size * 4 + state_bytes(model, batch, tokens)[0], UsageError)
    temporary = out_root is None
    root = Path(tempfile.mkdtemp(prefix="k3c-bench-")) if temporary else Path(out_root)
    try:
        return _bench(model, backends, seq_len, decode_steps, batch, warmup, repeats, torch_compile, passes, root,
                      progress, force, compute)
    finally:
        if temporary and not keep:
            shutil.rmtree(root, ignore_errors=True)


def _bench(model, backends, seq_len, decode_steps, batch, warmup, repeats, torch_compile, passes, out_root: Path,
           progress: bool, force: bool, compute: str | None = None) -> BenchReport:
    name = getattr(model, "name", type(model).__name__)
    ids = seeded_ids(model.config.vocab_size, batch, seq_len + decode_steps)
    prompt, steps = ids[:, :seq_len], [ids[:, seq_len + i: seq_len + i + 1] for i in range(decode_steps)]
    report = BenchReport(name, {"batch": batch, "prefill_len": seq_len, "decode_steps": decode_steps,
                                "warmup": warmup, "repeats": repeats, "compute": compute}, machine())
    bar = Progress(2 + int(torch_compile) + 2 * len(backends)) if progress else None
    tick = bar.step if bar else (lambda what: None)

    def run_eager(prefill, decode):
        def pre():
            return prefill(prompt)

        _, state = pre()

        def loop():
            st = state
            for s in steps:
                _, st = decode(s, st)

        return timeit(pre, warmup, repeats), timeit(loop, warmup, repeats)

    eager = BenchRow("eager")
    eager.prefill_seconds, eager.decode_seconds = run_eager(model.prefill, model.decode)
    tick("eager")
    report.rows["eager"] = eager
    if torch_compile:
        row = BenchRow("torch.compile")
        try:
            t0 = time.perf_counter()
            # each at its best (benchmarks/bench_torch_compile.py): the prefill runs at one length,
            # which static shapes specialise (k3-tiny T = 256: 2.3x eager, dynamic 0.84x); a decode
            # step grows the cache, a new shape each step, so decode is dynamic. Unless a dynamic
            # prefill was compiled first, dynamo specialises decode's first graph on the cache
            # length anyway and makes it dynamic at the next length: that second compile falls in
            # the warm-up, not in the timed loop
            cpre = torch.compile(model.prefill, dynamic=False)
            cdec = torch.compile(model.decode, dynamic=True)
            _, st = cpre(prompt)
            cdec(steps[0], st)
            row.compile_seconds = time.perf_counter() - t0
            row.prefill_seconds, row.decode_seconds = run_eager(cpre, cdec)
        except Exception as e:
            row.error = f"{type(e).__name__}: {e}"
        report.rows["torch.compile"] = row
        tick("torch.compile")
    captured = capture_entries(model, (prompt[:, :16],))
    tick("capture")
    for be_name in backends:
        row = BenchRow(be_name)
        try:
            be = backend_for(be_name)
            t0 = time.perf_counter()
            graphs = prepare(captured, be, passes, None, compute)  # the pipeline as this backend runs it
            out = out_root / be_name.replace(":", "-")
            artifact.write(be, graphs, out, force=force)
            runner = be.load(out)
            row.compile_seconds = time.perf_counter() - t0
            tick(f"{be_name}: compiled")

            pre, dstep = _runner_entries(runner)

            # the decode graph's state inputs are in the prefill graph's output order
            assert [k for k, _ in graphs["prefill"].outputs[1:]] == graphs["decode"].inputs[1:]
            row.prefill_seconds, row.decode_seconds = run_eager(pre, dstep)
        except UsageError:  # what the user asked for cannot be done at all (e.g. --out holds something else)
            raise
        except Exception as e:
            row.error = f"{type(e).__name__}: {e}"
            tick(f"{be_name}: failed")
        else:
            tick(f"{be_name}: timed")
        report.rows[be_name] = row
    if bar:
        bar.close()
    for r in report.rows.values():
        if r.prefill_seconds and eager.prefill_seconds:
            r.ratio_vs_eager = eager.prefill_seconds / r.prefill_seconds
        if r.decode_seconds and eager.decode_seconds:
            r.decode_ratio_vs_eager = eager.decode_seconds / r.decode_seconds
        if r.prefill_seconds is not None and r.decode_seconds is not None:
            r.seconds = r.prefill_seconds + r.decode_seconds
    return report


def _runner_entries(runner):
    """prefill(ids) -> (logits, state list) and decode(ids, state list) over a backend runner."""

    def prefill(ids):
        outs = runner.run("prefill", ids)
        return outs[0], outs[1:]

    def decode(ids, state):
        outs = runner.run("decode", ids, *state)
        return outs[0], outs[1:]

    return prefill, decode


def write_json(report: BenchReport, path: str | Path) -> None:
    Path(path).write_text(json.dumps(report.to_json(), indent=2) + "\n")


def plot(report: BenchReport, path: str | Path) -> None:
    """Bars of prefill and decode speedup over eager per runner, saved as PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("--plot needs matplotlib: pip install 'k3c[plot]'") from e
    rows = [r for r in report.rows.values() if r.ratio_vs_eager is not None]
    names = [r.name for r in rows]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(1.6 * len(rows) + 2, 3.6))
    ax.bar([i - 0.2 for i in x], [r.ratio_vs_eager for r in rows], width=0.4, label="prefill")
    ax.bar([i + 0.2 for i in x], [r.decode_ratio_vs_eager or 0 for r in rows], width=0.4, label="decode")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(list(x), names)
    ax.set_ylabel("speedup over eager")
    s = report.shapes
    ax.set_title(f"{report.model}: prefill T={s['prefill_len']}, {s['decode_steps']} decode steps, B={s['batch']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
