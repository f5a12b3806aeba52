"""SIGTERM (what `timeout`, `kill` and CI send) to a single-process `k3c compile`, `diff`,
`bench` or `generate` while an artifact is half written: the process ends within seconds with
status 143, and nothing of the run is left: no temporary `k3c-*` folder, no hidden
`.D.new-*` folder, no `--out` folder (an artifact is in place whole or not at all).
`generate` compiles into a temporary folder, as `compile` without `--out` does.

The artifact is half written on purpose: a reference backend subclass writes a file into
its build folder, says so on stdout, then waits in `lower` until the signal comes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import sys, time
from k3c import backends
from k3c.backends.reference import ReferenceBackend

class HalfWritten(ReferenceBackend):
    name = "half-written"

    def lower(self, graphs, out_dir):
        (out_dir / "part.bin").write_bytes(b"0" * 1024)
        print("LOWERING", flush=True)
        time.sleep(120)  # the signal comes here
        return super().lower(graphs, out_dir)

backends.register("half-written", HalfWritten)
from k3c.cli import main
sys.exit(main(sys.argv[1:]))
"""

MODEL = ["--model", "gpt2-tiny"]
COMMANDS = {
    "compile --out": ["compile", *MODEL, "--backend", "half-written", "--out", "{out}"],
    "diff": ["diff", *MODEL, "--backends", "half-written", "--seq-len", "8", "--decode-steps", "1"],
    "bench": ["bench", *MODEL, "--backends", "half-written", "--seq-len", "8", "--decode-steps", "1",
              "--no-torch-compile", "--repeats", "1", "--warmup", "0"],
    "generate": ["generate", *MODEL, "--backend", "half-written", "--prompt-ids", "1 2", "--max-new-tokens", "2"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_sigterm_mid_compile_leaves_nothing(command, tmp_path):
    tmp, work = tmp_path / "tmp", tmp_path / "work"
    tmp.mkdir()
    work.mkdir()
    out = work / "artifact"
    argv = [a.format(out=out) for a in COMMANDS[command]]
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, *argv], cwd=work, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # blocks until lower has written its first file (or the process ended)
        assert line.strip() == "LOWERING", (line, proc.stderr.read() if proc.poll() is not None else "")
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read()
    assert code == 128 + signal.SIGTERM, err[-2000:]
    assert "terminated (SIGTERM)" in err.splitlines()[-1], err[-2000:]
    ours = [p for p in tmp.iterdir() if p.name.startswith(("k3c", ".k3c"))]  # torch keeps its own caches there
    left = sorted(str(p.relative_to(tmp_path)) for p in [*ours, *work.iterdir()])
    assert left == [], f"left behind: {left}"


def test_the_handler_is_restored_after_main(tmp_path):
    """main() called in a process (tests, notebooks) leaves that process's SIGTERM handling as it was."""
    from k3c.cli import main

    before = signal.getsignal(signal.SIGTERM)
    assert main(["stats", "--model", "gpt2-tiny", "--json", str(Path(tmp_path) / "s.json")]) == 0
    assert signal.getsignal(signal.SIGTERM) is before
