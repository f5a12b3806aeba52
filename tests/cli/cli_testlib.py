"""Helpers of the CLI tests (a module of its own: `conftest` is a name every test folder uses)."""

from __future__ import annotations

from k3c.cli import main


def fails(argv, capsys, words: str) -> None:
    """`k3c argv` exits 2 with one line on stderr that holds `words`."""
    assert main(argv) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and words in err[0], err
