"""The shape of the source tree: files small enough to read (no module over 400 lines, no pass
over 150), and the top-level folders usable only as k3c's subpackages: imported under a bare
name (what a script run from the repository root does, or transformers probing for a package
called `kernels`) they refuse at once with an ImportError that names k3c.<name>."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("models", "kernels", "frontend", "ir", "passes", "backends")
SOURCE = ("k3c", *FOLDERS, "examples", "benchmarks", "tests")
MAX_LINES, MAX_PASS_LINES = 400, 150


def _python_files():
    for top in SOURCE:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "golden" not in path.parts:  # generated snapshots, not code a person writes
                yield path


def test_no_module_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in _python_files() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_no_two_test_modules_share_a_name():
    """pytest imports a test module by its basename (the folders are not packages): a second
    file of the same name is a collection error, not a second set of tests."""
    seen: dict[str, list[str]] = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert not {k: v for k, v in seen.items() if len(v) > 1}


def test_no_pass_over_150_lines():
    passes = [p for p in (ROOT / "passes").glob("*.py") if "@register_pass(" in p.read_text()]
    assert len(passes) >= 7
    long = {p.name: n for p in passes if (n := len(p.read_text().splitlines())) > MAX_PASS_LINES}
    assert not long, f"passes over {MAX_PASS_LINES} lines: {long}"


def _run_from_root(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("name", FOLDERS)
def test_a_folder_under_its_bare_name_refuses_with_the_k3c_name(name):
    r = _run_from_root(f"import {name}")
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: ") and f"import k3c.{name}" in last, r.stderr[-800:]


SCRIPT = """
import transformers
from transformers.utils import import_utils
print("KERNELS", import_utils.is_kernels_available())
import torch, k3c
model = k3c.models.build("k3-tiny")
print("LOGITS", tuple(model(torch.zeros(1, 4, dtype=torch.long)).shape))
"""


def test_transformers_probing_for_kernels_in_the_repository_root_sees_no_package():
    """Once a segmentation fault (transformers imported the top-level kernels/ folder under that
    bare name and k3c's torch ops registered twice), then an ImportError that stopped
    `import transformers` users: the probe now gets a stand-in without a file, which
    transformers counts as no package, and k3c itself runs."""
    r = _run_from_root(SCRIPT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "KERNELS False" in r.stdout and "LOGITS (1, 4, 1024)" in r.stdout


USE_AFTER_PROBE = """
import importlib
importlib.import_module("kernels")          # a library's probe: no error
from kernels import kda
try:
    kda(1)
except ImportError as e:
    print("USE", e)
"""


def test_using_the_bare_name_after_a_probe_gets_the_clear_error():
    r = _run_from_root(USE_AFTER_PROBE)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "USE 'kernels' is a folder of k3c's source tree" in r.stdout and "import k3c.kernels" in r.stdout


def test_from_another_directory_transformers_does_not_see_the_folders(tmp_path):
    r = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "KERNELS False" in r.stdout and "LOGITS (1, 4, 1024)" in r.stdout, r.stderr
