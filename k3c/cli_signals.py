"""SIGTERM handled like Ctrl-C for one run of the `k3c` command.

`timeout`, `kill` and CI stop a program with SIGTERM, whose default action ends the process
at once: no `finally` runs, so temporary artifact folders and half-built `.D.new-*` folders
stay behind. Within `sigterm_as_interrupt()` the signal raises `Terminated`, a
KeyboardInterrupt: every `finally` and clean-up path that Ctrl-C takes runs, a half-built
artifact is never moved into place, and no `except Exception` (a backend loop that records a
failed backend) swallows it.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

EXIT_STATUS = 128 + signal.SIGTERM  # what a shell reports for a process ended by SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is."""


def _raise(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the clean-up short
    raise Terminated()


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises Terminated inside the block (main thread only: a signal handler can be
    set there alone); the previous handler is restored after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


__all__ = ["EXIT_STATUS", "Terminated", "sigterm_as_interrupt"]
