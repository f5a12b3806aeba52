"""`k3c.compile`: capture -> passes -> backend lowering -> artifact on disk -> callable."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from pathlib import Path

import torch

from . import backends
from .backends import artifact
from .errors import InputError, UsageError
from .frontend import capture
from .frontend.side_by_side import capture_all
from .ir import Graph
from .passes.compute_dtype import LOW, POLICIES
from .passes.state_dtype import STATE_DTYPES

ZOO_ENTRIES = ("prefill", "decode", "extend")  # the entries of a zoo model's artifact


def capture_entries(model: torch.nn.Module, example_inputs: tuple, dynamic: bool = True,
                    max_context: int | None = None, *, dims: dict | None = None,
                    dynamic_shapes=None, entries: tuple[str, ...] = ZOO_ENTRIES) -> dict[str, Graph]:
    """The graphs a backend compiles: prefill, decode and extend for a zoo model (or those of
    them in `entries`), else forward. `max_context=N`: their serving forms, with fixed-capacity
    caches of N rows (capture). `dims` / `dynamic_shapes`: a module's dynamic dims, named or as
    torch.export takes them."""
    if hasattr(model, "prefill") and hasattr(model, "decode"):
        if dims is not None or dynamic_shapes is not None:
            raise UsageError("dims= and dynamic_shapes= name the dims of a module's forward; a zoo model's "
                             "prefill and decode have theirs (B, T, P)")
        unknown = [e for e in entries if e not in ZOO_ENTRIES]
        if unknown or not entries:
            raise UsageError(f"entries={entries!r}: a zoo model's entries are {', '.join(ZOO_ENTRIES)}")
        return capture_all(lambda entry: capture(model, example_inputs, dynamic, entry=entry,
                                                 max_context=max_context), tuple(entries), model)
    return {"forward": capture(model, example_inputs, dynamic, dims=dims, dynamic_shapes=dynamic_shapes)}


def check_state_names(names: list[str], state, model: str | None = None) -> None:
    """A decode state must hold exactly the entries the decode graph takes: an InputError
    names a missing one (a layer would start from nothing) or a foreign one (another model's)."""
    if not isinstance(state, dict):
        raise InputError(f"decode: state must be the dict prefill returned, got {type(state).__name__}")
    missing = [n for n in names if n not in state]
    if missing:
        raise InputError(f"decode: the state lacks {missing[:3]}{' ...' if len(missing) > 3 else ''}")
    extra = sorted(set(state) - set(names))
    if extra:
        raise InputError(f"decode: the state has {extra[:3]}{' ...' if len(extra) > 3 else ''}, which "
                         f"{model or 'this model'} does not have (a state of another model?)")


def rebind_weights(graphs: dict[str, Graph], model: torch.nn.Module) -> dict[str, Graph]:
    """Copies of `graphs` (captured from a model of the same structure as `model`) that hold
    `model`'s weights: a capture is the same for any weight values, so a re-weighted model
    (a k3c diff --stress) need not be exported again. Weights are matched by name."""
    named = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers(remove_duplicate=False))
    out = {}
    for entry, g in graphs.items():
        missing = [w for w in g.weights if w not in named or tuple(named[w].shape) != tuple(g.weights[w].shape)]
        if missing:
            raise ValueError(f"{entry}: the model has no weight {missing[0]!r} of shape "
                             f"{list(g.weights[missing[0]].shape)}: not the model these graphs were captured from")
        g = g.copy()
        g.weights = {w: named[w] for w in g.weights}
        out[entry] = g
    return out


def dynamic_line(graphs: dict[str, Graph]) -> str:
    """One line saying which input dims each entry takes as dynamic (what capture assumed)."""
    parts = []
    for entry, g in graphs.items():
        taken = g.meta.get("dynamic")
        if taken is None:  # a zoo entry: its token ids' type, as the graph declares it
            dims = ", ".join(f"{n} {g.types[n]}" for n in g.inputs[:1])
        else:
            dims = ", ".join(f"{n} [{form}]" for n, form in taken.items()) or "none"
        how = f" ({g.meta['dims_from']})" if g.meta.get("dims_from") else ""
        parts.append(f"{entry}: {dims}{how}")
    return "dynamic dims: " + "; ".join(parts)


class CompiledModel:
    """A compiled model: `model(input_ids) -> logits`, `prefill`, `decode` like the eager one.

    The state is the same flat dict of named tensors the eager model uses.
    """

    def __init__(self, runner, graphs: dict[str, Graph], out_dir: Path, backend: str,
                 timings: dict[str, float] | None = None):
        self.runner, self.graphs, self.out_dir, self.backend = runner, graphs, Path(out_dir), backend
        self.model_name = next(iter(graphs.values())).meta.get("model")
        self.timings = timings or {}

    def __call__(self, *inputs: torch.Tensor):
        if "prefill" in self.graphs:
            return self.prefill(*inputs)[0]
        outs = self.runner.run("forward", *inputs)
        return outs[0] if len(outs) == 1 else outs

    @property
    def max_context(self) -> int | None:
        """The capacity of the fixed caches (None: the artifact's caches grow)."""
        return self.graphs["prefill"].meta.get("max_context") if "prefill" in self.graphs else None

    def prefill(self, input_ids: torch.Tensor, lengths=None, logits: str = "all",
                chunk: int | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """As the eager model's prefill: `lengths` [B] for right-padded prompts (fixed caches),
        `logits="last"` the logits of each sequence's last real token, [B, 1, vocab];
        `chunk=N`: a prefill of N tokens and extends of N tokens each, the same result."""
        from .serving import last_logits, prefill_inputs

        if chunk is not None:
            from .models.extend import check_chunk, prefill_chunked

            if check_chunk(chunk) < input_ids.shape[-1]:
                prefill_inputs(self, input_ids, lengths, logits)  # the whole call's checks, first
                return prefill_chunked(lambda ids, n: self.prefill(ids, n), self.extend, input_ids, chunk,
                                       lengths, logits)

        entry, inputs = prefill_inputs(self, input_ids, lengths, logits)
        outs = self.runner.run(entry, *inputs)
        names = [k for k, _ in self.graphs[entry].outputs]
        out = outs[0] if logits == "all" or entry == "prefill_last" else last_logits(outs[0], lengths)
        return out, dict(zip(names[1:], outs[1:]))

    def extend(self, input_ids: torch.Tensor, state: dict[str, torch.Tensor], lengths=None,
               logits: str = "all") -> tuple[torch.Tensor, dict]:
        """As the eager model's extend (models/extend.py): T >= 1 more tokens onto `state`."""
        from .serving import extend_inputs, last_logits

        if "extend" not in self.graphs:
            raise UsageError(f"this {self.backend} artifact has no extend entry ({', '.join(self.graphs)}); "
                             f"compile it again")
        g = self.graphs["extend"]
        inputs, lengths = extend_inputs(self, input_ids, state, lengths, logits)
        outs = self.runner.run("extend", *inputs)
        names = [k for k, _ in g.outputs]
        out = outs[0] if logits == "all" else last_logits(outs[0], None if lengths is None else lengths.clamp(min=1))
        return out, dict(zip(names[1:], outs[1:]))

    def decode(self, input_ids: torch.Tensor, state: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        g = self.graphs["decode"]
        check_state_names(g.inputs[1:], state, self.model_name)
        from .serving import check_decode_positions

        check_decode_positions(self, state, input_ids.shape[0])
        outs = self.runner.run("decode", input_ids, *[state[n] for n in g.inputs[1:]])
        names = [k for k, _ in g.outputs]
        return outs[0], dict(zip(names[1:], outs[1:]))


def prepare(graphs: dict[str, Graph], be, passes: str | list[str] = "default",
            pass_options: dict | None = None, compute: str | None = None,
            state_dtype: str | None = None, memo: dict | None = None) -> dict[str, Graph]:
    """The graphs `be` lowers: the pass pipeline with the backend's choices in it (the
    recurrent ops it takes whole stay whole through chunk-delta-rule; a BF16 model computes
    in the backend's `compute_dtype`, from its stored weights), then every node the backend
    has no lowering for rewritten into its op's decomposition. An op that is neither
    lowered nor decomposable is an UnsupportedNodeError naming it and the model line.
    `compute` ("f32", "bf16"; None: the backend's own) is the compute policy of a model held
    in a lower precision (passes/compute_dtype.py); `state_dtype` ("f32", "bf16"; None: "f32")
    the dtype the recurrent states are held in between calls (passes/state_dtype.py).
    `memo`: a dict kept across calls on the same `graphs` (one per set of graphs): a pipeline
    whose steps another backend ran already is not run again, only legalized afresh."""
    from . import passes as passes_mod

    low = any(t.dtype in LOW for g in graphs.values() for v, t in g.types.items() if v not in g.weights)
    if compute is not None and compute not in POLICIES:
        raise UsageError(f"compute={compute!r}: the compute policies are {', '.join(POLICIES)}")
    if compute == "bf16" and not low:
        raise UsageError("compute='bf16' rounds the GEMM operands a model holds in BF16, and this model "
                         "holds none: build it in its release precision (dtype=torch.bfloat16, "
                         "k3c compile --dtype bf16) or load a release checkpoint")
    if state_dtype is not None and state_dtype not in STATE_DTYPES:
        raise UsageError(f"state_dtype={state_dtype!r}: the recurrent states can be held in {', '.join(STATE_DTYPES)}")
    compute = (compute or getattr(be, "compute_dtype", None)) if low else None
    steps = passes_mod.for_backend(passes_mod.steps_of(passes), **passes_mod.backend_choices(be), compute=compute,
                                   state_dtype=state_dtype)
    recorded = passes if steps == passes_mod.steps_of(passes) else steps  # what an artifact says it ran
    out = {}
    for entry, g in graphs.items():
        key = (entry, repr(steps), repr(sorted((pass_options or {}).items())))
        if memo is None or key not in memo:
            g = passes_mod.run(g, steps, **(pass_options or {}))
            if memo is not None:
                memo[key] = g
        g = memo[key].copy() if memo is not None else g  # legalize rewrites in place
        passes_mod.legalize(g, be.supports)
        backends.check_supported(be, g)
        g.meta.setdefault("pipeline", recorded)
        out[entry] = g
    return out


def _with_chunk_size(passes: str | list[str], chunk_size: object) -> list[str]:
    from . import passes as passes_mod

    steps = passes_mod.steps_of(passes)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise UsageError(f"chunk_size={chunk_size!r}: the chunk length of chunk-delta-rule must be a positive int")
    if not any(passes_mod.registry.parse_step(s)[0] == "chunk-delta-rule" for s in steps):
        raise UsageError(f"chunk_size={chunk_size}: the pipeline {passes!r} has no chunk-delta-rule pass to take it")
    return passes_mod.for_backend(steps, chunk_size=chunk_size)


def compile(model: torch.nn.Module, backend: str, example_inputs: tuple, out_dir: str | Path | None = None,
            passes: str | list[str] = "default", *, dynamic: bool = True, verbose: bool = False,
            pass_options: dict | None = None, force: bool = False, mesh: str | None = None,
            max_context: int | None = None, cache: str | None = None, dims: dict | None = None,
            dynamic_shapes=None, compute: str | None = None, state_dtype: str | None = None,
            **options) -> CompiledModel:
    """Compile `model` for `backend` ("reference", "onnx", "tvm", "triton").

    Writes the artifact to `out_dir` (a new temporary folder when None) and returns a
    callable backed by it. `options` configure the backend (onnx: flavour, providers,
    threads, target "cpu" or "cuda"; tvm: target). The artifact is built beside `out_dir` and
    moved into place when complete; a folder that holds anything but an artifact of this
    model for this backend is not replaced unless `force`. An op the backend cannot lower is
    an UnsupportedNodeError that names every such node, the backend and the model line.
    `pass_options` go to `k3c.passes.run` (verify_each, dump_after, report).

    A module's dynamic dims: `dims={"x": "N _"}` (named, every other dim static) or
    `dynamic_shapes=` as torch.export takes it; by default B and T of `[B, T, ...]` inputs
    (k3c.capture). The graph's meta["dynamic"] says what was taken.

    `mesh="tp=2,ep=2"` (",vocab" to split the vocabulary too) writes one artifact per rank and
    returns their folder (k3c.distributed.runner.compile_mesh); `combine=` ("auto",
    "all_reduce", "all_to_all") says how the routed experts' outputs are combined there.

    `compute` is the compute policy of a model held in BF16 (passes/compute_dtype.py): "f32"
    (the CPU backends' default: float32 from the stored weights) or "bf16" (GEMMs on BF16
    operands with float32 accumulation, the rest in float32). It is recorded in the
    artifact's manifest (`compute`). `state_dtype` ("f32", the default, or "bf16") is the dtype
    the recurrent states (KDA and delta-rule states, short-conv tails; not the attention caches)
    cross every entry's boundary in, updated in float32 inside (passes/state_dtype.py); recorded
    in the manifest (`state`).

    `max_context=N` gives the serving forms (k3c/serving.py): fixed-capacity caches of N rows
    written in place by decode, `positions` in the state, ragged prompts (`lengths`) and a
    `prefill_last` entry for last-token logits. `cache="grow"` keeps the growing caches.
    """
    from .serving import check_cache_mode, record_compute, record_serving, with_last_entry

    max_context = check_cache_mode(max_context, cache)
    if state_dtype is not None and state_dtype not in STATE_DTYPES:  # before the slow capture
        raise UsageError(f"state_dtype={state_dtype!r}: the recurrent states can be held in {', '.join(STATE_DTYPES)}")
    if not isinstance(example_inputs, tuple):
        example_inputs = (example_inputs,)
    if mesh is not None:  # one artifact per rank (k3c.distributed.runner); returns their folder
        from .distributed.runner import compile_mesh

        if max_context is not None:
            raise UsageError("mesh= with max_context=: the per-rank artifacts have growing caches only")
        if state_dtype not in (None, "f32"):
            raise UsageError("mesh= with state_dtype=: the per-rank artifacts hold their states in float32")

        return compile_mesh(model, backend, example_inputs, mesh, out_dir, passes, force=force, **options)
    if "chunk_size" in options:  # not the backend's: the chunk length of the chunk-delta-rule pass
        passes = _with_chunk_size(passes, options.pop("chunk_size"))
    be = backends.get(backend, **{**options.pop("backend_options", {}), **options})
    if out_dir is not None:  # before the slow part: a target that may not be replaced fails now
        artifact.check_target(out_dir, backend=be.name, model=getattr(model, "name", type(model).__name__),
                              variant=artifact.variant_of(be), force=force)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    graphs = capture_entries(model, example_inputs, dynamic, max_context=max_context, dims=dims,
                             dynamic_shapes=dynamic_shapes)
    if max_context is not None:
        graphs = with_last_entry(graphs)
    timings["capture"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    graphs = prepare(graphs, be, passes, pass_options, compute, state_dtype)
    timings["passes"] = time.perf_counter() - t0
    for g in graphs.values():  # what the artifact came from, for backends that record it (onnx)
        if dataclasses.is_dataclass(getattr(model, "config", None)):
            g.meta.setdefault("config", dataclasses.asdict(model.config))
    out = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix=f"k3c-{backend}-"))
    try:
        t0 = time.perf_counter()
        artifact.write(be, graphs, out, force=force)
        timings["lower"] = time.perf_counter() - t0
        record_serving(out, graphs)
        record_compute(out, graphs)
        t0 = time.perf_counter()
        runner = be.load(out)
        timings["load"] = time.perf_counter() - t0
    except BaseException:  # a failure or an interrupt (Ctrl-C, SIGTERM) leaves no temporary folder of ours
        if out_dir is None:
            shutil.rmtree(out, ignore_errors=True)
        raise
    if verbose:
        print(dynamic_line(graphs))
        print(f"compiled {getattr(model, 'name', type(model).__name__)} for {backend} into {out}: "
              + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()))
    return CompiledModel(runner, graphs, out, backend, timings)
