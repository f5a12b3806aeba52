"""What fits this machine: the memory a request would take, checked before it is allocated.

    check_fits("k3c generate: caches of 100000000 rows", need_bytes, UsageError)

A request that cannot fit (a config.json of 10^9 layers, `--max-new-tokens 100000000`,
`--batch 100000`) is refused in its first second with the numbers in one line, instead of
exhausting the memory minutes later. The figure is Linux's MemAvailable (free memory plus
what the page cache would give back), or the physical memory elsewhere.
"""

from __future__ import annotations

import os


def available_memory() -> int:
    """Bytes of memory a new allocation can take now (MemAvailable on Linux)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 62  # unknown: nothing is refused


def gib(n: float) -> str:
    return f"{n / 2**30:.3g} GiB" if n >= 2**20 else f"{n / 2**10:.3g} KiB"


def check_fits(what: str, need: int, error: type[Exception]) -> None:
    """Raise `error` naming `what`, the bytes it needs and the bytes available, when they do not fit."""
    have = available_memory()
    if need > have:
        raise error(f"{what} needs at least {gib(need)}, more than the {gib(have)} of memory available")


def state_bytes(model, batch: int, rows: int) -> tuple[int, int]:
    """(bytes of a state for `batch` sequences whose caches hold `rows` rows, bytes a cache row
    takes for one sequence), from the model's state layout (models.validate.state_spec)."""
    from .models.validate import state_spec

    row = fixed = 0
    for shape, grow, dtype in state_spec(model).values():
        n = dtype.itemsize
        for axis, d in enumerate(shape):
            n *= 1 if axis in grow else d
        row, fixed = (row + n, fixed) if grow else (row, fixed + n)
    return batch * (rows * row + fixed), row


__all__ = ["available_memory", "check_fits", "gib", "state_bytes"]
