"""The `k3c` command: `cli.main`, then an exit that skips the interpreter's teardown.

Once a command has run, the process holds torch, TVM, onnxruntime and triton, and Python's
finalization tears down their modules and native state one by one: 1.1 to 1.4 s after each
`k3c compile --backend all` on a 2-core Zen 4, after the work is done and printed. The command
ends instead in its last atexit handler: every other handler has run by then (they run in the
reverse order of registration, and this one is registered first, before anything is imported),
the standard streams are flushed, and the exit status is main's (130 after Ctrl-C, as a shell
reports it). `python -m k3c.cli` and `cli.main()` called in a program keep the usual exit.
"""

from __future__ import annotations

import atexit
import os
import sys


def run() -> None:
    status = {"code": 1}  # an exception out of main: its traceback is printed, then status 1

    def leave() -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe (`k3c ... | head`)
                pass
        os._exit(status["code"])

    atexit.register(leave)
    from .cli import main

    try:
        status["code"] = main()
    except SystemExit as e:
        status["code"] = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        raise
    except KeyboardInterrupt:
        status["code"] = 130
        raise
    sys.exit(status["code"])
