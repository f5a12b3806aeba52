"""The simulator: every rank of a partitioned program in this process, in lockstep.

Each rank runs in a thread of its own with a `SimComm` over one shared `Exchange`, so the
collectives of the IR (their references call the running rank's communicator) compute across
the ranks exactly as torch.distributed would across processes. A rank that fails makes the
others fail at their next collective; one that never arrives is a TimeoutError.

    outs = run_ranks(lambda r: interpret(graphs[r], *inputs[r]), world=4)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ..errors import K3cError
from ..kernels.collectives import using
from .comm import Exchange, SimComm


class RankError(K3cError):
    """A rank of a mesh run failed, hung or died; the message names the rank and why."""


def run_ranks(fn: Callable[[int], Any], world: int, timeout_s: float = 60.0) -> tuple[list[Any], list[SimComm]]:
    """fn(rank) for every rank at once, each under its simulated communicator; returns the
    results by rank and the communicators (with the bytes each rank sent)."""
    exchange = Exchange(timeout_s)
    comms = [SimComm(r, exchange) for r in range(world)]
    results: list[Any] = [None] * world
    errors: dict[int, BaseException] = {}

    def body(r: int) -> None:
        try:
            with using(comms[r]):
                results[r] = fn(r)
        except BaseException as e:  # noqa: BLE001  (reported for the rank below)
            errors[r] = e
            exchange.fail(f"rank {r}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=body, args=(r,), daemon=True, name=f"k3c-rank-{r}") for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s * 2)
    hung = [r for r, t in enumerate(threads) if t.is_alive()]
    if hung:
        exchange.fail("a rank hung")
        raise RankError(f"simulated rank(s) {hung} did not finish within {2 * timeout_s:.0f} s")
    if errors:
        first = min(errors, key=lambda r: isinstance(errors[r], RuntimeError))  # the cause, not its echoes
        raise RankError(f"simulated rank {first} failed: {type(errors[first]).__name__}: {errors[first]}") \
            from errors[first]
    return results, comms
