"""The one distribution installs as `k3c` with every package, mapped from the top folders."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
PACKAGE_DIR: dict[str, str] = SETUPTOOLS["package-dir"]


def folder_of(package: str) -> Path:
    """The folder a package installs from: its longest mapped prefix, then its own path."""
    parts = package.split(".")
    for i in range(len(parts), 0, -1):
        prefix = ".".join(parts[:i])
        if prefix in PACKAGE_DIR:
            return ROOT / PACKAGE_DIR[prefix] / Path(*parts[i:])
    raise AssertionError(f"{package} is under no mapped root")


def packages_on_disk() -> set[str]:
    found = set()
    for package, folder in PACKAGE_DIR.items():
        if package.count(".") > 1:
            continue
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            if "__pycache__" not in rel.parts:
                found.add(".".join([package, *rel.parts]))
    return found


def test_roots_are_mapped_into_k3c():
    assert PACKAGE_DIR == {"k3c": "k3c", "k3c.models": "models", "k3c.kernels": "kernels",
                           "k3c.frontend": "frontend", "k3c.ir": "ir", "k3c.passes": "passes",
                           "k3c.backends": "backends"}


def test_every_package_is_listed():
    listed = set(SETUPTOOLS["packages"])
    on_disk = packages_on_disk()
    assert not on_disk - listed, f"add to [tool.setuptools] packages: {sorted(on_disk - listed)}"
    assert not listed - on_disk, f"listed but not a folder with __init__.py: {sorted(listed - on_disk)}"
    for package in listed:
        assert (folder_of(package) / "__init__.py").is_file(), package


def test_install_into_a_fresh_target_imports(tmp_path):
    """`pip install .` from a copy of the sources; the result imports without the checkout."""
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(ROOT / "pyproject.toml", src)
    for name in ("README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, src)
    for folder in set(PACKAGE_DIR.values()):
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    target = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-input",
           "--disable-pip-version-check", "--target", str(target), str(src)]
    proc = subprocess.run(pip, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]

    for package in SETUPTOOLS["packages"]:
        assert (target / Path(*package.split(".")) / "__init__.py").is_file(), f"{package} was not installed"
    # -S: no site hooks, so an editable install of the checkout cannot answer the imports
    paths = [str(target), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    code = ("import sys, k3c, k3c.models, k3c.kernels.kda, k3c.kernels.moe, k3c.models.checkpoint\n"
            "for name in ('k3c', 'k3c.models', 'k3c.kernels.kda', 'k3c.ir'):\n"
            "    print(sys.modules[name].__file__)")
    proc = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": ":".join(paths), "PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for line in proc.stdout.split():
        assert Path(line).is_relative_to(target), f"imported from {line}, not from the install"
