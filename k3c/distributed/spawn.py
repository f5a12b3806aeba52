"""Spawn the rank processes of a mesh run on this machine (gloo on CPU), with timeouts.

    results = spawn(mesh_dir, job, world=4, timeout_s=120)   # one dict per rank (launch.py)

A free port for the rendezvous; every rank bounded by K3C_TIMEOUT_S on init and each wait; the
whole run by `timeout_s`. A rank that exits with an error, dies by a signal or outlives the run
is a RankError naming it (with the tail of its output) as soon as it is seen: a rank killed
by a signal is named before the ranks that failed because it went away. Every process is
killed and reaped and the folder removed before it returns, on an interrupt too (Ctrl-C, or
SIGTERM as the CLI turns it into one); on Linux a rank also dies with its parent, so a
parent killed outright leaves no rank behind.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from .simulate import RankError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_HELD = {signal.SIGTERM, signal.SIGINT}  # held back while the ranks are forked


def _rank_setup(mask: set) -> None:
    """In the child before exec: the parent's signal mask as it was before the fork, and
    SIGKILL when the parent exits (Linux's PR_SET_PDEATHSIG)."""
    import ctypes

    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def spawn(mesh_dir: str | Path, job: dict, world: int, timeout_s: float = 120.0,
          threads: int = 1, started: Callable[[list[subprocess.Popen]], None] | None = None) -> list[dict]:
    """One process per rank on `job`; the results by rank. `started(procs)` (a supervisor's
    hook) sees the rank processes once they all run."""
    work = Path(tempfile.mkdtemp(prefix="k3c-ranks-"))
    job_file = work / "job.pt"
    torch.save(job, job_file)
    port = free_port()
    procs: list[subprocess.Popen] = []
    logs = []
    # a SIGTERM or Ctrl-C while a rank is forked would be raised inside fork's own handlers,
    # which swallow it: hold both back until every rank runs, then they act here
    held = sys.platform == "linux"
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD) if held else set()
    try:
        for r in range(world):
            env = {**os.environ, "RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r),
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                   "K3C_TIMEOUT_S": str(max(10.0, timeout_s / 2)), "OMP_NUM_THREADS": str(threads)}
            log = open(work / f"rank{r}.log", "w+")
            logs.append(log)
            procs.append(subprocess.Popen([sys.executable, "-m", "k3c.distributed.launch", str(mesh_dir),
                                           str(job_file), str(work)], env=env, stdout=log,
                                          stderr=subprocess.STDOUT,
                                          preexec_fn=functools.partial(_rank_setup, mask) if held else None))
        if held:
            held = False
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        if started is not None:
            started(list(procs))
        deadline = time.monotonic() + timeout_s
        # poll every rank each round: any() would stop at the first one running, and a rank
        # that died behind it would be seen only when that one ends (at its own timeout)
        while [p.poll() for p in procs].count(None):
            _check_failed(procs, logs)
            if time.monotonic() > deadline:
                hung = [r for r, p in enumerate(procs) if p.poll() is None]
                raise RankError(f"rank(s) {hung} did not finish within {timeout_s:.0f} s (killed)")
            time.sleep(0.05)
        _check_failed(procs, logs)
        return [torch.load(work / f"rank{r}.pt") for r in range(world)]
    finally:
        if held:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.wait()
        for log in logs:
            log.close()
        shutil.rmtree(work, ignore_errors=True)  # the job, the logs (their tail is in any error) and results


def _check_failed(procs: list[subprocess.Popen], logs: list) -> None:
    """A RankError for the rank that failed first as far as one look can tell: one killed by a
    signal before one that exited with an error (the others' errors follow from its death)."""
    failed = [r for r, p in enumerate(procs) if p.returncode not in (None, 0)]
    if not failed:
        return
    killed = [r for r in failed if procs[r].returncode < 0]
    r = (killed or failed)[0]
    code = procs[r].returncode
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
        raise RankError(f"rank {r} was killed by {name}: {_tail(logs[r])}")
    raise RankError(f"rank {r} exited with status {code}: {_tail(logs[r])}")


def _tail(log, n: int = 600) -> str:
    log.flush()
    log.seek(0)
    text = log.read().strip()
    return text[-n:].replace("\n", " | ") or "(no output)"
