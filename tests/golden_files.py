"""Golden files of generated text: compare with the stored file, or rewrite it when
K3C_UPDATE_GOLDEN=1 (after a deliberate change), and show what changed as a unified diff."""

from __future__ import annotations

import difflib
import os
from pathlib import Path


def check_golden(text: str, path: Path, what: str, test_file: str) -> None:
    """Fail with the first lines of the diff if `text` is not the golden at `path`."""
    if os.environ.get("K3C_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file; create it with K3C_UPDATE_GOLDEN=1 pytest {test_file}"
    want = path.read_text()
    if text != want:
        diff = "\n".join(difflib.unified_diff(want.splitlines(), text.splitlines(), "golden", "now", lineterm=""))
        raise AssertionError(f"{what} changed (K3C_UPDATE_GOLDEN=1 to accept):\n{diff[:6000]}")
