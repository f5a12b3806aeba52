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
from ..ir import dims as D
from ..kernels.collectives import using
from .comm import ShapeComm
from .mesh import Mesh, check_divides, stage_layers
from .partition import combine_report, partition
from .pipeline import cut_stages
from .segments import is_collective, plan_from_json, plan_to_json, run_plan, split

MANIFEST = "mesh.json"


def rank_graphs(model: torch.nn.Module, mesh: Mesh, example_inputs: tuple,
                combine: str = "auto") -> Iterator[dict[str, Graph]]:
    """Every rank's entries (prefill, decode), in rank order. The parts differ only in their
    weights (even splits, the expert offset a buffer) and in which ranks their collectives
    name, so rank 0's part is captured once and each rank's graphs are those with its own
    weights bound and its groups put in: rank 0's tp group becomes the rank's tp group, its
    ep group the rank's ep group, its expert group the rank's expert group (the world stays the
    world). `combine`: partition's."""
    if mesh.pp > 1:  # the partition sees one stage's mesh: the stages' own checks here
        check_divides(mesh, model.config)
    stage = mesh.stage_mesh()  # with pp every stage's ranks are partitioned as stage 0's
    with using(ShapeComm(0)):
        first = capture_entries(partition(model, stage, 0, combine), example_inputs)
    world = list(range(stage.world))
    for r in range(mesh.world):
        local = r - mesh.stage(r) * mesh.stage_ranks
        graphs = rebind_weights(first, partition(model, stage, local, combine)) if r else first
        names = {tuple(stage.tp_group(0)): mesh.tp_group(r), tuple(stage.ep_group(0)): mesh.ep_group(r),
                 tuple(stage.expert_group(0)): mesh.expert_group(r), tuple(world): mesh.stage_group(r)}
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
        cut = _stage_cut(model, mesh)
        for r, graphs in enumerate(parts):
            ranks.append(_write_rank(be, steps, r, graphs, out, force, cut))
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


def _stage_cut(model: torch.nn.Module, mesh: Mesh):
    """Rank r's part of a pipeline: its graph cut to the layers of its stage (None without pp)."""
    if mesh.pp == 1:
        return None
    layers = stage_layers(model.config.num_layers, mesh.pp)
    return lambda r, g: cut_stages(g, mesh.pp, layers)[mesh.stage(r)]


def _write_rank(be, steps: list, r: int, graphs: dict[str, Graph], out: Path, force: bool, cut=None) -> dict:
    """Rank r's artifact: its entries (with pp, its stage of them) cut into segments, each
    legalized and lowered."""
    entries, segments = {}, {}
    for entry, g in graphs.items():
        g = passes_mod.run(g, steps)
        pipe = {}
        if cut is not None:
            if entry not in ("prefill", "decode"):  # the mesh runs prefill and decode
                continue
            stage = cut(r, g)
            types = {v: [g.types[v].dtype, [D.to_str(d) for d in g.types[v].shape]]
                     for v in list(g.inputs) + stage.recv}
            g = stage.graph
            pipe = {"recv": stage.recv, "send": stage.send, "types": types}
        plan, segs = split(g, entry)
        for s in segs.values():
            passes_mod.legalize(s, be.supports)
            backends.check_supported(be, s)
        segments.update(segs)
        entries[entry] = {"inputs": list(g.inputs), "outputs": [list(o) for o in g.outputs],
                          "plan": plan_to_json(plan), **pipe}
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
        self.pipe = {e: (v.get("recv", []), v.get("send", []), v.get("types", {})) for e, v in info["entries"].items()}
        self.stage = self.mesh.stage(rank)
        self.last = self.stage == self.mesh.pp - 1
        self.timings: dict[str, float] = {}
        # simulated ranks share a process: their segments take turns (the Triton interpreter,
        # for one, keeps global state), while the collectives between them run concurrently
        self.lock = lock or contextlib.nullcontext()

    def _segment(self, entry: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        with self.lock:
            return self.runner.run(entry, *inputs)

    def _run(self, entry: str, given: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The entry's outputs by name; with pp the values of the stage before received first
        and those of the next stage sent after (k3c/distributed/pipeline.py)."""
        names, out_names, values, plan = self.entries[entry]
        recv, send, types = self.pipe[entry]
        env = dict(given)
        if recv:
            env.update(receive(recv, types, given, self.rank - self.mesh.stage_ranks, self.timings))
        outs = run_plan(plan, names, values, self._segment, [env[n] for n in names], self.timings)
        got = dict(zip(out_names, outs))
        if send:
            handover(send, {**env, **got}, self.rank + self.mesh.stage_ranks, self.timings)
        return {k: v for k, v in got.items() if k not in send}  # what the entry returns, not the handover

    def prefill(self, input_ids: torch.Tensor,
                micro_batches: int = 1) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
        """Logits (None on a stage before the last) and the rank's state shard; with pp the
        batch may go through the stages in `micro_batches` pieces of rows, joined after."""
        pieces = [self._run("prefill", {"input_ids": ids}) for ids in input_ids.chunk(micro_batches)]
        got = {k: torch.cat([p[k] for p in pieces]) for k in pieces[0]}
        return got.pop("logits", None), got

    def decode(self, input_ids: torch.Tensor, state: dict[str, torch.Tensor]) -> tuple[torch.Tensor | None, dict]:
        names = self.entries["decode"][0]
        got = self._run("decode", {"input_ids": input_ids, **{n: state[n] for n in names if n in state}})
        return got.pop("logits", None), got


def receive(names: list[str], types: dict, given: dict[str, torch.Tensor], src: int,
            timings: dict[str, float]) -> dict[str, torch.Tensor]:
    """The values `names` from rank `src` (the stage before), their shapes from their IR types
    with the dims bound by the entry's own inputs (every rank has the token ids)."""
    import time

    from ..ir.types import DTYPES
    from ..kernels.collectives import current

    bound: dict[str, int] = {}
    for n, x in given.items():
        if n in types:
            bound.update({d: s for d, s in zip(types[n][1], x.shape) if d.isidentifier()})
    syms = {d: D.sym(d) for d in bound}
    comm, out = current("a pipeline receive"), {}
    t0 = time.perf_counter()
    for v in names:
        dtype, dims = types[v]
        shape = [D.evaluate(D.parse(d, syms), bound) for d in dims]
        out[v] = comm.recv(torch.empty(shape, dtype=DTYPES[dtype]), src)
    timings["pipeline"] = timings.get("pipeline", 0.0) + time.perf_counter() - t0
    return out


def handover(names: list[str], env: dict[str, torch.Tensor], dst: int, timings: dict[str, float]) -> None:
    """The values `names` to rank `dst` (the next stage), in order."""
    import time

    from ..kernels.collectives import current

    comm = current("a pipeline send")
    t0 = time.perf_counter()
    for v in names:
        comm.send(env[v], dst)
    timings["pipeline"] = timings.get("pipeline", 0.0) + time.perf_counter() - t0
