"""The files of a checkout that hold one op's own knowledge, listed and counted:

    python -m k3c.kernels.delta.op_files gated_delta_rule short_conv     # from the repository

A file counts for an op when its code names the op or its kernels (`<op>`,
`naive_recurrent_<op>`, `naive_<op>`, `chunk_<op>`, unless a module has that name) as an
identifier, an import or a string (comments and docstrings do not count: they describe, they
do not dispatch), when it lies in
the op's kernel folder (`kernels/<op>/`, its README included), or when it is
`pyproject.toml` naming the op's package. The op's users (models/, benchmarks/, examples/)
and tests/ are left out: they call an op, they are not touched to add one.

An existing op stands in for a new one of its shape: `gated_delta_rule` for (a) a delta op of
an existing gate kind, `short_conv` for (b) a recurrent op outside the family. The listing of
an existing op is an upper bound for a new one (kernels/delta/README.md has the figures).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

USERS = ("tests/", "models/", "benchmarks/", "examples/")
SELF = "kernels/delta/op_files.py"  # this counter names the ops it counts by default


def code_words(text: str) -> set[str]:
    """The identifiers and the words of the non-docstring string constants of Python source."""
    tree = ast.parse(text)
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    words: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            words.add(n.id)
        elif isinstance(n, ast.Attribute):
            words.add(n.attr)
        elif isinstance(n, ast.alias):
            words.update(re.findall(r"\w+", n.name + " " + (n.asname or "")))
        elif isinstance(n, ast.ImportFrom) and n.module:
            words.update(n.module.split("."))
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            words.add(n.name)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            words.update(re.findall(r"\w+", n.value))
    return words


def files_of(op: str, root: Path) -> list[str]:
    """The files (relative to `root`, a git checkout) that hold knowledge of `op`."""
    listed = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout
    modules = {Path(f).stem for f in listed.split() if f.endswith(".py")}  # passes/chunk_delta_rule.py: no op
    names = {op, f"naive_recurrent_{op}", f"naive_{op}", f"chunk_{op}"} - modules
    out = []
    for rel in listed.split():
        path = root / rel
        if rel.startswith(USERS) or rel == SELF or not path.is_file():
            continue
        if rel.startswith(f"kernels/{op}/"):
            out.append(rel)
        elif rel == "pyproject.toml":
            if re.search(rf'"k3c\.kernels\.{op}"', path.read_text()):
                out.append(rel)
        elif rel.endswith(".py") and names & code_words(path.read_text()):
            out.append(rel)
    return out


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        print(f"op_files: {root} is not a git checkout of k3c", file=sys.stderr)
        return 2
    for op in argv or ["gated_delta_rule", "short_conv"]:
        files = files_of(op, root)
        print(f"{op}: {len(files)} files")
        print("".join(f"  {f}\n" for f in files), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
