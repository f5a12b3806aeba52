"""Per-rank artifacts of a partitioned model, and the rank runner that runs one of them.

    mesh_dir = compile_mesh(model, "onnx", (ids,), "tp=2,ep=2", "out/")
        out/mesh.json            the mesh, the backend, per rank and entry the plan
        out/rank{r}/             rank r's artifact: every segment as an entry ({entry}_s{i})
    rank = RankModel(mesh_dir, r)           # in a rank process (or a simulated rank)
    logits, state = rank.prefill(ids)       # segment, collective, segment, ...
    logits, state = rank.decode(ids1, state)   # the rank's own state shard in and out

The collectives between segments go through the running rank's communicator
(k3c.kernels.collectives.current): torch.distributed in a rank process, the simulator's in one.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from .. import backends
from .. import passes as passes_mod
from ..backends import artifact
from ..compiler import capture_entries, rebind_weights
from ..errors import ArtifactError
from ..ir import Graph
from ..kernels.collectives import using
from .comm import ShapeComm
from .mesh import Mesh
from .partition import combine_report, partition
from .segments import is_collective, plan_from_json, plan_to_json, run_plan, split

MANIFEST = "mesh.json"


def rank_graphs(model: torch.nn.Module, mesh: Mesh, example_inputs: tuple,
                combine: str = "auto") -> Iterator[dict[str, Graph]]:
    """Every rank's entries (prefill, decode), in rank order. The parts differ only in their
    weights (even splits, the expert offset a buffer) and in which ranks their collectives
    name, so rank 0's part is captured once and each rank's graphs are those with its own
    weights bound and its groups put in: rank 0's tp group becomes the rank's tp group, its
    ep group the rank's ep group (the world stays the world). `combine`: partition's."""
    with using(ShapeComm(0)):
        first = capture_entries(partition(model, mesh, 0, combine), example_inputs)
    world = list(range(mesh.world))
    for r in range(mesh.world):
        graphs = rebind_weights(first, partition(model, mesh, r, combine)) if r else first
        names = {tuple(mesh.tp_group(0)): mesh.tp_group(r), tuple(mesh.ep_group(0)): mesh.ep_group(r),
                 tuple(world): world}
        for g in graphs.values():
            for n in g.nodes:
                if "group" in n.attrs and is_collective(n):
                    n.attrs = {**n.attrs, "group": list(names[tuple(n.attrs["group"])])}
        yield graphs


def compile_mesh(model: torch.nn.Module, backend: str, example_inputs: tuple, mesh: Mesh | str,
                 out_dir: str | Path | None = None, passes: str | list[str] = "default", *,
                 force: bool = False, captured: list[dict[str, Graph]] | None = None, combine: str = "auto",
                 **options) -> Path:
    """Write one artifact per rank of `mesh` for `backend`, and the mesh manifest; returns the
    folder. `captured`: the ranks' graphs from `rank_graphs` (the same for every backend), to
    compile one capture for several backends (made with the same `combine`). `combine`: how
    the routed experts' outputs are combined (k3c/distributed/partition.py: auto, all_reduce,
    all_to_all); the manifest records what ran."""
    mesh = Mesh.parse(mesh)
    from ..backend_spec import parse_backend

    spec = parse_backend(backend, "backend")  # onnx:ort, as k3c diff names a flavour
    backend, options = spec.name, {**spec.options(), **options}
    be = backends.get(backend, **options)
    steps = passes_mod.for_backend(passes_mod.steps_of(passes), **passes_mod.backend_choices(be))
    out = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix=f"k3c-mesh-{backend}-"))
    out.mkdir(parents=True, exist_ok=True)
    ranks = []
    with _shared_builds():
        parts = captured if captured is not None else rank_graphs(model, mesh, example_inputs, combine)
        for r, graphs in enumerate(parts):
            ranks.append(_write_rank(be, steps, r, graphs, out, force))
    manifest = {"mesh": mesh.to_json(), "backend": backend,
                "options": {k: v for k, v in options.items() if isinstance(v, (str, int, float, bool))},
                "model": getattr(model, "name", type(model).__name__), "combine": combine_report(model, mesh, combine),
                "ranks": ranks}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return out


@contextmanager
def _shared_builds() -> Iterator[None]:
    """The ranks' segments are the same graphs with other weights: a backend that caches its
    builds by graph (tvm, under K3C_CACHE_DIR) builds each once for the mesh, in a cache of the
    caller's or, without one, a temporary one."""
    if os.environ.get("K3C_CACHE_DIR"):
        yield
        return
    with tempfile.TemporaryDirectory(prefix="k3c-mesh-cache-") as tmp:
        os.environ["K3C_CACHE_DIR"] = tmp
        try:
            yield
        finally:
            del os.environ["K3C_CACHE_DIR"]


def _write_rank(be, steps: list, r: int, graphs: dict[str, Graph], out: Path, force: bool) -> dict:
    """Rank r's artifact: its entries cut into segments, each legalized and lowered."""
    entries, segments = {}, {}
    for entry, g in graphs.items():
        g = passes_mod.run(g, steps)
        plan, segs = split(g, entry)
        for s in segs.values():
            passes_mod.legalize(s, be.supports)
            backends.check_supported(be, s)
        segments.update(segs)
        entries[entry] = {"inputs": list(g.inputs), "outputs": [list(o) for o in g.outputs],
                          "plan": plan_to_json(plan)}
    artifact.write(be, segments, out / f"rank{r}", force=force)
    return {"rank": r, "dir": f"rank{r}", "entries": entries}


def read_manifest(mesh_dir: str | Path) -> dict:
    path = Path(mesh_dir) / MANIFEST
    if not path.is_file():
        raise ArtifactError(f"{mesh_dir} holds no mesh artifact ({MANIFEST} is missing): compile with mesh=...")
    return json.loads(path.read_text())


class RankModel:
    """Rank `rank` of a mesh artifact: prefill and decode like a compiled model, on its shards."""

    def __init__(self, mesh_dir: str | Path, rank: int, backend_options: dict | None = None, lock=None):
        self.manifest = m = read_manifest(mesh_dir)
        self.mesh = Mesh.from_json(m["mesh"])
        if not 0 <= rank < self.mesh.world:
            raise ArtifactError(f"{mesh_dir} is a mesh of {self.mesh.world} ranks; there is no rank {rank}")
        self.rank, info = rank, m["ranks"][rank]
        be = backends.get(m["backend"], **{**m.get("options", {}), **(backend_options or {})})
        self.runner = be.load(Path(mesh_dir) / info["dir"])
        self.entries = {e: (v["inputs"], [o[0] for o in v["outputs"]], [o[1] for o in v["outputs"]],
                            plan_from_json(v["plan"])) for e, v in info["entries"].items()}
        self.timings: dict[str, float] = {}
        # simulated ranks share a process: their segments take turns (the Triton interpreter,
        # for one, keeps global state), while the collectives between them run concurrently
        self.lock = lock or contextlib.nullcontext()

    def _segment(self, entry: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        with self.lock:
            return self.runner.run(entry, *inputs)

    def _run(self, entry: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        names, _, values, plan = self.entries[entry]
        return run_plan(plan, names, values, self._segment, inputs, self.timings)

    def prefill(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        outs = self._run("prefill", [input_ids])
        return outs[0], dict(zip(self.entries["prefill"][1][1:], outs[1:]))

    def decode(self, input_ids: torch.Tensor, state: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        names, out_names, _, _ = self.entries["decode"]
        outs = self._run("decode", [input_ids] + [state[n] for n in names[1:]])
        return outs[0], dict(zip(out_names[1:], outs[1:]))
