"""Faults of a mesh run: a killed rank is named at once (not a survivor that lost it, not at the
timeout), SIGTERM to `k3c diff --mesh` leaves no rank process and no temporary folder, and the
flags a mesh check does not honour are refused with one line. Every wait here is bounded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from mesh_cases import job

from k3c import models
from k3c.cli import main
from k3c.cli_signals import EXIT_STATUS
from k3c.distributed.runner import compile_mesh
from k3c.distributed.simulate import RankError
from k3c.distributed.spawn import spawn

MODEL = ("gated-deltanet-tiny", "tp=2")  # the cheapest model a two-rank mesh compiles


def _running(needle: str) -> list[int]:
    """Pids of the processes whose command line holds `needle`."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if needle.encode() in (d / "cmdline").read_bytes():
                    pids.append(int(d.name))
            except OSError:  # gone meanwhile
                pass
    return pids


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_a_killed_rank_is_named_at_once(tmp_path):
    model = models.build(MODEL[0]).eval()
    d = compile_mesh(model, "reference", (job()["input_ids"],), MODEL[1], tmp_path / "mesh")
    seen = []

    def kill_rank_1(procs):
        seen.extend(procs)
        threading.Timer(0.5, procs[1].kill).start()
    t0 = time.monotonic()
    with pytest.raises(RankError, match="rank 1 was killed by SIGKILL"):
        spawn(d, job(), 2, timeout_s=60, started=kill_rank_1)
    assert time.monotonic() - t0 < 15  # the run's timeout is 60 s, a rank's own 30 s
    assert all(p.poll() is not None for p in seen)  # every rank reaped
    work = Path(seen[0].args[-1])
    assert work.name.startswith("k3c-ranks-") and not work.exists()


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_sigterm_leaves_no_rank_and_no_folder(tmp_path):
    """SIGTERM to the CLI once its ranks run: it exits, no rank outlives it, nothing of k3c's
    is left in its temporary folder."""
    env = {**os.environ, "TMPDIR": str(tmp_path), "K3C_TIMEOUT_S": "30"}
    cmd = [sys.executable, "-m", "k3c.cli", "diff", "--model", MODEL[0], "--backends", "reference",
           "--mesh", MODEL[1], "--seq-len", "4", "--decode-steps", "1"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob("k3c-ranks-*/rank1.log")) and proc.poll() is None:
            assert time.monotonic() < deadline, "the ranks never started"
            time.sleep(0.02)
        assert proc.poll() is None, proc.stderr.read().decode()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == EXIT_STATUS and b"terminated" in proc.stderr.read()
    deadline = time.monotonic() + 5  # a rank killed by its parent may take a moment to be gone
    while _running(str(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(str(tmp_path))
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("k3c")]


@pytest.mark.parametrize("flags, says", [
    (["--dtype", "bf16"], "--dtype bf16 with --mesh"),
    (["--stress", "router-low"], "--stress router-low with --mesh"),
    (["--keep"], "--keep with --mesh"),
])
def test_unchecked_flags_are_refused(capsys, flags, says):
    assert main(["diff", "--model", "k3-tiny", "--backends", "reference", "--mesh", "ep=2", *flags]) == 2
    err = capsys.readouterr().err
    assert says in err and err.strip().count("\n") == 0, err
