"""What `k3c diff` runs on each artifact, in this process or in a worker process.

A check runs the prefill and then decode steps, each fed the state the artifact returned
(`run_artifact`). Most backends run it here. A backend that runs under an interpreter
(Triton on a machine without a CUDA GPU) holds the GIL for tens of seconds, so its runs go
to a worker process (`Worker`, `python -m k3c.diff_runs`), started before the capture so
that its imports overlap it; it loads the artifact from the folder it was written to, and
the tensors travel through files in that folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch


@dataclass
class Runs:
    """The outputs of the prefill and of each decode step, as the artifact returned them;
    `error` says why the decode loop stopped early (None: it ran every step)."""

    prefill: list[torch.Tensor]
    steps: list[list[torch.Tensor]] = field(default_factory=list)
    error: str | None = None


@dataclass
class Names:
    """The value names the decode loop needs: the prefill's outputs, decode's inputs and outputs."""

    prefill_outputs: list[str]
    decode_inputs: list[str]
    decode_outputs: list[str]

    @classmethod
    def of(cls, graphs: dict) -> Names:
        return cls([k for k, _ in graphs["prefill"].outputs], list(graphs["decode"].inputs),
                   [k for k, _ in graphs["decode"].outputs])


def run_artifact(runner, ids: torch.Tensor, seq_len: int, decode_steps: int, names: Names) -> Runs:
    """Prefill ids[:, :seq_len], then `decode_steps` steps on the following ids, each fed the
    state the previous call returned. An error of the prefill is raised; one of the decode
    loop ends it, with the reason in `error`."""
    outs = runner.run("prefill", ids[:, :seq_len])
    runs = Runs(list(outs))
    state = dict(zip(names.prefill_outputs[1:], outs[1:]))
    try:
        for i in range(decode_steps):
            step = ids[:, seq_len + i: seq_len + i + 1]
            outs = runner.run("decode", step, *[state[k] for k in names.decode_inputs[1:]])
            runs.steps.append(list(outs))
            state = dict(zip(names.decode_outputs[1:], outs[1:]))
    except Exception as e:
        runs.error = f"decode: {type(e).__name__}: {e}"
    return runs


# The worker's numpy (OpenBLAS) and torch (OpenMP) on one thread each: the interpreter's
# operations are on tiles, too small for a second thread to pay, and a pool's threads spin
# between them on the core the builds and checks of the diff need. On a 2-core Zen 4 the main
# job took 5 to 8 CPU-s less, 1.5 to 3 s of wall time (runs alternated by hand: BENCHMARKS.md).
ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


class Worker:
    """A worker process that runs artifacts: `submit` a written artifact, `result` its Runs.
    Jobs run one at a time in the order submitted. `close` ends the process (always call it)."""

    def __init__(self):
        self._log = tempfile.TemporaryFile("w+")  # what the worker says on stderr, read if it dies
        env = {**os.environ, **ONE_THREAD}
        self._proc = subprocess.Popen([sys.executable, "-m", "k3c.diff_runs"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=self._log, text=True, env=env)
        self._lock = threading.Lock()

    def submit(self, spec: str, out_dir: Path, ids: torch.Tensor, seq_len: int, decode_steps: int,
               names: Names) -> None:
        job = out_dir / "diff-job.pt"
        torch.save({"ids": ids, "names": names.__dict__}, job)
        line = json.dumps({"spec": spec, "dir": str(out_dir), "job": str(job), "seq_len": seq_len,
                           "decode_steps": decode_steps})
        with self._lock:
            self._proc.stdin.write(line + "\n")
            self._proc.stdin.flush()

    def result(self, spec: str) -> Runs:
        """The Runs of `spec` (jobs answer in the order submitted); a prefill error or a dead
        worker is raised as a RuntimeError with its reason."""
        reply = self._proc.stdout.readline()
        if not reply:
            self._proc.wait()
            self._log.seek(0)
            tail = " ".join(self._log.read()[-2000:].split())
            raise RuntimeError(f"the worker running {spec} ended (exit {self._proc.returncode}): {tail}")
        answer = json.loads(reply)
        if answer["spec"] != spec:
            raise RuntimeError(f"the worker answered for {answer['spec']}, asked for {spec}")
        if answer.get("error"):
            raise RuntimeError(answer["error"])
        path = Path(answer["runs"])
        runs = Runs(**torch.load(path))
        path.unlink()
        return runs

    def close(self, kill: bool = False) -> None:
        """End the process: at once with `kill`, else once its job in progress is done."""
        if not kill:
            try:
                self._proc.stdin.close()  # its loop ends at the end of its input
                self._proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                kill = True
        if kill and self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        for stream in (self._proc.stdin, self._proc.stdout, self._log):
            try:
                stream.close()
            except OSError:  # a pipe whose reader is gone
                pass


def _serve() -> None:
    """The worker's loop: one JSON job a line on stdin, one JSON answer a line on stdout."""
    from .diff_builds import backend_for

    answers = os.fdopen(os.dup(1), "w")  # the answers' own channel: whatever else is printed goes to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    for line in sys.stdin:
        job = json.loads(line)
        answer = {"spec": job["spec"]}
        try:
            inputs = torch.load(job["job"])
            Path(job["job"]).unlink()
            runner = backend_for(job["spec"]).load(Path(job["dir"]))
            runs = run_artifact(runner, inputs["ids"], job["seq_len"], job["decode_steps"], Names(**inputs["names"]))
            path = Path(job["dir"]) / "diff-runs.pt"
            torch.save(runs.__dict__, path)
            answer["runs"] = str(path)
        except Exception as e:
            answer["error"] = f"{type(e).__name__}: {e}"
        print(json.dumps(answer), file=answers, flush=True)


if __name__ == "__main__":
    _serve()
    # every answer is written and flushed: end without tearing down torch and triton (about a
    # second the diff would wait for in Worker.close)
    sys.stderr.flush()
    os._exit(0)
