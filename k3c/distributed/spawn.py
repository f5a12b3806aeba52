"""Spawn the rank processes of a mesh run on this machine (gloo on CPU), with timeouts.

    results = spawn(mesh_dir, job, world=4, timeout_s=120)   # one dict per rank (launch.py)

A free port for the rendezvous; every rank bounded by K3C_TIMEOUT_S on init and each wait; the
whole run by `timeout_s`. A rank that exits with an error or outlives the run is a RankError
naming it (with the tail of its output), and every process is killed and its folder removed
before it returns.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from .simulate import RankError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(mesh_dir: str | Path, job: dict, world: int, timeout_s: float = 120.0,
          threads: int = 1) -> list[dict]:
    work = Path(tempfile.mkdtemp(prefix="k3c-ranks-"))
    job_file = work / "job.pt"
    torch.save(job, job_file)
    port = free_port()
    procs: list[subprocess.Popen] = []
    logs = []
    try:
        for r in range(world):
            env = {**os.environ, "RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r),
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                   "K3C_TIMEOUT_S": str(max(10.0, timeout_s / 2)), "OMP_NUM_THREADS": str(threads)}
            log = open(work / f"rank{r}.log", "w+")
            logs.append(log)
            procs.append(subprocess.Popen([sys.executable, "-m", "k3c.distributed.launch", str(mesh_dir),
                                           str(job_file), str(work)], env=env, stdout=log,
                                          stderr=subprocess.STDOUT))
        deadline = time.monotonic() + timeout_s
        while any(p.poll() is None for p in procs):
            failed = [r for r, p in enumerate(procs) if p.returncode not in (None, 0)]
            if failed:
                raise RankError(f"rank {failed[0]} exited with status {procs[failed[0]].returncode}: "
                                f"{_tail(logs[failed[0]])}")
            if time.monotonic() > deadline:
                hung = [r for r, p in enumerate(procs) if p.poll() is None]
                raise RankError(f"rank(s) {hung} did not finish within {timeout_s:.0f} s (killed)")
            time.sleep(0.05)
        failed = [r for r, p in enumerate(procs) if p.returncode != 0]
        if failed:
            raise RankError(f"rank {failed[0]} exited with status {procs[failed[0]].returncode}: "
                            f"{_tail(logs[failed[0]])}")
        return [torch.load(work / f"rank{r}.pt") for r in range(world)]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.wait()
        for log in logs:
            log.close()
        shutil.rmtree(work, ignore_errors=True)  # the job, the logs (their tail is in any error) and results


def _tail(log, n: int = 600) -> str:
    log.flush()
    log.seek(0)
    text = log.read().strip()
    return text[-n:].replace("\n", " | ") or "(no output)"
