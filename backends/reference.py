"""The reference backend: the IR interpreter. Always available; the definition of correct.

Its artifact is the graph itself (`DIR/{entry}/graph.k3c` + weights), so a reference
compile also shows what every other backend starts from. Loading reads the manifest as data:
its entries are plain names of folders the manifest lists, parsed by the IR's own parser.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError

from ..errors import ArtifactError, K3cError, UsageError
from ..ir import OPS, Graph, Node, interpret, load, save
from .artifact import MANIFEST, listed, seal, verify
from .contract import check_inputs
from .manifest import Fields
from .weights import unshare_weights

FORMAT = "k3c-reference/1"


class ReferenceRunner:
    def __init__(self, entries: dict[str, Graph]):
        self.entries = entries

    def run(self, entry: str, *inputs: torch.Tensor) -> list[torch.Tensor]:
        if entry not in self.entries:
            raise UsageError(f"the reference artifact has no entry {entry!r}; it has {', '.join(self.entries)}")
        check_inputs(self.entries[entry], inputs)  # an InputError names an input, an id or a dim out of range
        return interpret(self.entries[entry], *inputs)


def entry_names(out_dir: Path, backend: str = "reference") -> list[str]:
    """The entries of a verified reference artifact (sealed by `backend`, the reference or a
    subclass of it): plain names of folders whose graph the manifest lists (never a path such
    as "../other/decode")."""
    manifest = verify(out_dir, backend)
    f = Fields(out_dir / MANIFEST)
    f.version(manifest, FORMAT)
    names = f.names(manifest.get("entries"), "entries")
    if not names:
        f.fail("entries", "lists no entry")
    for e in names:
        f.dim_name(e, "entries")
        listed(out_dir, manifest, f"{e}/graph.k3c", "entries")
    return names


class ReferenceBackend:
    """`compute`: None computes in the model's own dtypes, as eager does; "f32" computes a
    BF16 model in float32 from its stored weights (the compute-dtype pass)."""

    name = "reference"

    def __init__(self, compute: str | None = None):
        if compute not in (None, "f32"):
            raise ValueError(f"reference backend: compute must be None (the model's dtypes) or 'f32', got {compute!r}")
        self.compute_dtype = compute

    def is_available(self) -> tuple[bool, str]:
        return True, ""

    def supports(self, node: Node, graph: Graph) -> tuple[bool, str]:
        return (True, "") if node.op in OPS else (False, f"op {node.op!r} has no declaration")

    def lower(self, graphs: dict[str, Graph], out_dir: Path) -> Path:
        out_dir = Path(out_dir)
        for entry, g in graphs.items():
            save(unshare_weights(g), out_dir / entry)
        (out_dir / MANIFEST).write_text(json.dumps({"format": FORMAT, "entries": list(graphs)}, indent=1) + "\n")
        seal(out_dir, backend=self.name, model=next(iter(graphs.values())).meta.get("model"))
        return out_dir

    def load(self, out_dir: Path) -> ReferenceRunner:
        out_dir = Path(out_dir)
        entries = {}
        for e in entry_names(out_dir, self.name):
            try:
                entries[e] = load(out_dir / e)
            except K3cError:
                raise
            except (ValueError, OSError, SafetensorError) as err:
                raise ArtifactError(f"{out_dir / e}: not a graph k3c reads ({err})") from None
        return ReferenceRunner(entries)

    def runner(self, graphs: dict[str, Graph]) -> ReferenceRunner:
        """Run graphs in memory, without writing them."""
        return ReferenceRunner(graphs)
