"""Every top-level folder name probed from the repository root, as a library probes for a
package (transformers' `_is_package_available`: find_spec, then import_module, then no
`__file__` and no `__version__` means no package): none is seen as a package, none fails the
probe, k3c itself still imports and runs in that process (its torch ops registered once),
and a script that then uses a probed name gets the ImportError naming k3c.<name>.

benchmarks/ and examples/ are folders of scripts without an __init__: a probe finds a
namespace package there, which has no file and no version, so it is no package either."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("backends", "frontend", "ir", "kernels", "models", "passes")
NAMES = (*PACKAGES, "benchmarks", "examples")

PROBE = """
import sys
from transformers.utils.import_utils import _is_package_available
for name in sys.argv[1:]:
    print("PROBE", name, _is_package_available(name, return_version=True)[0])
import torch, k3c
print("LOGITS", tuple(k3c.models.build("gpt2-tiny")(torch.zeros(1, 3, dtype=torch.long)).shape))
for name in ("models", "ir", "passes", "frontend", "backends"):
    try:
        exec(f"from {name} import anything_at_all")
    except ImportError as e:
        print("USE", name, f"import k3c.{name}" in str(e))
import passes.chunk_delta_rule  # a submodule of the stand-in: using a name of it is refused too
try:
    passes.chunk_delta_rule.register_pass("x")
except ImportError as e:
    print("USE submodule", "import k3c.passes" in str(e))
"""


def test_probing_every_folder_name_from_the_root_sees_no_package():
    r = subprocess.run([sys.executable, "-c", PROBE, *NAMES], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert [ln for ln in lines if ln.startswith("PROBE")] == [f"PROBE {n} False" for n in NAMES], r.stdout
    assert "LOGITS (1, 3, 1024)" in lines, r.stdout
    assert [ln for ln in lines if ln.startswith("USE")] == [
        *(f"USE {n} True" for n in ("models", "ir", "passes", "frontend", "backends")), "USE submodule True"], r.stdout
