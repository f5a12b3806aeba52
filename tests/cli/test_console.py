"""The `k3c` command's entry point (k3c/console.py) ends in its last atexit handler, skipping
the interpreter's teardown: what it prints and its exit status must be main's all the same."""

from __future__ import annotations

import subprocess
import sys

RUN = "import sys; sys.argv = ['k3c', *sys.argv[1:]]; from k3c.console import run; run()"


def k3c(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", RUN, *argv], capture_output=True, text=True, timeout=300)


def test_output_and_status_of_a_command_that_succeeds():
    done = k3c("ops")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[:2] == ["family", "op"] and any(" kda " in f" {line} " for line in lines)


def test_status_of_a_usage_error_and_of_help():
    done = k3c("compile", "--model", "no-such-model", "--backend", "tvm")
    assert done.returncode == 2 and "unknown model 'no-such-model'" in done.stderr
    assert k3c("--help").returncode == 0


def test_atexit_handlers_registered_during_the_command_still_run(tmp_path):
    """A handler registered once the command runs (a library at import) runs before the exit."""
    mark = tmp_path / "ran"
    code = ("import sys; sys.argv = ['k3c', 'ops']; import atexit, k3c.cli, k3c.console; orig = k3c.cli.main; "
            f"k3c.cli.main = lambda: (atexit.register(lambda: open({str(mark)!r}, 'w').write('yes')), orig())[1]; "
            "k3c.console.run()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert mark.read_text() == "yes"
