"""Work done in a forked child of this process, beside this process's own.

Capturing a model's entries with torch.export (frontend/side_by_side.py) keeps one core busy
for seconds an entry, in Python: in one process they could only take turns. A forked child
starts with everything this process has imported and built (the model, its weights) at no
cost, runs one function, and sends its result back through a file.

A child that fails sends nothing: the caller does the work itself, so an error is raised as it
would have been without the child. `usable()` says whether to fork at all: only from a process
with one Python thread, however started (a thread of the parent may hold a lock the child
would wait for: a pytest-xdist worker's), that has not initialised CUDA, where `os.fork` exists
and more than one core is usable; `K3C_FORK=0` turns it off.
"""

from __future__ import annotations

import os
import pickle
import sys
import tempfile
import time
from collections.abc import Callable


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def usable() -> bool:
    """Whether work may go to a forked child here: not once CUDA is initialised either (a forked
    child cannot use it)."""
    # every thread with a Python state, those `threading` does not list included (execnet's,
    # started by `_thread`): a thread of the parent may hold a lock the child would wait for
    if not (hasattr(os, "fork") and cores() > 1 and len(sys._current_frames()) == 1
            and os.environ.get("K3C_FORK", "1") != "0"):
        return False
    torch = sys.modules.get("torch")
    return torch is None or not torch.cuda.is_initialized()


class Child:
    """`fn()` run in a forked child; `result()` waits for it. Always call `result()` or `kill()`."""

    def __init__(self, fn: Callable[[], object]):
        fd, self._path = tempfile.mkstemp(prefix="k3c-child-", suffix=".pkl")
        os.close(fd)
        sys.stdout.flush()
        sys.stderr.flush()
        self._pid = os.fork()
        if self._pid == 0:
            _run(fn, self._path)  # never returns

    def result(self, timeout: float | None = None) -> tuple[bool, object]:
        """(True, what fn returned), or (False, None) when the child failed, was killed, or has
        not ended within `timeout` seconds (then it is killed: a child that hangs on a lock
        some native thread of the parent held at the fork costs time, never the run)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                pid, status = os.waitpid(self._pid, 0 if deadline is None else os.WNOHANG)
                if pid:
                    break
                if time.monotonic() > deadline:
                    self.kill()
                    return False, None
                time.sleep(0.02)
            if os.waitstatus_to_exitcode(status) != 0:
                return False, None
            with open(self._path, "rb") as f:
                return True, pickle.load(f)
        except Exception:  # what it wrote does not load here: the caller does the work itself
            return False, None
        finally:
            self._pid = 0
            _remove(self._path)

    def kill(self) -> None:
        """End the child now (when its result is no longer wanted) and remove its file."""
        if self._pid > 0:
            try:
                os.kill(self._pid, 9)
                os.waitpid(self._pid, 0)
            except OSError:
                pass
            self._pid = 0
        _remove(self._path)


def _run(fn, path: str) -> None:
    code = 1
    try:  # the child: never returns into the caller's stack
        import torch

        torch.set_num_threads(1)  # the parent's OpenMP pool is not the child's
        result = fn()
        with open(path, "wb") as f:
            pickle.dump(result, f, protocol=pickle.HIGHEST_PROTOCOL)
        code = 0
    except BaseException:  # the parent does the work itself, and raises the error
        pass
    finally:
        os._exit(code)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
